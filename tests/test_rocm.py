"""ROCm's memory at vLLM startup: the layouts vLLM's ROCm branches choose, pinned against their arithmetic worked by
hand from the source (not from startup logs), and the fitted ROCm figures kept off NVIDIA plans."""

from dataclasses import replace

from oomguard.engines.vllm import profile
from oomguard.engines.vllm.memory import EngineConfig, predict
from oomguard.engines.vllm.platform import CUDA, Platform, platform_of
from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.weights import Parallel, layer_bytes, mxfp4_backend, mxfp4_expert_bytes, stage_weight_bytes
from oomguard.gpus.catalog import resolve_gpu
from oomguard.models.load import from_catalog
from oomguard.models.spec import QuantSpec
from oomguard.units import GiB

R9700 = resolve_gpu("AMD Radeon AI PRO R9700")
ROCM = platform_of(R9700)
V13 = (0, 13, 0)
LLAMA = from_catalog("meta-llama/Llama-3.1-8B-Instruct")
QWEN3_MOE = from_catalog("Qwen/Qwen3-30B-A3B")


def test_platform_follows_the_vendor():
    assert ROCM == Platform("rocm", "gfx1201") and ROCM.rocm and not ROCM.fp8_fnuz
    assert platform_of(resolve_gpu("NVIDIA H100 80GB HBM3")) == CUDA
    assert platform_of(resolve_gpu("AMD Instinct MI300X")).fp8_fnuz              # gfx942: e4m3fnuz
    assert ROCM.mxfp4_pad_align == 128 and platform_of(resolve_gpu("AMD Instinct MI355X")).mxfp4_pad_align == 256


def test_mxfp4_on_rocm_is_triton_padded_to_128_with_fp32_biases():
    # mxfp4.py get_mxfp4_backend ROCm branch (0.10.2+); create_weights rounds 2880 up to 2944 (get_padding_alignment
    # 128); StridedLayout keeps the values and scales as loaded; biases .to(torch.float32)
    assert mxfp4_backend((12, 0), V13, ROCM) == "triton_rocm"
    assert mxfp4_backend((12, 0), (0, 10, 1), ROCM) is None
    values = 32 * (2 * 2944 * 2944 // 2 + 2944 * 2944 // 2)          # uint8 pairs of e2m1
    scales = 32 * (2 * 2944 * 2944 // 32 + 2944 * 2944 // 32)        # one e8m0 per 32
    biases = 32 * (2 * 2944 + 2944) * 4
    assert values + scales + biases == 443_154_432
    assert mxfp4_expert_bytes("triton_rocm", 32, 2880, 2880) == 443_154_432
    # gfx950: 256 (2880 -> 3072)
    assert mxfp4_expert_bytes("triton_rocm", 32, 2880, 2880, rocm_align=256) == \
        32 * 3 * 3072 * 3072 // 2 + 32 * 3 * 3072 * 3072 // 32 + 32 * 3 * 3072 * 4


def test_per_tensor_fp8_rows_are_padded_on_rocm_not_channel_wise_ones():
    # fp8_utils.py _maybe_pad_fp8_weight: a [N, K] fp8 weight with K % 512 == 0 keeps 256 more bytes a row.
    # Llama-3.1-8B: qkv [6144, 4096], o [4096, 4096], gate_up [28672, 4096], down [4096, 14336]: all padded
    def extra(strategy, tp=1):
        model = replace(LLAMA, quant=QuantSpec("fp8", 8, scale_bytes=4, fp8_strategy=strategy))
        par = Parallel(tp=tp)
        return layer_bytes(model, 0, par, 2, version=V13, platform=ROCM) - layer_bytes(model, 0, par, 2, version=V13)

    assert extra("tensor") == (6144 + 4096 + 28672 + 4096) * 256 == 11_010_048
    assert extra("block") == 11_010_048
    # TP 2: qkv [3072, 4096], o [4096, 2048], gate_up [14336, 4096], down [4096, 7168]; 2048 and 7168 divide by 512
    assert extra("tensor", tp=2) == (3072 + 4096 + 14336 + 4096) * 256
    assert extra("channel") == 0 and extra("online") == 0         # process_fp8_weight_channel_strategy: no pad


def test_unquantized_moe_rows_are_padded_on_rocm():
    # unquantized_fused_moe_method.py _maybe_pad_weight: w13 [128, 1536, 2048] rows of 4096 bytes and w2
    # [128, 2048, 768] rows of 1536 bytes (both multiples of 512) keep 256 more bytes a row
    rocm = layer_bytes(QWEN3_MOE, 0, Parallel(), 2, version=V13, platform=ROCM)
    assert rocm - layer_bytes(QWEN3_MOE, 0, Parallel(), 2, version=V13) == 128 * (1536 + 2048) * 256


def test_int4_compressed_tensors_moe_keeps_its_g_idx_on_rocm():
    # compressed_tensors_moe.py: ROCm takes CompressedTensorsWNA16MoEMethod, which keeps w13/w2 g_idx and sort indices
    # ([E, H] and [E, I] int32, twice) and the two [E, 2] weight_shape tensors (model dtype); Marlin frees its g_idx
    model = replace(QWEN3_MOE, quant=QuantSpec("compressed-tensors", 4, group_size=128))
    per_layer = 128 * (2 * (2048 + 768) * 4 + 2 * 2 * 2)
    assert layer_bytes(model, 0, Parallel(), 2, version=V13, platform=ROCM) - \
        layer_bytes(model, 0, Parallel(), 2, version=V13) == per_layer == 2_884_608
    # TP 2: the experts' width halves
    assert layer_bytes(model, 0, Parallel(tp=2), 2, version=V13, platform=ROCM) - \
        layer_bytes(model, 0, Parallel(tp=2), 2, version=V13) == 128 * (2 * (2048 + 384) * 4 + 8)
    # before 0.11.1 get_moe_method had no ROCm branch; 0.20 moved the choice (not read)
    assert not release((0, 11, 0)).rocm_wna16_moe_keeps_g_idx and not release((0, 20, 0)).rocm_wna16_moe_keeps_g_idx
    gptq = replace(QWEN3_MOE, quant=QuantSpec("gptq", 4, group_size=128))   # MoeWNA16Method: no g_idx
    assert layer_bytes(gptq, 0, Parallel(), 2, version=V13, platform=ROCM) == layer_bytes(gptq, 0, Parallel(), 2,
                                                                                            version=V13)


def test_rocm_counts_the_load_device_wide_until_0_21():
    # platforms/rocm.py get_current_memory_usage: mem_get_info's total - free up to 0.20, torch-allocated from 0.21
    assert release(V13).rocm_weights_device_wide and not release((0, 21, 0)).rocm_weights_device_wide
    cfg = EngineConfig(gpu_memory_utilization=0.9, max_model_len=8192)
    exact = stage_weight_bytes(LLAMA, Parallel(), 0, 2, R9700.compute_capability, V13, 8192, 256, ROCM)
    w13 = predict(LLAMA, R9700, cfg, V13).first.weights_bytes
    assert w13 - exact == int(profile.ROCM_FIT.load_residue_gib * GiB)
    w21 = predict(LLAMA, R9700, cfg, (0, 21, 0)).first.weights_bytes
    assert w21 == stage_weight_bytes(LLAMA, Parallel(), 0, 2, R9700.compute_capability, (0, 21, 0), 8192, 256, ROCM)


def test_rocm_figures_stay_off_nvidia_plans():
    h100 = resolve_gpu("NVIDIA H100 80GB HBM3")
    cfg = EngineConfig(gpu_memory_utilization=0.9, max_model_len=8192)
    wild = profile.RocmFit(5.0, 5.0, 5.0, 9.0, 9.0, 9.0)
    assert predict(LLAMA, h100, cfg, V13).to_dict() == predict(LLAMA, h100, cfg, V13, rocm=wild).to_dict()


def test_rocm_kv_range_is_wider_below_than_above():
    # ROCm starts of one setup take more memory than the fit, never much less (RocmFit.kv_below_gib/kv_above_gib)
    r = predict(LLAMA, R9700, EngineConfig(gpu_memory_utilization=0.9, max_model_len=8192), V13)
    below, above = r.kv_cache_bytes - r.kv_cache_low_bytes, r.kv_cache_high_bytes - r.kv_cache_bytes
    assert below - above == int(profile.ROCM_FIT.kv_below_gib * GiB) - int(profile.ROCM_FIT.kv_above_gib * GiB)
