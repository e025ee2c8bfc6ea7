"""A GGUF file read as llama.cpp reads it: the model's shapes from its metadata, the weights from its own tensors.

Metadata keys are llama.cpp's (gguf-py constants: `{arch}.block_count`, `{arch}.attention.head_count_kv`, ...);
they become the config.json fields the rest of oomguard plans from, so a GGUF plans like any checkpoint. The weight
bytes are the file's tensors themselves (exact), split by where llama.cpp places them (src/llama-model.cpp
load_tensors: token_embd on the CPU, the output layer first on the GPU, then the last repeating layers).
Needs the `gguf` package (the `gguf` extra).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from oomguard.engines.llamacpp.fit import Weights, place_tensors
from oomguard.errors import NotSupportedError, UsageError
from oomguard.models.spec import ModelSpec, QuantSpec, parse_config

# general.architecture -> the config.json model_type of the same model (convert_hf_to_gguf.py, read backwards);
# the architectures whose tensors and metadata map one to one onto a dense or MoE decoder oomguard models
HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2moe": "qwen2_moe",
                  "qwen3moe": "qwen3_moe", "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3_text",
                  "phi3": "phi3", "starcoder2": "starcoder2", "mistral3": "mistral"}


@dataclass(frozen=True)
class GgufFile:
    path: Path
    architecture: str     # general.architecture
    file_type: str        # the llama_ftype name, e.g. "Q4_K_M" ("" when the file does not say)
    model: ModelSpec      # the shapes, as the original config.json has them
    weights: Weights      # the file's own tensors by where llama.cpp places them
    base_repo: str = ""   # the repository it was converted from, where the metadata names one

    @property
    def tensor_bytes(self) -> int:
        return self.weights.file_bytes


def is_gguf(path: str) -> bool:
    return str(path).lower().endswith(".gguf")


def read_gguf(path: str) -> GgufFile:
    """Read `path`'s metadata and tensor table (no tensor data is read)."""
    try:
        from gguf import GGUFReader, LlamaFileType
    except ImportError:
        raise UsageError("reading a .gguf file needs the gguf package: pip install 'oomguard[gguf]'") from None
    file = Path(path).expanduser()
    if not file.is_file():
        raise UsageError(f"{path}: no such GGUF file")
    try:
        reader = GGUFReader(file, "r")
    except Exception as exc:   # noqa: BLE001 - gguf raises ValueError, struct errors, IndexError on bad files
        raise UsageError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    meta = {name: _value(field) for name, field in reader.fields.items() if not name.startswith("tokenizer.ggml.")}
    arch = str(meta.get("general.architecture", ""))
    if arch not in HF_MODEL_TYPES:
        raise NotSupportedError(f"{file.name}: GGUF architecture {arch or 'unknown'!r} is not modelled yet "
                                f"(modelled: {', '.join(sorted(HF_MODEL_TYPES))})")
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}
    vocab = meta.get(f"{arch}.vocab_size") or _field_length(reader, "tokenizer.ggml.tokens")
    config = _config(meta, arch, vocab, tied="output.weight" not in tensors)
    name = str(meta.get("general.name") or file.stem)
    model = parse_config(config, str(path), sum(tensors.values()), f"{file.name}: GGUF metadata of {name}")
    ftype_number = meta.get("general.file_type")
    try:
        ftype = LlamaFileType(int(ftype_number)).name.removeprefix("MOSTLY_") if ftype_number is not None else ""
    except ValueError:
        ftype = ""
    model = replace(model, quant=_as_stored(reader.tensors))
    url = str(meta.get("general.base_model.0.repo_url") or meta.get("general.source.repo_url") or "")
    base = url.split("huggingface.co/", 1)[1].strip("/") if "huggingface.co/" in url else ""
    return GgufFile(file, arch, ftype, model, _weights(tensors, model.num_layers, ftype, reader), base)


def _as_stored(tensors) -> QuantSpec:
    """Bytes per weight of the file's matrices, embedding and output layer, as vLLM's GGUF layers keep them."""
    def per_weight(selected) -> float | None:
        selected = list(selected)
        n = sum(int(t.n_elements) for t in selected)
        return sum(int(t.n_bytes) for t in selected) / n if n else None

    linear = per_weight(t for t in tensors if t.name.startswith("blk.") and len(t.shape) >= 2)
    embedding = per_weight(t for t in tensors if t.name == "token_embd.weight")
    head = per_weight(t for t in tensors if t.name == "output.weight") or embedding
    linear = linear or 2.0
    return QuantSpec("gguf", bits=max(1, round(linear * 8)), lm_head_quantized=True, measured_linear=linear,
                     measured_embedding=embedding, measured_lm_head=head)


def _value(field):
    """A metadata value as Python: a scalar, a string, or a list (per-layer arrays)."""
    from gguf import GGUFValueType

    if not field.types:
        return None
    if field.types[0] == GGUFValueType.STRING and len(field.types) == 1:
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    if field.types[0] == GGUFValueType.ARRAY:
        if len(field.data) > 4096 or (len(field.types) > 1 and field.types[1] == GGUFValueType.STRING):
            return None
        return [field.parts[i].tolist()[0] for i in field.data]
    return field.parts[field.data[0]].tolist()[0]


def _field_length(reader, name: str) -> int | None:
    field = reader.fields.get(name)
    return len(field.data) if field is not None else None


def _config(meta: dict, arch: str, vocab: int | None, tied: bool) -> dict:
    """The config.json fields the GGUF's metadata carries (per-layer arrays: their largest value)."""
    def get(key: str, default=None):
        value = meta.get(f"{arch}.{key}", default)
        return max(value) if isinstance(value, list) and value else value

    config = {
        "model_type": HF_MODEL_TYPES[arch], "architectures": [f"{arch} (GGUF)"], "torch_dtype": "bfloat16",
        "hidden_size": get("embedding_length"), "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"), "num_attention_heads": get("attention.head_count"),
        "num_key_value_heads": get("attention.head_count_kv", get("attention.head_count")),
        "head_dim": get("attention.key_length"), "vocab_size": vocab,
        "max_position_embeddings": get("context_length"), "rope_theta": get("rope.freq_base", 10000.0),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6), "tie_word_embeddings": tied,
    }
    if get("attention.sliding_window"):
        config["sliding_window"] = get("attention.sliding_window")
    experts = get("expert_count")
    if experts:
        config.update(num_local_experts=experts, num_experts=experts, num_experts_per_tok=get("expert_used_count"),
                      moe_intermediate_size=get("expert_feed_forward_length", get("feed_forward_length")))
        if get("expert_shared_feed_forward_length"):
            config["shared_expert_intermediate_size"] = get("expert_shared_feed_forward_length")
    return {k: v for k, v in config.items() if v is not None}


def _weights(tensors: dict[str, int], num_layers: int, ftype: str, reader) -> Weights:
    def layer(name: str) -> int | None:
        return int(name.split(".", 2)[1]) if name.startswith("blk.") else None

    return place_tensors(((t.name, layer(t.name), t.tensor_type.name, int(t.n_bytes), int(t.n_elements))
                          for t in reader.tensors), num_layers, ftype or "file", "output.weight" not in tensors)
