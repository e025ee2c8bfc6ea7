"""config.json fields that transformers' config classes supply by default are part of the model."""

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


def test_gemma2_ties_embeddings_when_the_config_is_silent():
    import json
    from pathlib import Path

    entry = json.loads((Path(__file__).resolve().parents[1] / "oomguard" / "models" / "catalog" /
                        "google--gemma-2-9b-it.json").read_text())
    assert "tie_word_embeddings" not in entry["config"]      # as published
    assert parse_config(entry["config"], entry["id"]).tie_word_embeddings
    llama = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "vocab_size": 100}
    assert not parse_config(llama, "x/llama").tie_word_embeddings   # LlamaConfig's default is False
