"""Which vLLM platform class runs a GPU, and the facts of it that move memory (vllm/platforms/cuda.py, rocm.py).

vLLM picks CudaPlatform or RocmPlatform by the torch build; what differs for memory at startup is read from
RocmPlatform and from the ROCm branches of the quantization methods (weights.py uses them, keyed by this object);
what differs per release is in releases.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.gpus.spec import GpuSpec


@dataclass(frozen=True)
class Platform:
    name: str = "cuda"          # "cuda" or "rocm"
    gfx_arch: str = ""          # ROCm: the LLVM target (gcnArchName), "gfx1201"

    @property
    def rocm(self) -> bool:
        return self.name == "rocm"

    @property
    def fp8_fnuz(self) -> bool:
        """platforms/rocm.py is_fp8_fnuz: "gfx94" in gcnArchName. FP8 checkpoints are converted to e4m3fnuz with
        doubled scales (w8a8_utils.normalize_e4m3fn_to_e4m3fnuz): the same bytes, noted only."""
        return self.rocm and self.gfx_arch.startswith("gfx94")

    @property
    def mxfp4_pad_align(self) -> int:
        """quantization/utils/mxfp4_utils.py get_padding_alignment: 256 on gfx950, else 128."""
        return 256 if self.gfx_arch == "gfx950" else 128


CUDA = Platform()


def platform_of(gpu: GpuSpec) -> Platform:
    """vllm/platforms/__init__.py: ROCm for an AMD GPU (a ROCm build of torch), CUDA otherwise."""
    return Platform("rocm", gpu.gfx_arch) if gpu.vendor == "amd" else CUDA
