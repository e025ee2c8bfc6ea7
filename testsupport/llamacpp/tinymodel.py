"""A tiny random-weight llama-architecture GGUF for tests against a real llama-server.

2 layers, hidden 64, 4 heads, 2 KV heads, FFN 128, trained context 4096, F16 matrices (about 4.5 MB), with the
tokenizer (32,000-token SentencePiece vocabulary and its KV fields) copied from llama.cpp's
`models/ggml-vocab-llama-spm.gguf`. Deterministic: the same seed writes the same bytes.

The output projection has large random rows (logits with a standard deviation of about 8, so sampling is
nearly greedy) and all-zero rows for the control, unknown and byte tokens: the model practically never emits
end-of-sequence, so a request generates exactly its `max_tokens` (pass `"ignore_eos": true` to be certain),
and its text is made of whole vocabulary pieces (no stray UTF-8 bytes).

    python -m testsupport.llamacpp.tinymodel OUT.gguf [--vocab PATH]
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# llama.cpp token types (llama_token_type / gguf TokenType)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class TinyConfig:
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    seed: int = 0
    logit_scale: float = 1.0  # std of the output rows; logits std ~ logit_scale * sqrt(n_embd)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of every layer for one token (llama.cpp's default f16 KV cache)."""
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * dtype_bytes


DEFAULT = TinyConfig()


def _read_tokenizer(vocab: Path) -> list[tuple[str, object, object, object]]:
    """(key, value, value type, array sub-type) of every `tokenizer.*` field of a GGUF file.

    Reads the raw field parts so it works across gguf-py versions (ReaderField.contents() is recent)."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(vocab))
    out = []
    for key, fld in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        main = fld.types[0]
        if main == GGUFValueType.ARRAY:
            sub = fld.types[-1]
            if sub == GGUFValueType.STRING:
                value = [bytes(fld.parts[i]).decode("utf-8") for i in fld.data]
            else:
                value = [fld.parts[i][0].item() for i in fld.data]
            out.append((key, value, main, sub))
        elif main == GGUFValueType.STRING:
            out.append((key, bytes(fld.parts[fld.data[0]]).decode("utf-8"), main, None))
        else:
            value = fld.parts[fld.data[0]][0].item()
            if main == GGUFValueType.BOOL:
                value = bool(value)
            out.append((key, value, main, None))
    return out


def write_tiny_gguf(path: str | os.PathLike, vocab: str | os.PathLike, config: TinyConfig = DEFAULT) -> Path:
    """Write the tiny model to `path` (atomically) and return it."""
    from gguf import GGUFWriter

    path, vocab = Path(path), Path(vocab)
    tokenizer = _read_tokenizer(vocab)
    fields = {key: value for key, value, _, _ in tokenizer}
    tokens = fields.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{vocab} has no tokenizer.ggml.tokens")
    n_vocab = len(tokens)
    token_types = fields.get("tokenizer.ggml.token_type") or [_NORMAL] * n_vocab

    c = config
    rng = np.random.default_rng(c.seed)

    def mat(rows: int, cols: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    tmp = path.with_name(path.name + ".tmp")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_name("oomguard-tiny-llama")
    writer.add_context_length(c.n_ctx_train)
    writer.add_embedding_length(c.n_embd)
    writer.add_block_count(c.n_layer)
    writer.add_feed_forward_length(c.n_ff)
    writer.add_head_count(c.n_head)
    writer.add_head_count_kv(c.n_head_kv)
    writer.add_layer_norm_rms_eps(c.rms_eps)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(1)  # LLAMA_FTYPE_MOSTLY_F16
    for key, value, vtype, sub in tokenizer:
        writer.add_key_value(key, value, vtype, sub)

    writer.add_tensor("token_embd.weight", mat(n_vocab, c.n_embd, 1.0))
    for i in range(c.n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(c.n_embd, dtype=np.float32))
        writer.add_tensor(p + "attn_q.weight", mat(c.n_embd, c.n_embd))
        writer.add_tensor(p + "attn_k.weight", mat(c.n_head_kv * c.head_dim, c.n_embd))
        writer.add_tensor(p + "attn_v.weight", mat(c.n_head_kv * c.head_dim, c.n_embd))
        writer.add_tensor(p + "attn_output.weight", mat(c.n_embd, c.n_embd))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(c.n_embd, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", mat(c.n_ff, c.n_embd))
        writer.add_tensor(p + "ffn_up.weight", mat(c.n_ff, c.n_embd))
        writer.add_tensor(p + "ffn_down.weight", mat(c.n_embd, c.n_ff))
    writer.add_tensor("output_norm.weight", np.ones(c.n_embd, dtype=np.float32))
    output = rng.standard_normal((n_vocab, c.n_embd), dtype=np.float32) * c.logit_scale
    never = np.array([t in (_UNKNOWN, _CONTROL, _BYTE, _UNUSED) for t in token_types[:n_vocab]])
    output[never] = 0.0  # EOS/BOS/UNK and raw bytes: logit 0, far below the ~+30 of the best normal token
    writer.add_tensor("output.weight", output.astype(np.float16))

    path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def config_digest(config: TinyConfig = DEFAULT) -> str:
    return hashlib.sha256(repr(sorted(asdict(config).items())).encode()).hexdigest()[:12]


def ensure_tiny_gguf(vocab: str | os.PathLike, directory: str | os.PathLike | None = None,
                     config: TinyConfig = DEFAULT) -> Path:
    """The tiny model, cached beside the vocabulary (or in `directory`) under a name keyed by its config."""
    vocab = Path(vocab)
    directory = Path(directory) if directory is not None else vocab.parent
    path = directory / f"tiny-llama-{config_digest(config)}.gguf"
    if not path.is_file():
        write_tiny_gguf(path, vocab, config)
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m testsupport.llamacpp.tinymodel",
                                     description="Write the tiny random-weight llama GGUF used by the tests.")
    parser.add_argument("out", help="output .gguf path")
    parser.add_argument("--vocab", help="vocabulary GGUF (default: the cached ggml-vocab-llama-spm.gguf, built if needed)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    vocab = args.vocab
    if vocab is None:
        from testsupport.llamacpp.build import ensure_llama_server, vocab_path
        ensure_llama_server()
        vocab = vocab_path()
    print(write_tiny_gguf(args.out, vocab, TinyConfig(seed=args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
