"""Gemma 3n, MiniCPM / MiniCPM3 and Granite-4.0-H planned as vLLM builds them.

Every expected figure is worked by hand from the config and the vLLM source named beside it (the sources of vLLM
0.6.6 ... 0.33.0); none was read off oomguard's output. Gemma 3n E2B's config is the catalog's (a verbatim copy of the
released config.json, checked against Google DeepMind's gemma library). No verified copy of a MiniCPM, MiniCPM3 or
Granite-4.0 config.json was found, so those tests build configs of the published shapes here; they pin the
arithmetic, not a checkpoint.
"""

import json

import pytest

from oomguard.engines.vllm.memory import EngineConfig, predict
from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.weights import Parallel, layer_bytes, stage_weight_bytes
from oomguard.errors import UsageError
from oomguard.gpus.catalog import resolve_gpu
from oomguard.models.load import from_catalog
from oomguard.models.spec import MODELLED_TYPES, NOT_MODELLED_YET, parse_config

E2B = "google/gemma-3n-E2B"
BF16 = 2


def plan_json(capsys, *argv):
    from oomguard.cli import main
    code = main(["plan", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_families_are_modelled_and_no_longer_refused():
    for kind in ("gemma3n", "gemma3n_text", "minicpm", "minicpm3", "granitemoehybrid"):
        assert kind in MODELLED_TYPES and kind not in NOT_MODELLED_YET


# --- Gemma 3n (vllm/model_executor/models/gemma3n.py from 0.9.2, gemma3n_mm.py from 0.10.1) -------------------------

def test_gemma3n_layer_shapes_from_config():
    m = from_catalog(E2B)
    assert m.model_type == "gemma3n_text" and m.architecture == "Gemma3nForConditionalGeneration"
    # layer_types: four sliding layers then one full; the last num_kv_shared_layers (10 of 30) read an earlier cache
    assert (m.layer_attention.count("sliding"), m.layer_attention.count("full")) == (24, 6)
    assert m.kv_shared_layers == 10 and m.reads_shared_kv(20) and not m.reads_shared_kv(19)
    assert (m.gemma3n.altup_inputs, m.gemma3n.laurel_rank, m.per_layer_embed.dim) == (4, 64, 256)
    assert m.intermediate_size == 8192 and m.tie_word_embeddings
    # gemma3n.py Gemma3nAttention: two RoPEs (rope_local_base_freq, rope_theta) over max_position_embeddings
    assert m.rope_cache_positions == (32768, 32768)


def test_gemma3n_layer_weights_by_hand():
    # Gemma3nDecoderLayer at TP 1, bf16, H 2048 (gemma3n.py):
    #   Gemma3nAltUp: correction_coefs 4x4 + prediction_coefs 16x4 + modality_router 2048x4 = 8,272; router_norm 2,048;
    #     correct_output_scale [2048] in fp32 (8,192 bytes)
    #   Gemma3nAttention: qkv 2048 x (8 + 2 x 2) x 256 = 6,291,456, k_norm 256, o 8 x 256 x 2048 = 4,194,304, q_norm 256
    #   Gemma3nMLP: 3 x 2048 x 8192 = 50,331,648
    #   Gemma3nLaurelBlock: 2 x 2048 x 64 = 262,144 + post_laurel_norm 2,048
    #   per_layer_input_gate + per_layer_projection: 2 x 2048 x 256 = 1,048,576; five RMSNorms 10,240
    # = 62,151,248 params -> 124,302,496 bytes + 8,192 = 124,310,688
    m = from_catalog(E2B)
    assert layer_bytes(m, 0, Parallel(), BF16, version=(0, 33, 0)) == 124_310_688
    # a KV-shared layer keeps its full qkv_proj up to 0.29; from 0.30 q_proj only (2048 x 8 x 256) and no k_norm:
    # 6,291,456 - 4,194,304 + 256 = 2,097,408 params fewer
    assert layer_bytes(m, 25, Parallel(), BF16, version=(0, 29, 0)) == 124_310_688
    assert layer_bytes(m, 25, Parallel(), BF16, version=(0, 30, 0)) == 124_310_688 - 2 * 2_097_408
    # TP 2: qkv (8/2 + 2 x 2/2) x 256 x 2048 = 3,145,728, o 2,097,152, MLP 25,165,824, Laurel 131,072; the AltUp
    # linears, per-layer gate and projection (ReplicatedLinear) and the norms stay whole
    tp2 = 8_272 + 2_048 + 3_145_728 + 256 + 2_097_152 + 256 + 25_165_824 + 131_072 + 2_048 + 1_048_576 + 10_240
    assert layer_bytes(m, 0, Parallel(tp=2), BF16, version=(0, 33, 0)) == tp2 * 2 + 8_192


def test_gemma3n_model_weights_towers_and_buffer_by_hand():
    # Everything E2B holds outside its 30 decoder layers (TP 1, bf16, max_num_batched_tokens 8192), in parameters:
    #   embed_tokens 262,400 x 2048 (logits from it: no lm_head)                           537,395,200
    #   embed_tokens_per_layer 262,144 x (30 x 256)                                    2,013,265,920
    #   per_layer_model_projection 2048 x 7680 + per_layer_projection_norm 256             15,728,896
    #   altup_projections + altup_unembed_projections: 2 x 3 x 2048 x 2048                 25,165,824
    #   final norm 2,048; RoPE caches 2 x 32,768 x 256 = 16,777,216
    #   gemma3n_mm.py per_layer_embeddings buffer 8192 x 30 x 256                          62,914,560
    #   vision tower timm mobilenetv5_300m_enc                                            294,126,912
    #   audio tower (Gemma3nAudioEncoder, H 1536): 12 conformer blocks of 24 H^2 + 9 H + 192 + 5 H = 56,644,800,
    #   subsampling convs 1,152 + 128 + 36,864 + 32, input_proj 32 x 32 x 1536 = 1,572,864     681,348,640
    #   embed_vision / embed_audio: norms 2 x 2048 + 2 x 1536; embeddings 128 x 2048, 128 x 1536 and
    #   projections 2048 x 2048, 1536 x 2048                                        7,168 + 7,798,784
    m = from_catalog(E2B)
    assert m.vision.params == 294_126_912 + 681_348_640 + 7_168 and m.vision.split_params == 7_798_784
    layers = sum(layer_bytes(m, i, Parallel(), BF16, version=(0, 33, 0)) for i in range(30))
    total = stage_weight_bytes(m, Parallel(), 0, BF16, (9, 0), (0, 33, 0), batched_tokens=8192)
    outside = (537_395_200 + 2_013_265_920 + 15_728_896 + 25_165_824 + 2_048 + 16_777_216 + 62_914_560
               + 294_126_912 + 681_348_640 + 7_168 + 7_798_784)
    assert total - layers == outside * BF16
    # 0.9.2-0.10.0 serve it through gemma3n.py's text-only Gemma3nForConditionalGeneration: no towers, embedders or
    # per-layer-embedding buffer
    text_only = stage_weight_bytes(m, Parallel(), 0, BF16, (9, 0), (0, 10, 0), batched_tokens=8192)
    old_layers = sum(layer_bytes(m, i, Parallel(), BF16, version=(0, 10, 0)) for i in range(30))
    assert text_only - old_layers == (outside - 62_914_560 - 294_126_912 - 681_348_640 - 7_168 - 7_798_784) * BF16
    # the text model: 4.456B parameters without the RoPE caches (the text-only export of E2B states 4.46B)
    assert 4.45e9 < (text_only / BF16 - 16_777_216) < 4.47e9


def test_gemma3n_kv_layout_by_hand():
    # 20 layers own a cache (the 10 KV-shared ones get no spec): 16 sliding (window 512) and 4 full, each 2 x 2 x 256 x 2
    # = 2,048 bytes a token; one page size, two kinds -> groups of 4: four sliding groups and one full, a block of 16
    # tokens = 4 x 32,768 bytes
    r = predict(from_catalog(E2B), resolve_gpu("h100"), EngineConfig(max_model_len=32768), (0, 33, 0))
    layout = r.kv_layout
    assert len(layout.groups) == 5 and layout.group_size == 4 and layout.bytes_per_block == 131_072
    assert {g.spec.page_size_bytes for g in layout.groups} == {32_768} and r.block_size == 16
    # a 32k request: the full group cdiv(32768, 16) = 2048 blocks; each sliding group cdiv(511 + in-flight, 16) + 1
    in_flight = r.in_flight_tokens
    assert layout.blocks_per_request(32768, in_flight) == 2048 + 4 * (-(-(511 + in_flight) // 16) + 1)


def test_gemma3n_first_release_and_multimodal_from_0_10_1():
    m = from_catalog(E2B)
    with pytest.raises(UsageError, match="0.9.2"):
        predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=8192), (0, 9, 1))
    assert not release((0, 10, 0)).gemma3n_multimodal and release((0, 10, 1)).gemma3n_multimodal
    old = predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=8192), (0, 9, 2))
    new = predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=8192), (0, 10, 1))
    assert new.first.weights_bytes - old.first.weights_bytes > 1.9 * 2**30   # towers (~1.8 GiB) and the PLE buffer


@pytest.mark.parametrize("version", ["0.9.2", "0.10.1", "0.19.0", "0.33.0"])
def test_gemma3n_plan_cli(version, capsys):
    code, data = plan_json(capsys, E2B, "--gpu", "h100", "--vllm-version", version)
    assert code in (0, 1, 3) and data["weights_gib"] > 8 and data["block_size"] == 16
    # the instruct checkpoint resolves to the base's shapes
    code, it = plan_json(capsys, "google/gemma-3n-E2B-it", "--gpu", "h100", "--vllm-version", version)
    assert it["weights_gib"] == data["weights_gib"]


# --- MiniCPM (models/minicpm.py) and MiniCPM3 (models/minicpm3.py) ------------------------------------------------

MINICPM_2B = {  # openbmb/MiniCPM-2B-sft-bf16's published shape
    "architectures": ["MiniCPMForCausalLM"], "model_type": "minicpm", "hidden_size": 2304, "intermediate_size": 5760,
    "num_attention_heads": 36, "num_key_value_heads": 36, "num_hidden_layers": 40, "vocab_size": 122753,
    "max_position_embeddings": 4096, "hidden_act": "silu", "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16",
    "tie_word_embeddings": True, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4,
}
MINICPM3_4B = {  # openbmb/MiniCPM3-4B's published shape (LongRoPE over 32k)
    "architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3", "hidden_size": 2560, "intermediate_size": 6400,
    "num_attention_heads": 40, "num_key_value_heads": 40, "num_hidden_layers": 62, "vocab_size": 73448,
    "q_lora_rank": 768, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
    "max_position_embeddings": 32768, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "longrope", "long_factor": [1.0] * 16, "short_factor": [1.0] * 16,
                     "original_max_position_embeddings": 32768},
    "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4,
}


def test_minicpm_weights_and_kv_by_hand():
    # minicpm.py MiniCPMDecoderLayer: head_dim = 2304 / 36 = 64; qkv 2304 x 3 x 36 x 64 = 15,925,248, o 5,308,416,
    # MiniCPMMLP 3 x 2304 x 5760 = 39,813,120, two RMSNorms 4,608 -> 61,051,392 params
    m = parse_config(MINICPM_2B, "openbmb/MiniCPM-2B-sft-bf16")
    assert layer_bytes(m, 0, Parallel(), BF16) == 61_051_392 * BF16
    # 36 KV heads x 64 x K and V x bf16 = 9,216 bytes a token a layer, 368,640 over 40 layers
    r = predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=4096), (0, 19, 0))
    assert r.kv_layout.bytes_per_block == 16 * 368_640
    # MiniCPM-MoE: MiniCPMMoE keeps ws / w2s as plain parameters in the model dtype, never quantized
    moe = parse_config({**MINICPM_2B, "num_experts": 8, "num_experts_per_tok": 2,
                        "quantization_config": {"quant_method": "fp8"}}, "openbmb/MiniCPM-MoE-8x2B")
    # fp8 attention (21,233,664 weights at one byte), experts 8 x 3 x 2304 x 5760 and the gate 2304 x 8 in bf16
    assert layer_bytes(moe, 0, Parallel(), BF16) == 4_608 * BF16 + 21_233_664 + (318_504_960 + 18_432) * BF16


def test_minicpm3_weights_and_kv_by_hand():
    # minicpm3.py MiniCPM3Attention (TP 1): q_a_proj 2560 x 768 = 1,966,080 + q_a_layernorm 768, q_b_proj 768 x 40 x 96
    # = 2,949,120, kv_a_proj_with_mqa 2560 x 288 = 737,280 + kv_a_layernorm 256, kv_b_proj 256 x 40 x 128 = 1,310,720,
    # o_proj 40 x 64 x 2560 = 6,553,600 (no absorbed copies: the attention is plain multi-head) = 13,517,824;
    # MLP 3 x 2560 x 6400 = 49,152,000; two RMSNorms 5,120 -> 62,674,944 params
    m = parse_config(MINICPM3_4B, "openbmb/MiniCPM3-4B")
    assert m.mla is None and m.low_rank_attention is not None and set(m.layer_attention) == {"full"}
    assert layer_bytes(m, 0, Parallel(), BF16) == 62_674_944 * BF16
    # TP 2: the two ReplicatedLinear projections and norms stay whole, the rest halves
    tp2 = 1_966_080 + 768 + 2_949_120 // 2 + 737_280 + 256 + 1_310_720 // 2 + 6_553_600 // 2 + 49_152_000 // 2 + 5_120
    assert layer_bytes(m, 0, Parallel(tp=2), BF16) == tp2 * BF16
    # Attention(num_heads, qk_head_dim 96, num_kv_heads=num_heads): 2 x 40 x 96 x 2 = 15,360 bytes a token a layer,
    # 952,320 over 62 layers (TP 2: half)
    r = predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=32768), (0, 19, 0))
    assert r.kv_layout.bytes_per_block == 16 * 952_320 and r.block_size == 16
    r2 = predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=32768, tensor_parallel_size=2), (0, 19, 0),
                 gpu_count=2)
    assert r2.kv_layout.bytes_per_block == 16 * 952_320 // 2
    # LongRoPE: Phi3LongRoPEScaledRotaryEmbedding caches original (32,768) + max (32,768) positions of 32 dims
    assert m.rope_cache_positions == (65_536,) and m.rotary_dim == 32


@pytest.mark.parametrize("config", [MINICPM_2B, MINICPM3_4B], ids=["minicpm", "minicpm3"])
def test_minicpm_plan_cli(config, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    for version in ("0.6.6", "0.10.2", "0.33.0"):
        code, data = plan_json(capsys, "openbmb/x", "--model-config", str(path), "--gpu", "h100",
                               "--vllm-version", version)
        assert code in (0, 1, 3) and data["weights_gib"] > 4 and data["block_size"] == 16


# --- Granite-4.0-H (models/granitemoehybrid.py; V1 by default from 0.10.2) -----------------------------------------

def _granite(layers, hidden, heads, kv, experts, top_k, inter, shared, m_heads, m_head, rope=False, **extra):
    attention = {4, 14, 24, 34} if layers == 40 else set()
    types = extra.pop("layer_types", ["attention" if i in attention else "mamba" for i in range(layers)])
    return {"architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
            "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "num_local_experts": experts, "num_experts_per_tok": top_k,
            "intermediate_size": inter, "shared_intermediate_size": shared, "mamba_n_heads": m_heads,
            "mamba_d_head": m_head, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2,
            "mamba_conv_bias": True, "mamba_proj_bias": False, "layer_types": types, "vocab_size": 100352,
            "max_position_embeddings": 131072, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "position_embedding_type": "rope" if rope else "nope", "attention_bias": False, **extra}


H_SMALL = _granite(40, 4096, 32, 8, 72, 10, 768, 1536, 128, 64)    # granite-4.0-h-small's published shape
H_TINY = _granite(40, 1536, 12, 4, 64, 6, 512, 1024, 48, 64)       # granite-4.0-h-tiny's
MICRO = _granite(40, 2560, 40, 8, 0, 0, 8192, 8192, 128, 40, rope=True, layer_types=["attention"] * 40,
                 mamba_d_state=256)                                 # granite-4.0-micro: every layer attention


def test_granite_hybrid_layers_and_weights_by_hand():
    m = parse_config(H_SMALL, "ibm-granite/granite-4.0-h-small")
    assert (m.layer_attention.count("mamba"), m.layer_attention.count("full")) == (36, 4)
    assert m.layer_ffn == tuple("moe" for _ in range(40)) and m.rope_cache_positions == ()
    # MambaMixer2 (layers/mamba/mamba_mixer2.py), I = mamba_expand x 4096 = 8192, one B/C group of 128:
    #   in_proj (2 x 8192 + 2 x 128 + 128) x 4096 = 68,681,728; conv1d 8448 x 4 = 33,792 + bias 8,448;
    #   D and dt_bias 256, gated norm 8,192, out_proj 33,554,432; A [128] fp32 = 512 bytes
    # GraniteMoeMoE: experts 72 x 3 x 4096 x 768 = 679,477,248, gate 4096 x 72 = 294,912;
    # GraniteMoeSharedMLP 3 x 4096 x 1536 = 18,874,368; two RMSNorms 8,192
    mamba = 68_681_728 + 33_792 + 8_448 + 256 + 8_192 + 33_554_432
    ffn = 679_477_248 + 294_912 + 18_874_368 + 8_192
    assert layer_bytes(m, 0, Parallel(), BF16) == (mamba + ffn) * BF16 + 512
    # GraniteMoeHybridAttention: head_dim 4096 / 32 = 128, qkv 4096 x 48 x 128 = 25,165,824, o 16,777,216, no RoPE
    assert layer_bytes(m, 4, Parallel(), BF16) == (25_165_824 + 16_777_216 + ffn) * BF16
    # the whole model: 32.2B parameters (tied embeddings 100,352 x 4096)
    total = stage_weight_bytes(m, Parallel(), 0, BF16, (9, 0), (0, 19, 0))
    assert total == 36 * ((mamba + ffn) * BF16 + 512) + 4 * (25_165_824 + 16_777_216 + ffn) * BF16 \
        + (100_352 * 4096 + 4096) * BF16
    assert 32.1e9 < total / BF16 < 32.3e9


@pytest.mark.parametrize("version, block, pages", [
    ((0, 19, 0), 528, 1),     # prefix caching off: one state page a request
    ((0, 31, 0), 528, 2),     # 0.28+: prefix caching on by default, "align" mode: two pages
    ((0, 33, 0), 528, 3),     # 0.32+: MambaMixer2 keeps a prefill checkpoint page too (alignment stays 16)
])
def test_granite_hybrid_state_pages_as_nemotron_h(version, block, pages):
    # mamba2_state_shape, TP 1: conv (4 - 1) x (8192 + 2 x 128) = 25,344 and temporal 128 x 64 x 128 = 1,048,576
    # elements, bf16 (Granite has no SSM dtype override) = 2,147,840 bytes; attention 2 x 8 x 128 x 2 = 4,096 bytes a
    # token, so the block is 16 x cdiv(2,147,840, 65,536) = 528 tokens and the page 2,162,688 bytes
    m = parse_config(H_SMALL, "ibm-granite/granite-4.0-h-small")
    r = predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=32768), version)
    assert r.block_size == block
    layout = r.kv_layout
    # 4 attention + 36 Mamba layers -> groups of 4: one attention group and nine Mamba groups, a block of 4 pages
    assert len(layout.groups) == 10 and layout.group_size == 4 and layout.bytes_per_block == 4 * 2_162_688
    assert layout.blocks_per_request(32768, r.in_flight_tokens) == -(-32768 // 528) + 9 * pages


def test_granite_hybrid_tiny_tp2_state():
    # TP 2: B/C's single group is replicated (extra_groups_for_head_shards): conv 3 x (3072 + 2 x 2 x 128) / 2 = 5,376,
    # temporal 24 x 64 x 128 = 196,608 -> 403,968 bytes; attention 2 x 2 x 128 x 2 = 1,024 bytes a token
    # -> block 16 x cdiv(403,968, 16,384) = 400
    m = parse_config(H_TINY, "ibm-granite/granite-4.0-h-tiny")
    assert m.recurrent.state_elements(2) == (5_376, 196_608)
    r = predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=32768, tensor_parallel_size=2), (0, 19, 0),
                gpu_count=2)
    assert r.block_size == 400


def test_granite_hybrid_needs_0_10_2():
    m = parse_config(H_TINY, "ibm-granite/granite-4.0-h-tiny")
    assert "granitemoehybrid" in release((0, 10, 2)).hybrid_model_types
    assert "granitemoehybrid" not in release((0, 10, 1)).hybrid_model_types
    with pytest.raises(UsageError, match="0.10.2"):
        predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=8192), (0, 10, 1))


def test_granite_micro_all_attention_is_hybrid_only_before_0_11_1():
    # config/model.py ModelConfig.is_hybrid ignores an all-attention layer_types from 0.11.1; before, the hybrid config
    # grows the block to hold the Mamba state the config describes: conv 3 x (5120 + 2 x 256) = 16,896 and temporal
    # 128 x 40 x 256 = 1,310,720 elements, bf16 = 2,655,232 bytes; attention 2 x 8 x 64 x 2 = 2,048 bytes a token
    # -> 16 x cdiv(2,655,232, 32,768) = 16 x 82 = 1,312
    m = parse_config(MICRO, "ibm-granite/granite-4.0-micro")
    assert set(m.layer_attention) == {"full"} and m.layer_ffn == tuple("mlp" for _ in range(40))
    assert m.intermediate_size == 8192 and m.rope_cache_positions == (131072,)
    old = predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=8192), (0, 11, 0))
    new = predict(m, resolve_gpu("h100"), EngineConfig(max_model_len=8192), (0, 11, 1))
    assert (old.block_size, new.block_size) == (1312, 16)
    assert len(new.kv_layout.groups) == 1 and new.kv_layout.bytes_per_block == 40 * 16 * 2_048


@pytest.mark.parametrize("config", [H_SMALL, H_TINY, MICRO], ids=["h-small", "h-tiny", "micro"])
def test_granite_plan_cli(config, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    for version in ("0.10.2", "0.19.0", "0.33.0"):
        code, data = plan_json(capsys, "ibm-granite/x", "--model-config", str(path), "--gpu", "h100",
                               "--vllm-version", version, "--max-model-len", "32768")
        assert code in (0, 1, 3) and data["weights_gib"] > 3
