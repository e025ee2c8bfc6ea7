"""GpuSpec: what the planner needs to know about one GPU."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    key: str                   # canonical catalog key, e.g. "h100-sxm-80gb"
    name: str                  # device name as torch/NVML report it, e.g. "NVIDIA H100 80GB HBM3"
    total_memory_bytes: int    # TOTAL as cudaMemGetInfo / torch.cuda.mem_get_info report it, not the datasheet size
    compute_capability: tuple[int, int]
    supports_bf16: bool        # cc >= 8.0
    supports_fp8: bool         # hardware FP8 (cc >= 8.9); vLLM's fp8 KV cache also runs on older GPUs (no FP8 math)
    memory_bandwidth_bytes_per_s: float
    bf16_dense_flops: float    # peak dense bf16 (fp16 where there is no bf16) FLOP/s, no sparsity
    pcie_bandwidth_bytes_per_s: float   # usable host link per direction, for offload estimates
    interconnect: str          # GPU-to-GPU: "nvlink" / "pcie" ("xgmi" for AMD Infinity Fabric)
    source_url: str            # where the datasheet figures come from
    # Extras (defaults keep the 11 fields above the planner's contract):
    vendor: str = "nvidia"     # "nvidia" / "amd"
    total_memory_source_url: str = ""   # the log the total was read from; "" when derived (see total_memory_note)
    total_memory_note: str = ""
    multiprocessors: int = 0   # SMs (CUs on AMD): vLLM's Triton sampler keeps a buffer per SM; 0 when unknown
    unified_memory: bool = False   # CPU and GPU share it (GB10): the OS's use counts as used GPU memory
    free_at_start_low_bytes: int = 0   # unified memory: the least free memory at vLLM's start seen in real logs
    gfx_arch: str = ""         # AMD: the LLVM target ROCm builds for, as rocm-smi's "GFX Version" prints it ("gfx942")
    arm_host: bool = False     # only sold with an Arm (Grace) host CPU: needs aarch64 builds (GH200, GB10)
    nvlink_multicast: bool = False   # sold on NVSwitch baseboards (HGX/DGX Hopper and Blackwell): CUDA multicast
                                     # objects work between its GPUs (NVLink SHARP); NVLink-bridged pairs have none
