"""config.json fields that transformers' config classes supply by default are part of the model."""

import json
from pathlib import Path

import pytest

from oomguard.models.spec import parse_config

# google/gemma-3-4b-it's text_config as published: no vocab_size, no attention head counts (Gemma3TextConfig's)
GEMMA3_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
             "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                             "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                             "sliding_window": 1024},
             "torch_dtype": "bfloat16"}


def test_gemma3_text_config_takes_transformers_defaults():
    spec = parse_config(GEMMA3_4B, "google/gemma-3-4b-it")
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (8, 4, 256, 262_208)
    assert spec.sliding_window == 1024          # the published value wins over the default 4096
    kinds = spec.layer_attention
    assert kinds.count("full") == 34 // 6 and kinds[5] == "full" and kinds[0] == "sliding"


def test_defaults_apply_without_a_nested_model_type():
    config = {**GEMMA3_4B, "text_config": {k: v for k, v in GEMMA3_4B["text_config"].items() if k != "model_type"}}
    assert parse_config(config, "x/y").num_heads == 8


def catalog_entry(name: str) -> dict:
    return json.loads((Path(__file__).resolve().parents[1] / "oomguard" / "models" / "catalog" / f"{name}.json")
                      .read_text())


def test_gemma2_ties_embeddings_when_the_config_is_silent():
    entry = catalog_entry("google--gemma-2-9b-it")
    assert "tie_word_embeddings" not in entry["config"]      # as published
    assert parse_config(entry["config"], entry["id"]).tie_word_embeddings
    llama = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "vocab_size": 100}
    assert not parse_config(llama, "x/llama").tie_word_embeddings   # LlamaConfig's default is False


def test_qwen2_5_vl_vision_tower_is_counted_exactly():
    # Hugging Face lists 8,292,166,656 parameters for Qwen/Qwen2.5-VL-7B-Instruct and 7,615,616,512 for
    # Qwen/Qwen2.5-7B-Instruct (same language model): the difference is the vision tower and its merger
    from oomguard.models.load import from_catalog

    assert from_catalog("Qwen/Qwen2.5-VL-7B-Instruct").vision.params == 8_292_166_656 - 7_615_616_512


def test_qwen2_5_vl_saved_with_a_text_config_is_the_same_model():
    # newer transformers save Qwen2(.5)-VL's language-model fields under text_config (model_type qwen2_5_vl_text),
    # as olmOCR-2-7B-1025 is published; the model is the same as the flat config's
    entry = catalog_entry("Qwen--Qwen2.5-VL-7B-Instruct")
    flat = entry["config"] if isinstance(entry["config"], dict) else json.loads(entry["config"])
    text_keys = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rope_theta", "rms_norm_eps", "vocab_size",
                 "sliding_window", "use_sliding_window", "max_window_layers", "rope_scaling", "tie_word_embeddings"}
    nested = {k: v for k, v in flat.items() if k not in text_keys}
    nested["text_config"] = {"model_type": "qwen2_5_vl_text", **{k: v for k, v in flat.items() if k in text_keys}}
    a, b = parse_config(flat, "Qwen/Qwen2.5-VL-7B-Instruct"), parse_config(nested, "allenai/olmOCR-2-7B-1025")
    fields = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
              "derived_max_model_len", "tie_word_embeddings")
    assert [getattr(b, f) for f in fields] == [getattr(a, f) for f in fields]
    assert b.vision.params == a.vision.params


def test_qwen2_vl_tower_width_is_embed_dim_not_hidden_size():
    # Qwen2-VL's vision_config names the tower width embed_dim; its hidden_size is the merger's output width
    vision = {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "hidden_act": "quick_gelu", "mlp_ratio": 4,
              "num_heads": 16, "in_chans": 3, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
    config = {"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "hidden_size": 3584,
              "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
              "num_key_value_heads": 4, "vocab_size": 152064, "torch_dtype": "bfloat16", "vision_config": vision}
    params = parse_config(config, "Qwen/Qwen2-VL-7B-Instruct").vision.params
    # 32 ViT blocks of width 1280 (LayerNorm, non-gated MLP of 5120), the patch embedding, the 5120-wide merger
    block = 4 * 1280 * 1280 + 4 * 1280 + 2 * 1280 * 5120 + 5120 + 1280 + 2 * 2 * 1280
    merger = 2 * 1280 + 5120 * 5120 + 5120 + 5120 * 3584 + 3584
    assert params == 32 * block + 3 * 2 * 14 * 14 * 1280 + merger


def test_kimi_vl_moonvit_tower_equals_the_tensors_vllm_loaded():
    # vLLM 0.19 loading moonshotai/Kimi-VL-A3B-Instruct (llm-d-planner's sweep log) listed the vision tower's and
    # projector's tensor shapes; they sum to 447,545,840: 27 LayerNorm blocks of width 1152, a 64 x 64 learnable
    # position grid, and the projector over 2 x 2 merged patches (LayerNorm, Linear 4608->4608, Linear 4608->2048)
    from oomguard.models.load import from_catalog

    assert from_catalog("moonshotai/Kimi-VL-A3B-Instruct").vision.params == 447_545_840


def test_vision_config_fields_left_out_take_transformers_defaults():
    # Qwen's own AWQ config of Qwen2.5-VL-72B leaves depth, patch and merge sizes to Qwen2_5_VLVisionConfig
    from oomguard.models.load import from_catalog

    awq = from_catalog("Qwen/Qwen2.5-VL-72B-Instruct-AWQ").vision
    assert awq is not None and awq.params == from_catalog("Qwen/Qwen2.5-VL-72B-Instruct").vision.params


@pytest.mark.parametrize("model_type, words", [
    ("deepseek_v4", "compressed attention"),
    ("mimo_v2_flash", "hybrid sliding-window"), ("brand_new_arch", "is not modelled yet"),
])
def test_a_model_type_not_modelled_is_refused_by_name(model_type, words):
    """A decoder whose layers oomguard has not read is refused, never planned with the dense formula."""
    from oomguard.errors import NotSupportedError
    from oomguard.models.spec import parse_config

    config = {"model_type": model_type, "architectures": ["X"], "hidden_size": 1024, "num_hidden_layers": 4,
              "num_attention_heads": 8, "vocab_size": 32000, "intermediate_size": 4096}
    with pytest.raises(NotSupportedError, match=words):
        parse_config(config, f"org/{model_type}")
