import sys
import types
from pathlib import Path

import pytest

from oomguard.errors import UsageError
from oomguard.gpus import nvml
from oomguard.gpus.catalog import catalog_entries, custom_gpu, find_gpu, list_gpus, resolve_gpu
from oomguard.units import GiB


@pytest.mark.parametrize("text,key", [
    ("h100", "h100-sxm-80gb"), ("h100-sxm", "h100-sxm-80gb"), ("H100 80GB", "h100-sxm-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"), ("h100-pcie", "h100-pcie-80gb"), ("h100 nvl", "h100-nvl-94gb"),
    ("h200", "h200-141gb"), ("gh200", "gh200-96gb"), ("b200", "b200-180gb"),
    ("a100", "a100-sxm-80gb"), ("A100-40GB", "a100-sxm-40gb"), ("a100-80gb", "a100-sxm-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"), ("NVIDIA A100 40GB", "a100-sxm-40gb"),
    ("rtx4090", "rtx-4090-24gb"), ("4090", "rtx-4090-24gb"), ("RTX 4090", "rtx-4090-24gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090-24gb"), ("  nvidia  geforce rtx-4090 ", "rtx-4090-24gb"),
    ("l4", "l4-24gb"), ("L40S", "l40s-48gb"), ("l40", "l40-48gb"), ("t4", "t4-16gb"), ("Tesla T4", "t4-16gb"),
    ("a10g", "a10g-24gb"), ("a10", "a10-24gb"), ("v100", "v100-16gb"), ("v100-32gb", "v100-32gb"),
    ("3090", "rtx-3090-24gb"), ("3090 Ti", "rtx-3090-ti-24gb"), ("a6000", "rtx-a6000-48gb"),
    ("RTX 6000 Ada", "rtx-6000-ada-48gb"), ("a40", "a40-48gb"), ("5090", "rtx-5090-32gb"),
    ("4060 Ti", "rtx-4060-ti-16gb"), ("rtx 3060", "rtx-3060-12gb"), ("mi300x", "mi300x-192gb"),
    ("AMD Instinct MI300X", "mi300x-192gb"),
])
def test_aliases_resolve(text, key):
    assert resolve_gpu(text).key == key


def test_every_key_and_name_resolves_to_itself():
    for g in list_gpus():
        assert resolve_gpu(g.key) == g
        assert resolve_gpu(g.name) == g


def test_unknown_gpu_says_what_to_do():
    with pytest.raises(UsageError) as err:
        resolve_gpu("h1000")
    msg = str(err.value)
    assert msg.startswith("unknown GPU 'h1000': did you mean ")
    assert "h100" in msg
    assert "--gpu-memory GIB" in msg and "oomguard plan --list-gpus" in msg
    with pytest.raises(UsageError, match="unknown GPU 'quantum-9000'"):
        resolve_gpu("quantum-9000")


def test_custom_gpu():
    g = custom_gpu(23.6)
    assert g.total_memory_bytes == round(23.6 * GiB)
    assert g.name == "custom" and g.supports_bf16 and not g.supports_fp8
    assert g.memory_bandwidth_bytes_per_s > 0 and g.bf16_dense_flops > 0 and g.pcie_bandwidth_bytes_per_s > 0
    assert custom_gpu(40, name="my card").name == "my card"
    for bad in (0, -1, 5000, float("nan"), float("inf"), "24", True):
        with pytest.raises(UsageError):
            custom_gpu(bad)


def test_catalog_has_the_gpus_the_brief_names():
    keys = {g.key for g in list_gpus()}
    assert len(keys) >= 29
    for wanted in ("h100-sxm-80gb", "h100-pcie-80gb", "h100-nvl-94gb", "h200-141gb", "gh200-96gb", "b200-180gb",
                   "a100-sxm-40gb", "a100-sxm-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "a10-24gb", "a10g-24gb",
                   "l4-24gb", "l40-48gb", "l40s-48gb", "t4-16gb", "v100-16gb", "v100-32gb", "rtx-a6000-48gb",
                   "rtx-6000-ada-48gb", "a40-48gb", "rtx-3090-24gb", "rtx-3090-ti-24gb", "rtx-4090-24gb",
                   "rtx-4080-16gb", "rtx-5090-32gb", "rtx-4060-ti-16gb", "rtx-3060-12gb", "mi300x-192gb"):
        assert wanted in keys


def test_catalog_sanity():
    specs = {g.key: g for g in list_gpus()}
    for e in catalog_entries():
        g = specs[e["key"]]
        board = e["board_memory_gib"] * GiB
        # CUDA's total is below the board size, by a plausible reservation
        assert 0.88 * board < g.total_memory_bytes < board, e["key"]
        # Pascal (GTX 1080) has no tensor cores: its entry states the fp32 peak, under 10 TFLOPS
        assert g.memory_bandwidth_bytes_per_s > 1e11 and g.bf16_dense_flops > 5e12, e["key"]
        assert g.pcie_bandwidth_bytes_per_s > 1e9 and g.interconnect in ("nvlink", "pcie", "xgmi"), e["key"]
        assert g.source_url.startswith("https://"), e["key"]
        assert g.supports_bf16 == (g.compute_capability >= (8, 0))
        # every total is either read from a log (with its URL) or derived (and says how)
        assert e["total_memory_source_url"].startswith("https://") or e["total_memory_note"].startswith("derived"), \
            e["key"]
    assert specs["mi300x-192gb"].vendor == "amd" and specs["mi300x-192gb"].supports_fp8
    assert not specs["a100-sxm-80gb"].supports_fp8 and specs["l4-24gb"].supports_fp8
    assert not specs["t4-16gb"].supports_bf16


def test_totals_match_the_logs():
    assert round(resolve_gpu("h100").total_memory_bytes / GiB, 2) == 79.19
    assert round(resolve_gpu("a100-40gb").total_memory_bytes / GiB, 2) == 39.38
    assert round(resolve_gpu("4090").total_memory_bytes / GiB, 2) == 23.65
    assert round(resolve_gpu("h200").total_memory_bytes / GiB, 2) == 139.72
    # vLLM's batch defaults test "a100" in the device name
    assert "a100" in resolve_gpu("a100").name.lower()


def test_find_gpu_matches_device_names_and_checks_memory():
    assert find_gpu("NVIDIA H100 80GB HBM3").key == "h100-sxm-80gb"
    assert find_gpu("NVIDIA H100 80GB HBM3", 81559 * 2**20).key == "h100-sxm-80gb"  # NVML's total
    assert find_gpu("NVIDIA GeForce RTX 4060 Ti", 8188 * 2**20) is None  # the 8 GB card
    assert find_gpu("NVIDIA Hypothetical X1") is None


def test_nvml_absent_returns_empty(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert nvml.detect_gpus() == []


def test_nvml_without_driver_returns_empty(monkeypatch):
    fake = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("NVML Shared Library Not Found")))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml.detect_gpus() == []


def test_nvml_reports_devices(monkeypatch):
    mem = types.SimpleNamespace(total=81559 * 2**20, free=80000 * 2**20, used=1559 * 2**20)
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3" if h == 0 else "NVIDIA Hypothetical X1",
        nvmlDeviceGetMemoryInfo=lambda h: mem)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    found = nvml.detect_gpus()
    assert [(d.index, d.name) for d in found] == [(0, "NVIDIA H100 80GB HBM3"), (1, "NVIDIA Hypothetical X1")]
    assert found[0].spec.key == "h100-sxm-80gb" and found[1].spec is None
    assert found[0].total_bytes == mem.total and found[0].free_bytes == mem.free
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [d.index for d in nvml.detect_gpus()] == [1]


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has an NVIDIA GPU")
def test_nvml_on_this_machine_finds_nothing():
    assert nvml.detect_gpus() == []


def test_new_catalog_gpus_resolve_by_the_names_their_drivers_print():
    # totals as CUDA reports them, read from logs (catalog.json total_memory_source_url)
    assert resolve_gpu("NVIDIA RTX PRO 6000 Blackwell Workstation Edition").total_memory_bytes == int(round(94.97 * GiB))
    assert resolve_gpu("AMD Instinct MI325X").vendor == "amd"
    gb10 = resolve_gpu("NVIDIA GB10")
    assert gb10.unified_memory and gb10.compute_capability == (12, 1)


def test_a_unified_memory_gpu_says_how_vllm_sees_its_memory():
    from oomguard.engines.vllm.memory import EngineConfig, predict
    from oomguard.models.load import from_catalog
    report = predict(from_catalog("meta-llama/Llama-3.1-8B-Instruct"), resolve_gpu("gb10"),
                     EngineConfig(max_model_len=8192), (0, 19, 0))
    assert any("shares" in a and "--free-memory" in a for a in report.assumptions)


def test_unified_memory_default_utilization_is_at_risk_of_the_free_memory_check():
    from oomguard.engines.vllm.memory import EngineConfig, predict
    from oomguard.models.load import from_catalog
    model, gb10 = from_catalog("meta-llama/Llama-3.1-8B-Instruct"), resolve_gpu("gb10")
    default = predict(model, gb10, EngineConfig(max_model_len=8192), (0, 20, 0))          # 0.92 of 121.69 GiB
    assert default.verdict == "at_risk" and "free-memory check" in default.risks[0]
    assert predict(model, gb10, EngineConfig(max_model_len=8192, gpu_memory_utilization=0.8),
                   (0, 20, 0)).verdict == "starts"
    given = predict(model, gb10, EngineConfig(max_model_len=8192, gpu_memory_utilization=0.8), (0, 20, 0),
                    free_memory_bytes=int(104 * GiB))
    assert given.verdict == "starts" and not given.risks


# --- names as the vendor tools print them; which vLLM releases run each GPU (docs/research/vllm-gpu-support.md) ---

@pytest.mark.parametrize("printed,key", [
    # nvidia-smi --query-gpu=name / NVML
    ("NVIDIA GeForce RTX 4090", "rtx-4090-24gb"), ("Tesla T4", "t4-16gb"), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"), ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000-blackwell-96gb"),
    # a line of nvidia-smi -L; a name cut short by nvidia-smi's table
    ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c3e1f2a-0b1c-4d5e-8f90-123456789abc)", "h100-sxm-80gb"),
    ("NVIDIA RTX 6000 Ada Gene...", "rtx-6000-ada-48gb"),
    ("NVIDIA RTX PRO 4500 Blac...", "rtx-pro-4500-blackwell-32gb"),
    # rocm-smi --showproductname "Card Series" (amdsmi's market name, " VF" in a VM; pci.ids names on older ROCm),
    # the card series without the vendor, and vLLM's own ROCm device names
    ("AMD Instinct MI300X", "mi300x-192gb"), ("Instinct MI300X", "mi300x-192gb"),
    ("AMD Instinct MI300X VF", "mi300x-192gb"), ("GPU[0]\t\t: Card Series: \t\tAMD Instinct MI300X VF", "mi300x-192gb"),
    ("AMD Radeon RX 7900 XTX", "rx-7900-xtx-24gb"),
    ("Aldebaran/MI200 [Instinct MI210]", "mi210-64gb"), ("AMD_Instinct_MI325X", "mi325x-256gb"),
    ("AMD_Radeon_RX7900XTX", "rx-7900-xtx-24gb"),
    # an architecture one catalog GPU has, as rocm-smi's "GFX Version" or torch's gcnArchName give it
    ("gfx950", "mi355x-288gb"), ("GFX Version: gfx950", "mi355x-288gb"),
])
def test_names_as_nvidia_smi_and_rocm_smi_print_them(printed, key):
    assert resolve_gpu(printed).key == key


def test_every_amd_gpu_has_its_architecture_and_ambiguous_names_say_so():
    for g in list_gpus():
        assert bool(g.gfx_arch) == (g.vendor == "amd"), g.key
        assert resolve_gpu(f"GPU 3: {g.name} (UUID: GPU-0)") == g
    with pytest.raises(UsageError, match="gfx942 names several catalog GPUs: mi300x-192gb, mi325x-256gb"):
        resolve_gpu("gfx942")
    with pytest.raises(UsageError, match="rtx-pro-6000-blackwell-96gb, rtx-pro-6000-server-96gb; nvidia-smi"):
        resolve_gpu("NVIDIA RTX PRO 6000 Blac...")
    with pytest.raises(UsageError) as err:   # the plain RTX 4070's name is short enough to be printed whole
        resolve_gpu("NVIDIA GeForce RTX 4070 ...")
    assert "rtx-4070-ti-12gb, rtx-4070-ti-super-16gb;" in str(err.value) and "rtx-4070-12gb" not in str(err.value)


def _plan(gpu, version, model="meta-llama/Llama-3.2-1B-Instruct", **flags):
    from oomguard.engines.vllm.memory import EngineConfig, predict
    from oomguard.models.load import from_catalog
    return predict(from_catalog(model), resolve_gpu(gpu), EngineConfig(max_model_len=4096, **flags), version)


def test_the_pypi_wheels_kernels_decide_which_nvidia_gpus_a_release_runs_on():
    from oomguard.engines.vllm.releases import release
    # Volta: every CUDA 12 wheel up to 0.19.x has sm_70; the CUDA 13 wheels from 0.20 start at sm_75
    assert _plan("v100", (0, 19, 1)).starts
    v100 = _plan("Tesla V100-SXM2-16GB", (0, 20, 0))
    assert v100.verdict == "fails" and v100.error_class == "dtype_capability"
    assert v100.error.startswith("CUDA error: no kernel image is available for execution on the device")
    assert "CUDA 13.0" in v100.error and "--vllm-version 0.19.x or earlier" in v100.error
    assert _plan("t4", (0, 33, 0)).starts and _plan("2080ti", (0, 33, 0)).starts      # Turing keeps sm_75
    # Pascal: no wheel of any release has its kernels, whatever the dtype
    for version in ((0, 6, 6), (0, 10, 0), (0, 33, 0)):
        p40 = _plan("p40", version, dtype="half")
        assert p40.verdict == "fails" and "No vLLM release's wheels do" in p40.error
    # Blackwell: sm_100 from 0.9.0 (CUDA 12.8), sm_120 from 0.9.2; B300 (10.3) and GB10 (12.1) run those cubins
    assert "vLLM 0.9.0 and newer run it" in _plan("b200", (0, 8, 5)).error and _plan("b200", (0, 9, 0)).starts
    assert "--vllm-version 0.9.2 or later" in _plan("5090", (0, 9, 1)).error and _plan("5090", (0, 9, 2)).starts
    assert _plan("b300", (0, 9, 0)).starts and _plan("gb10", (0, 9, 2)).error is None
    assert release((0, 8, 5)).cuda_toolkit == "12" and release((0, 12, 0)).cuda_toolkit == "12.9"
    # AMD GPUs run vLLM's ROCm build: never refused on CUDA's kernels
    assert _plan("mi300x", (0, 33, 0)).starts and _plan("7900xtx", (0, 6, 6)).starts


def test_what_vllm_only_warns_about_or_falls_back_from_is_said_not_refused():
    # 0.8.0-0.10.1: V1 needs compute capability 8.0, so a T4 runs V0 (a warning, not a refusal)
    t4 = _plan("t4", (0, 9, 2))
    assert t4.engine == "v0" and t4.starts and any("falls back from V1 to V0" in a for a in t4.assumptions)
    assert _plan("t4", (0, 10, 2)).engine == "v1" and _plan("a10", (0, 9, 2)).engine == "v1"
    # from 0.9 dtype auto serves a bfloat16 checkpoint in float16 below 8.0; 0.8 refuses it
    assert _plan("t4", (0, 19, 0)).config["dtype"] == "float16"
    assert _plan("t4", (0, 8, 5)).error_class == "dtype_capability"
    # FP8 weights: vLLM refuses them below its minimum (8.0 up to 0.13, 7.5 from 0.14: Marlin weight-only)
    fp8 = _plan("t4", (0, 13, 0), quantization="fp8")
    assert fp8.verdict == "fails" and "Minimum capability: 80. Current capability: 75." in fp8.error
    assert _plan("t4", (0, 14, 0), quantization="fp8").starts and _plan("a100", (0, 13, 0), quantization="fp8").starts
    # ROCm: an architecture the release's install docs do not list is a warning (MI355X's gfx950 from 0.11)
    assert any("do not list gfx950" in w for w in _plan("mi355x", (0, 10, 0)).warnings)
    assert not any("gfx950" in w for w in _plan("mi355x", (0, 11, 0)).warnings)
    # Grace hosts: PyPI's aarch64 wheels start at 0.10.2
    assert any("no aarch64 vLLM wheel" in a for a in _plan("gh200", (0, 10, 1)).assumptions)
    assert not any("aarch64" in a for a in _plan("gh200", (0, 10, 2)).assumptions)


# --- GPUs real startup logs named that the catalog lacked, and NVIDIA vGPU profile names ---

@pytest.mark.parametrize("printed,key", [
    # rocm-smi --showproductname / amdsmi's market name, pci.ids' name, vLLM's own ROCm device name
    ("AMD Radeon AI PRO R9700", "radeon-ai-pro-r9700-32gb"),
    ("GPU[0]\t\t: Card Series: \t\tAMD Radeon AI PRO R9700", "radeon-ai-pro-r9700-32gb"),
    ("Navi 48 [Radeon AI PRO R9700]", "radeon-ai-pro-r9700-32gb"), ("AMD_Radeon_R9700", "radeon-ai-pro-r9700-32gb"),
    ("AMD Radeon RX 9070 XT", "rx-9070-xt-16gb"), ("AMD_Radeon_RX9070XT", "rx-9070-xt-16gb"),
    # nvidia-smi --query-gpu=name, and the table's cut
    ("NVIDIA RTX 5000 Ada Generation", "rtx-5000-ada-32gb"), ("NVIDIA RTX 5000 Ada Gene...", "rtx-5000-ada-32gb"),
    ("NVIDIA RTX 4000 Ada Generation", "rtx-4000-ada-20gb"), ("NVIDIA RTX 2000 Ada Generation", "rtx-2000-ada-16gb"),
    ("NVIDIA RTX PRO 5000 Blackwell", "rtx-pro-5000-blackwell-48gb"),
    ("NVIDIA RTX PRO 5000 Blac...", "rtx-pro-5000-blackwell-48gb"),
    ("NVIDIA GeForce RTX 5070 Ti", "rtx-5070-ti-16gb"), ("NVIDIA GeForce RTX 5070 ...", "rtx-5070-ti-16gb"),
    ("NVIDIA GeForce RTX 5070", "rtx-5070-12gb"), ("NVIDIA GeForce RTX 5060 Ti", "rtx-5060-ti-16gb"),
    ("5060 ti", "rtx-5060-ti-16gb"), ("r9700", "radeon-ai-pro-r9700-32gb"), ("9070 xt", "rx-9070-xt-16gb"),
])
def test_new_gpus_resolve_as_their_tools_print_them(printed, key):
    assert resolve_gpu(printed).key == key


def test_new_gpus_totals_and_architectures():
    def gib(name):
        return round(resolve_gpu(name).total_memory_bytes / GiB, 2)
    assert gib("AMD Radeon AI PRO R9700") == 31.86        # vLLM 0.13 HIP OOM: 'total capacity of 31.86 GiB'
    assert gib("AMD Radeon RX 9070 XT") == 15.92          # PyTorch HIP OOM; rocminfo's 16695296 KB pool
    assert gib("NVIDIA GeForce RTX 5060 Ti") == 15.47     # vLLM OOM 'total capacity of 15.47 GiB'
    r9700 = resolve_gpu("r9700")
    assert r9700.vendor == "amd" and r9700.gfx_arch == "gfx1201" and r9700.compute_capability == (12, 0)
    assert r9700.supports_bf16 and r9700.supports_fp8 and r9700.multiprocessors == 64
    assert resolve_gpu("NVIDIA RTX 5000 Ada Generation").compute_capability == (8, 9)
    assert resolve_gpu("NVIDIA RTX PRO 5000 Blackwell").compute_capability == (12, 0)
    with pytest.raises(UsageError, match="gfx1201 names several catalog GPUs: radeon-ai-pro-r9700-32gb, rx-9070-xt"):
        resolve_gpu("gfx1201")
    # NVML's total tells the 16 GB RTX 5060 Ti from the 8 GB one of the same name
    assert find_gpu("NVIDIA GeForce RTX 5060 Ti", 16303 * 2**20).key == "rtx-5060-ti-16gb"
    assert find_gpu("NVIDIA GeForce RTX 5060 Ti", 8151 * 2**20) is None


@pytest.mark.parametrize("profile,board,framebuffer", [
    ("NVIDIA RTX Pro 6000 Blackwell DC-4-96Q", "rtx-pro-6000-server-96gb", 96),  # MIG-backed, 96 GiB
    ("GRID A100-40C", "a100-sxm-80gb", 40), ("NVIDIA A100-80C", "a100-sxm-80gb", 80),
    ("GRID A100DX-3-40C", "a100-sxm-80gb", 40), ("GRID A100-1-5CME", "a100-sxm-80gb", 5),
    ("NVIDIA L40S-48Q", "l40s-48gb", 48), ("NVIDIA L40S-12Q", "l40s-48gb", 12), ("NVIDIA A10-24Q", "a10-24gb", 24),
    ("NVIDIA H100XM-80C", "h100-sxm-80gb", 80), ("NVIDIA-H100XM-80C", "h100-sxm-80gb", 80),
    ("NVIDIA H100L-94C", "h100-nvl-94gb", 94), ("NVIDIA H200X-141C", "h200-141gb", 141),
    ("GRID V100DX-32Q", "v100-32gb", 32), ("NVIDIA RTX6000-Ada-8Q", "rtx-6000-ada-48gb", 8),
    ("RTX5000-Ada-4Q", "rtx-5000-ada-32gb", 4), ("GRID T4-16Q", "t4-16gb", 16),
    ("NVIDIA RTX Pro 6000 Blackwell DC-1-24CGFX", "rtx-pro-6000-server-96gb", 24),
    ("GRID A100-1-10CNOME", "a100-sxm-80gb", 10),
])
def test_a_vgpu_profile_is_its_board_with_the_profiles_framebuffer(profile, board, framebuffer):
    from oomguard.gpus.catalog import VGPU_GUEST_RESERVED_GIB
    g = resolve_gpu(profile)
    base = resolve_gpu(board)
    assert g.key.startswith(board + "/") and g.name == profile
    assert g.total_memory_bytes == int(round((framebuffer - VGPU_GUEST_RESERVED_GIB) * GiB))
    assert g.memory_bandwidth_bytes_per_s == base.memory_bandwidth_bytes_per_s
    assert g.compute_capability == base.compute_capability and g.vendor == "nvidia"
    assert g.total_memory_note.startswith("NVIDIA vGPU profile")
    assert f"{framebuffer} GiB framebuffer" in g.total_memory_note
    assert resolve_gpu(f"GPU 0: {profile} (UUID: GPU-0)") == g      # as nvidia-smi -L prints it


def test_the_vgpu_rule_matches_the_logs_and_stays_a_rule():
    # 12 vLLM 0.13 logs on an Azure DC-4-96Q profile imply 94.8-96.1 GiB (median 95.66): more than the bare 94.97
    dc = resolve_gpu("NVIDIA RTX Pro 6000 Blackwell DC-4-96Q")
    assert round(dc.total_memory_bytes / GiB, 2) == 95.66
    assert "MIG-backed, 4 GPU instances" in dc.total_memory_note
    assert find_gpu("NVIDIA RTX Pro 6000 Blackwell DC-4-96Q", 98304 * 2**20) == dc     # NVML's total in the guest
    for not_a_profile in ("NVIDIA L4-48Q",          # a profile larger than the board it names
                          "NVIDIA RTX 6000 4-96Q",  # no "-" between board and profile
                          "AMD Radeon RX 7900 XTX-24Q",  # AMD has no such profiles
                          "NVIDIA Hypothetical-24Q"):
        with pytest.raises(UsageError, match="unknown GPU"):
            resolve_gpu(not_a_profile)
    # ordinary names with dashes are not profiles
    assert resolve_gpu("NVIDIA A100-SXM4-40GB").key == "a100-sxm-40gb"
    assert resolve_gpu("NVIDIA H20-3e").key == "h20-3e-141gb"


def test_rdna4_runs_the_rocm_builds_that_list_gfx12():
    assert any("do not list gfx1201" in w for w in _plan("r9700", (0, 8, 5)).warnings)
    assert not any("gfx1201" in w for w in _plan("AMD Radeon AI PRO R9700", (0, 9, 0)).warnings)
    assert _plan("9070xt", (0, 13, 0)).starts
