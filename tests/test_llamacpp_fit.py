"""llama.cpp tiering plan (oomguard/engines/llamacpp/fit.py): GGUF sizes, KV cache, layer split, speed, command.

The pure tests check the arithmetic against the model's config; the engine tests check it against llama.cpp
itself, built from the llama-cpp-python source package:
- `llama-quantize` on a small real GGUF: the type of every tensor and the file's tensor bytes, per mix;
- `llama-fit-params` (llama.cpp's own fit logic) on an emulated device of known size (ggml-rpc-server, see
  fitcheck.py): the -ngl it picks vs ours, on the small real GGUF and on shape-only GGUFs of full-size models.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from oomguard.engines.llamacpp import fit
from oomguard.engines.llamacpp.quant import GGML_TYPES, choose_types, tensor_bytes
from oomguard.engines.llamacpp.tensors import gguf_tensors, mix_context
from oomguard.errors import UsageError
from oomguard.models.load import load_model
from oomguard.models.spec import parse_config
from oomguard.units import GiB, MiB

LLAMA8B = "meta-llama/Llama-3.1-8B-Instruct"


def small_spec(n_layer=12, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_ctx_train=8192):
    """The ModelSpec of tests/conftest.py's small_gguf (and of any TinyConfig)."""
    return parse_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": n_embd,
                         "intermediate_size": n_ff, "num_hidden_layers": n_layer, "num_attention_heads": n_head,
                         "num_key_value_heads": n_head_kv, "vocab_size": 32000, "torch_dtype": "float16",
                         "max_position_embeddings": n_ctx_train, "tie_word_embeddings": False}, "small-llama")


# ---------------------------------------------------------------- pure

def test_type_table_matches_ggml_block_sizes_of_the_gguf_package():
    gguf = pytest.importorskip("gguf")
    sizes = {k.name: v for k, v in gguf.GGML_QUANT_SIZES.items()}
    for name, (block, size) in GGML_TYPES.items():
        assert sizes[name] == (block, size), name


def test_bits_per_weight_of_common_types():
    from oomguard.engines.llamacpp.quant import bits_per_weight
    assert bits_per_weight("Q4_K") == 4.5 and bits_per_weight("Q8_0") == 8.5 and bits_per_weight("Q6_K") == 6.5625


def test_k_quant_mix_puts_more_bits_where_llama_quantize_does():
    m = load_model(LLAMA8B)
    tensors = gguf_tensors(m)
    types = dict(zip((t.name for t in tensors), choose_types(tensors, "Q4_K_M", mix_context(m))))
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert types["blk.0.attn_norm.weight"] == "F32"
    n = m.num_layers
    for i in range(n):  # use_more_bits: first and last eighth, and every third layer in between
        more = i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2
        assert types[f"blk.{i}.ffn_down.weight"] == ("Q6_K" if more else "Q4_K")
        assert types[f"blk.{i}.attn_v.weight"] == ("Q6_K" if more else "Q4_K")
        assert types[f"blk.{i}.attn_q.weight"] == "Q4_K"


def test_file_size_falls_with_the_quantization_ladder():
    m = load_model(LLAMA8B)
    sizes = [fit.gguf_weights(m, q).file_bytes for q in ("BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")]
    assert sizes == sorted(sizes, reverse=True)
    w = fit.gguf_weights(m, "BF16")
    one_d = sum(t.shape[0] for t in gguf_tensors(m) if len(t.shape) == 1)
    assert w.file_bytes == 2 * w.params + 2 * one_d  # matrices 2 bytes, 1-D tensors (norms) F32: 4 bytes
    assert 4.4 < fit.gguf_weights(m, "Q4_K_M").bits_per_weight < 5.0


def test_tied_embeddings_have_no_output_tensor_and_count_once_in_the_file():
    m = load_model("meta-llama/Llama-3.2-1B-Instruct")
    assert m.tie_word_embeddings
    names = [t.name for t in gguf_tensors(m)]
    assert "output.weight" not in names
    w = fit.gguf_weights(m, "Q4_K_M")
    assert w.tied and w.output_matrix_bytes == w.token_embd_bytes
    assert w.file_bytes == sum(w.layer_bytes) + w.token_embd_bytes + w.output_norm_bytes
    types = dict(zip(names, choose_types(gguf_tensors(m), "Q4_K_M", mix_context(m))))
    assert types["token_embd.weight"] == "Q6_K"  # quantized as the output it also is


def test_kv_cache_padding_slots_and_types():
    m = load_model(LLAMA8B)
    per_token_f16 = 2 * m.num_kv_heads * m.head_dim * 2  # K and V, f16, one layer
    kv = fit.kv_cache(m, 8000, 4)
    assert kv.n_ctx == 8192 and kv.n_ctx_seq == 2048  # padded to 256; one stream of n_ctx/np per slot
    assert kv.total_bytes == per_token_f16 * m.num_layers * 8192
    q8 = fit.kv_cache(m, 8000, 4, "q8_0", "q8_0")
    assert q8.total_bytes == kv.total_bytes * 34 // 64  # 34 bytes per 32 values vs 64
    q4 = fit.kv_cache(m, 8000, 4, "q4_0", "q4_0")
    assert q4.total_bytes == kv.total_bytes * 18 // 64
    odd = fit.kv_cache(m, 1000, 3)  # 1024 / 3 = 341 -> 512 per slot
    assert odd.n_ctx_seq == 512 and odd.n_ctx == 1536
    with pytest.raises(UsageError):
        fit.kv_cache(m, 1024, 1, "q5_9")


def test_sliding_window_layers_hold_window_plus_ubatch_cells():
    m = load_model("google/gemma-2-9b-it")
    kv = fit.kv_cache(m, 32768, 1)
    per_layer_token = 2 * m.num_kv_heads * m.head_dim * 2
    for kind, size in zip(m.layer_attention, kv.layer_bytes):
        cells = 32768 if kind == "full" else 4096 + 512  # pad256(min(n_ctx_seq, n_swa + n_ubatch))
        assert size == per_layer_token * cells
    short = fit.kv_cache(m, 2048, 1)
    assert len(set(short.layer_bytes)) == 1  # below the window every layer holds the whole context


def test_split_places_the_output_layer_first_then_the_last_layers():
    # llama-model.cpp: layer il (il == n_layer: the output layer) is offloaded when il >= n_layer + 1 - ngl
    m = load_model(LLAMA8B)
    w = fit.gguf_weights(m, "Q4_K_M")
    kv = fit.kv_cache(m, 8192, 1)
    prev = None
    for ngl in range(m.num_layers + 2):
        s = fit.split_for(m, w, kv, ngl, flash_attn=False)
        assert s.gpu_weights_bytes + s.cpu_weights_bytes == w.file_bytes
        repeating = max(0, ngl - 1)
        assert s.gpu_kv_bytes == sum(kv.layer_bytes[m.num_layers - repeating:]) if repeating else s.gpu_kv_bytes == 0
        assert s.gpu_weights_bytes == sum(w.layer_bytes[m.num_layers - repeating:]) + (w.output_bytes if ngl else 0)
        if prev:
            assert s.gpu_bytes >= prev.gpu_bytes and s.cpu_weights_bytes <= prev.cpu_weights_bytes
        prev = s
    one = fit.split_for(m, w, kv, 1, flash_attn=False)
    assert one.output_on_gpu and one.repeating_on_gpu == 0 and "output layer on the GPU" in one.describe()
    assert not fit.split_for(m, w, kv, 32, flash_attn=False).full_offload
    assert fit.split_for(m, w, kv, 33, flash_attn=False).full_offload
    tied = load_model("meta-llama/Llama-3.2-1B-Instruct")
    tw = fit.gguf_weights(tied, "Q8_0")
    s = fit.split_for(tied, tw, fit.kv_cache(tied, 2048, 1), 1, flash_attn=False)
    assert s.gpu_weights_bytes == tw.output_bytes and s.cpu_weights_bytes == tw.file_bytes - tw.output_norm_bytes


def test_largest_ngl_fits_the_target_and_one_more_does_not():
    m = load_model(LLAMA8B)
    w = fit.gguf_weights(m, "Q4_K_M")
    kv = fit.kv_cache(m, 8192, 2, "q8_0", "q8_0")
    for free_gib in (2, 3, 4.5, 6):
        free = int(free_gib * GiB)
        s = fit.max_gpu_layers(m, w, kv, free, flash_attn=True)
        assert s.gpu_bytes <= free - fit.DEFAULT_MARGIN_BYTES
        more = fit.split_for(m, w, kv, s.n_gpu_layers + 1, flash_attn=True)
        assert more.gpu_bytes > free - fit.DEFAULT_MARGIN_BYTES
    assert fit.max_gpu_layers(m, w, kv, 80 * GiB, flash_attn=True).full_offload
    assert fit.max_gpu_layers(m, w, kv, 1 * GiB, flash_attn=True).n_gpu_layers == 0


def test_speed_is_a_roofline_bound_and_cpu_bytes_dominate():
    m = load_model("meta-llama/Llama-3.1-70B-Instruct")
    p = fit.plan(m, 24 * GiB, n_ctx_per_slot=4096, quantization="Q4_K_M", cache_type="q8_0",
                 gpu_bandwidth=1008e9, cpu_bandwidth=60e9, gpu_flops=165e12, pcie_bandwidth=25e9)
    assert not p.fits_on_gpu and 0 < p.split.n_gpu_layers < m.num_layers
    s = p.speed
    # no faster than streaming the CPU-resident weights once per token at the stated CPU bandwidth
    assert s.decode_tokens_per_s <= 60e9 / p.split.cpu_weights_bytes
    assert s.bound == "CPU memory bandwidth"
    assert s.decode_tokens_per_s_all_slots >= s.decode_tokens_per_s * 0.999
    assert s.prefill_tokens_per_s <= 512 * 25e9 / p.split.cpu_weights_bytes  # CPU weights cross PCIe per ubatch
    slow_cpu = fit.plan(m, 24 * GiB, n_ctx_per_slot=4096, quantization="Q4_K_M", cache_type="q8_0",
                        gpu_bandwidth=1008e9, cpu_bandwidth=30e9)
    assert slow_cpu.speed.decode_tokens_per_s < s.decode_tokens_per_s


def test_a_70b_fp16_plan_says_it_is_seconds_per_token():
    m = load_model("meta-llama/Llama-3.1-70B-Instruct")
    p = fit.plan(m, 24 * GiB, n_ctx_per_slot=4096, quantization="BF16", gpu_bandwidth=1008e9)
    assert p.speed.seconds_per_token > 1.0
    assert "s per token" in p.verdict and "rules out" in p.verdict


def test_plan_picks_best_quality_that_fits_fully_else_q4_k_m_partial():
    from oomguard.gpus.catalog import resolve_gpu
    from oomguard.plan.workload import Workload

    gpu = resolve_gpu("rtx4090")
    small = fit.plan_for_workload(load_model(LLAMA8B), gpu, Workload(p99_tokens=4000, peak_concurrency=2))
    assert small.fits_on_gpu and small.quantization == "BF16"
    big = fit.plan_for_workload(load_model("meta-llama/Llama-3.1-70B-Instruct"), gpu,
                                Workload(p99_tokens=8000, peak_concurrency=2))
    assert not big.fits_on_gpu and big.quantization == "Q4_K_M" and big.cache_type_k == "q8_0"
    assert big.alternatives and all("n_gpu_layers" in a for a in big.alternatives)
    shared = fit.plan_for_workload(load_model(LLAMA8B), gpu, Workload(p99_tokens=4000, peak_concurrency=2),
                                   free_memory_bytes=8 * GiB)
    assert shared.gpu_free_bytes == 8 * GiB and shared.quantization != "BF16"
    d = json.loads(json.dumps(big.to_dict()))
    assert d["n_gpu_layers"] == big.split.n_gpu_layers and d["command"].startswith("llama-server -m ")
    cmd = big.command().split()
    assert cmd[cmd.index("-ngl") + 1] == str(big.split.n_gpu_layers)
    assert cmd[cmd.index("-c") + 1] == str(big.n_ctx) and cmd[cmd.index("-np") + 1] == "2"
    assert cmd[cmd.index("--cache-type-v") + 1] == "q8_0" and cmd[cmd.index("-fa") + 1] == "on"
    assert big.n_ctx == 2 * 8192  # p99 8000 rounded up to 256 per slot, two slots


def test_bad_input_is_a_usage_error():
    m = load_model(LLAMA8B)
    with pytest.raises(UsageError):
        fit.gguf_weights(m, "Q4_K_Z")
    with pytest.raises(UsageError):
        fit.plan_config(m, 8 * GiB, quantization="Q4_K_M", n_ctx_per_slot=0)
    with pytest.raises(UsageError):
        fit.plan_config(m, 8 * GiB, quantization="Q4_K_M", n_ctx_per_slot=1024, cache_type="q8_0", flash_attn=False)


# ---------------------------------------------------------------- against llama.cpp itself

@pytest.fixture(scope="module")
def rpc_endpoint(llama_fit_tools):
    from oomguard.engines.llamacpp.fitcheck import rpc_device

    with rpc_device(llama_fit_tools["ggml-rpc-server"]) as endpoint:
        yield endpoint


@pytest.mark.engine
@pytest.mark.parametrize("ftype", ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_XS", "Q3_K_M", "Q2_K"])
def test_every_tensor_type_and_size_matches_llama_quantize(ftype, llama_fit_tools, small_gguf, tmp_path):
    gguf = pytest.importorskip("gguf")
    out = tmp_path / f"small-{ftype}.gguf"
    proc = subprocess.run([str(llama_fit_tools["llama-quantize"]), str(small_gguf), str(out), ftype, "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = {t.name: (t.tensor_type.name, int(t.n_bytes)) for t in gguf.GGUFReader(str(out)).tensors}
    m = small_spec()
    tensors = gguf_tensors(m)
    ours = {t.name: (ty, tensor_bytes(ty, t.shape)) for t, ty in zip(tensors, choose_types(tensors, ftype, mix_context(m)))}
    assert got == ours
    w = fit.gguf_weights(m, ftype)
    assert w.file_bytes == sum(n for _, n in got.values())


def _ours(model, weights, *, device_bytes, n_ctx, n_parallel, cache_type, flash_attn):
    from oomguard.engines.llamacpp.fitcheck import MiB as _MiB, host_memory_bytes

    total = host_memory_bytes()
    margin = (total - device_bytes) // _MiB * _MiB  # what fit_layers passes as --fit-target
    kv = fit.kv_cache(model, n_ctx, n_parallel, cache_type, cache_type)
    return fit.max_gpu_layers(model, weights, kv, total, flash_attn=flash_attn, margin_bytes=margin)


# (n_ctx, slots, KV type, flash attention, device sizes in MiB)
SMALL_CASES = [(2048, 1, "f16", False, (70, 90, 95, 100, 110)), (4096, 2, "q8_0", True, (80, 85, 92, 200))]


@pytest.mark.engine
@pytest.mark.parametrize("n_ctx,slots,cache,fa,devices_mib", SMALL_CASES)
def test_layer_split_matches_llama_fit_params_on_the_small_real_gguf(n_ctx, slots, cache, fa, devices_mib,
                                                                     llama_fit_tools, small_gguf, rpc_endpoint):
    from oomguard.engines.llamacpp.fitcheck import fit_layers

    m = small_spec()
    w = fit.gguf_weights(m, "F16")
    for mib in devices_mib:
        theirs = fit_layers(llama_fit_tools["llama-fit-params"], small_gguf, rpc_endpoint, device_bytes=mib * MiB,
                            n_ctx=n_ctx, n_parallel=slots, cache_type=cache, flash_attn=fa, n_layer=m.num_layers)
        ours = _ours(m, w, device_bytes=mib * MiB, n_ctx=n_ctx, n_parallel=slots, cache_type=cache, flash_attn=fa)
        assert ours.n_gpu_layers == theirs.n_gpu_layers, (mib, ours.to_dict(), theirs.stderr[-1500:])


# Full-size shapes: shape-only GGUFs (no data on disk), llama.cpp's fit on an emulated device of each size
SHAPE_CASES = [
    ("meta-llama/Llama-3.1-8B-Instruct", "Q4_K_M", 8192, 1, "f16", False, (1.5, 2.5, 3.3, 4.7, 6.5)),
    ("meta-llama/Llama-3.1-8B-Instruct", "Q8_0", 32768, 4, "q8_0", True, (3, 5, 7.2, 9)),
    ("meta-llama/Llama-3.2-1B-Instruct", "BF16", 16384, 2, "f16", True, (1.5, 2, 2.6, 3.2)),
    ("codellama/CodeLlama-13b-hf", "Q3_K_M", 4096, 3, "q4_0", True, (2, 3.1, 4.4, 6, 7)),
]


@pytest.mark.engine
@pytest.mark.parametrize("model_id,ftype,n_ctx,slots,cache,fa,devices_gib", SHAPE_CASES)
def test_layer_split_matches_llama_fit_params_on_full_size_shapes(model_id, ftype, n_ctx, slots, cache, fa,
                                                                  devices_gib, llama_fit_tools, rpc_endpoint, tmp_path):
    from oomguard.engines.llamacpp.fitcheck import fit_layers, host_memory_bytes
    from oomguard.engines.llamacpp.shapegguf import write_shape_gguf

    m = load_model(model_id)
    path = write_shape_gguf(tmp_path / "shape.gguf", m, ftype)
    w = fit.gguf_weights(m, ftype)
    checked = 0
    for gib in devices_gib:
        device = int(gib * GiB)
        if device >= host_memory_bytes():
            continue  # the emulated device is this machine's RAM at most
        theirs = fit_layers(llama_fit_tools["llama-fit-params"], path, rpc_endpoint, device_bytes=device,
                            n_ctx=n_ctx, n_parallel=slots, cache_type=cache, flash_attn=fa, n_layer=m.num_layers)
        ours = _ours(m, w, device_bytes=device, n_ctx=n_ctx, n_parallel=slots, cache_type=cache, flash_attn=fa)
        assert ours.n_gpu_layers == theirs.n_gpu_layers, (gib, ours.to_dict(), theirs.stderr[-1500:])
        checked += 1
    if checked < 2:
        pytest.skip("this machine's RAM is smaller than the emulated devices of this case")


@pytest.mark.engine
def test_memory_breakdown_matches_llama_cpp(llama_fit_tools, rpc_endpoint, tmp_path):
    """Weights and KV on the device to the MiB, the compute buffer estimate within 5% (llama-fit-params --fit-print)."""
    from oomguard.engines.llamacpp.fitcheck import fit_print
    from oomguard.engines.llamacpp.shapegguf import write_shape_gguf

    m = load_model(LLAMA8B)
    path = write_shape_gguf(tmp_path / "l8b.gguf", m, "Q4_K_M")
    w = fit.gguf_weights(m, "Q4_K_M")
    for n_ctx, slots, cache, fa, ngl in ((8192, 1, "f16", False, 12), (32768, 4, "q8_0", True, 33), (4096, 2, "f16", False, 1)):
        got = fit_print(llama_fit_tools["llama-fit-params"], path, rpc_endpoint, n_gpu_layers=ngl, n_ctx=n_ctx,
                        n_parallel=slots, cache_type=cache, flash_attn=fa)["RPC0"]
        s = fit.split_for(m, w, fit.kv_cache(m, n_ctx, slots, cache, cache), ngl, flash_attn=fa)
        assert got[0] == s.gpu_weights_bytes // MiB and got[1] == s.gpu_kv_bytes // MiB
        assert abs(s.gpu_compute_bytes / MiB - got[2]) <= 0.05 * got[2] + 2


@pytest.mark.engine
def test_moe_experts_on_the_cpu_match_llama_cpp_n_cpu_moe(llama_fit_tools, rpc_endpoint, tmp_path):
    """--n-cpu-moe N: llama.cpp's breakdown of a Mixtral-shaped GGUF (shape only) vs our split."""
    from oomguard.engines.llamacpp.fitcheck import fit_print
    from oomguard.engines.llamacpp.shapegguf import write_shape_gguf

    m = load_model("mistralai/Mixtral-8x22B-Instruct-v0.1")
    path = write_shape_gguf(tmp_path / "mixtral.gguf", m, "Q2_K")
    w = fit.gguf_weights(m, "Q2_K")
    kv = fit.kv_cache(m, 4096, 2, "q8_0", "q8_0")
    for n_cpu in (10, 40, 56):
        got = fit_print(llama_fit_tools["llama-fit-params"], path, rpc_endpoint, n_gpu_layers=m.num_layers + 1,
                        n_ctx=4096, n_parallel=2, cache_type="q8_0", flash_attn=True,
                        extra=("--n-cpu-moe", str(n_cpu)))["RPC0"]
        s = fit.split_for(m, w, kv, m.num_layers + 1, flash_attn=True, n_cpu_moe=n_cpu)
        assert s.n_cpu_moe == n_cpu and not s.full_offload
        assert got[0] == s.gpu_weights_bytes // MiB and got[1] == s.gpu_kv_bytes // MiB
        assert abs(s.gpu_compute_bytes / MiB - got[2]) <= 0.1 * got[2] + 2


def test_moe_plan_keeps_experts_on_the_cpu_when_that_is_faster():
    m = load_model("Qwen/Qwen3-30B-A3B")
    p = fit.plan(m, 12 * GiB, n_ctx_per_slot=8192, n_parallel=1, quantization="Q4_K_M", cache_type="q8_0",
                 gpu_bandwidth=1008e9)
    assert p.split.n_cpu_moe > 0 and p.split.n_gpu_layers == m.num_layers + 1 and not p.fits_on_gpu
    assert p.split.gpu_bytes <= 12 * GiB - fit.DEFAULT_MARGIN_BYTES
    assert f"--n-cpu-moe {p.split.n_cpu_moe}" in p.command()
    w = fit.gguf_weights(m, "Q4_K_M")
    kv = fit.kv_cache(m, 8192, 1, "q8_0", "q8_0")
    layers = fit.max_gpu_layers(m, w, kv, 12 * GiB, flash_attn=True)
    whole = fit.speed(m, w, kv, layers, context_tokens=8192, gpu_bandwidth=1008e9)
    assert p.speed.decode_tokens_per_s >= whole.decode_tokens_per_s


@pytest.mark.engine
def test_a_real_quantized_file_read_back_splits_as_llama_fit_params(llama_fit_tools, small_gguf, rpc_endpoint,
                                                                     tmp_path):
    """`oomguard plan FILE.gguf` reads the file's own tensors: on a file llama-quantize wrote, the shapes are the
    model's and the layer split is llama.cpp's own."""
    from oomguard.engines.llamacpp.fitcheck import fit_layers
    from oomguard.engines.llamacpp.gguf_file import read_gguf

    out = tmp_path / "small-Q4_K_M.gguf"
    proc = subprocess.run([str(llama_fit_tools["llama-quantize"]), str(small_gguf), str(out), "Q4_K_M", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    read = read_gguf(str(out))
    m = small_spec()
    assert (read.file_type, read.model.num_layers, read.model.hidden_size, read.model.num_kv_heads,
            read.model.vocab_size, read.model.intermediate_size) == ("Q4_K_M", m.num_layers, m.hidden_size,
                                                                     m.num_kv_heads, m.vocab_size, m.intermediate_size)
    assert read.weights.layer_bytes == fit.gguf_weights(m, "Q4_K_M").layer_bytes   # each tensor to its layer
    for mib in (30, 40, 50, 70):
        theirs = fit_layers(llama_fit_tools["llama-fit-params"], out, rpc_endpoint, device_bytes=mib * MiB,
                            n_ctx=2048, n_parallel=1, cache_type="f16", flash_attn=False, n_layer=m.num_layers)
        ours = _ours(read.model, read.weights, device_bytes=mib * MiB, n_ctx=2048, n_parallel=1, cache_type="f16",
                     flash_attn=False)
        assert ours.n_gpu_layers == theirs.n_gpu_layers, (mib, ours.to_dict(), theirs.stderr[-1500:])
