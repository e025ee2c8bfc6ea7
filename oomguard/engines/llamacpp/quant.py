"""GGUF tensor types and llama.cpp's quantization mixes (which tensor gets which type). Pure.

Block sizes and bytes per block are ggml's type traits (ggml/src/ggml.c `type_traits`, the block structs of
ggml/src/ggml-common.h) in the llama.cpp vendored by llama-cpp-python 0.3.36. The per-tensor choice for a
mix such as Q4_K_M mirrors src/llama-quant.cpp (`llama_ftype_get_default_type`, `llama_tensor_get_type_impl`,
`tensor_type_fallback`, `tensor_allows_quantization`) of the same tree, for quantization without an imatrix.
"""

from __future__ import annotations

from dataclasses import dataclass

# name -> (elements per block, bytes per block): ggml.c type_traits / sizeof(block_*) in ggml-common.h
GGML_TYPES: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
    "IQ4_NL": (32, 18), "IQ4_XS": (256, 136), "IQ3_S": (256, 110), "IQ3_XXS": (256, 98),
    "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74), "IQ2_S": (256, 82), "MXFP4": (32, 17),
}
_FLOAT = {"F32", "F16", "BF16"}


def bits_per_weight(ggml_type: str) -> float:
    block, size = GGML_TYPES[ggml_type]
    return 8 * size / block


def row_bytes(ggml_type: str, n: int) -> int:
    """ggml_row_size: bytes of `n` consecutive elements (n a multiple of the block size)."""
    block, size = GGML_TYPES[ggml_type]
    return size * (n // block) if n % block == 0 else size * -(-n // block)


def tensor_bytes(ggml_type: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor whose ggml shape is `shape` (ne[0] first: the row length)."""
    rows = 1
    for n in shape[1:]:
        rows *= n
    return row_bytes(ggml_type, shape[0]) * rows


# llama_ftype -> the default tensor type of the mix (llama-quant.cpp: llama_ftype_get_default_type)
FTYPES: dict[str, str] = {
    "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q6_K": "Q6_K", "Q5_K_M": "Q5_K", "Q5_K_S": "Q5_K",
    "Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q4_0": "Q4_0", "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL",
    "Q3_K_M": "Q3_K", "Q3_K_L": "Q3_K", "Q3_K_S": "Q3_K", "Q2_K": "Q2_K",
}
# Best quality first: the order a plan walks down when memory is short
QUALITY_LADDER = ("BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "Q2_K")

# tensor_type_fallback: 256-block types on a row length that is not a multiple of 256
_FALLBACK = {"IQ4_XS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ3_XXS": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL",
             "IQ2_S": "IQ4_NL", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


@dataclass(frozen=True)
class Tensor:
    """One GGUF tensor as llama.cpp names and shapes it (ggml order: shape[0] is the row length)."""

    name: str
    shape: tuple[int, ...]
    layer: int | None              # decoder layer, None for token embeddings, output norm and output
    source_type: str = "F16"       # type in the unquantized (converted) GGUF: F32 for norms, biases, routers

    @property
    def category(self) -> str:
        """llama-quant.cpp tensor_get_category."""
        n = self.name
        if n == "output.weight":
            return "output"
        if n == "token_embd.weight":
            return "token_embd"
        for key, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"),
                         ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                         ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                         ("ffn_down", "ffn_down")):
            if key in n:
                return cat
        return "other"

    def quantizable(self) -> bool:
        """llama-quant.cpp tensor_allows_quantization (the parts that apply to text decoders)."""
        n = self.name
        return (len(self.shape) >= 2 and n.endswith("weight") and "_norm.weight" not in n
                and "ffn_gate_inp.weight" not in n)


@dataclass(frozen=True)
class MixContext:
    """What llama_tensor_get_type_impl looks at besides the tensor: model-wide facts."""

    n_layer: int
    n_gqa: int                     # n_head / n_head_kv
    n_expert: int                  # 0 for dense
    is_70b: bool = False           # LLM_TYPE_70B: attn_v one step up
    tied_embeddings: bool = False  # no output.weight: token_embd is quantized like the output


def _more_bits(i: int, n: int) -> bool:
    # llama-quant.cpp: use_more_bits
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def choose_types(tensors: list[Tensor], ftype: str, ctx: MixContext) -> list[str]:
    """The ggml type llama-quantize gives each tensor for `ftype` (llama-quant.cpp llama_tensor_get_type)."""
    if ftype not in FTYPES:
        raise ValueError(f"unknown GGUF quantization {ftype!r}; known: {', '.join(FTYPES)}")
    default = FTYPES[ftype]
    n_attn_v = sum(1 for t in tensors if t.category in ("attn_v", "attn_qkv", "attn_kv_b"))
    i_attn_v = 0
    out = []
    for t in tensors:
        if not t.quantizable():
            out.append(t.source_type)
            continue
        if default in _FLOAT:  # F16 / BF16 files: every matrix in that type
            out.append(default)
            continue
        new, cat = default, t.category
        layer = t.layer if t.layer is not None else 0
        if cat == "output" or (ctx.tied_embeddings and cat == "token_embd"):
            if t.shape[0] % GGML_TYPES[new][0] != 0:
                new = "Q8_0"
            elif new != "Q8_0":
                new = "Q6_K"
        elif cat == "token_embd":
            pass  # the mix's default type for the K-quant and legacy mixes listed here
        elif cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            if ftype == "Q2_K":
                new = "Q4_K" if ctx.n_gqa >= 4 else "Q3_K"
            elif ftype == "Q3_K_M":
                new = "Q5_K" if i_attn_v < 2 else "Q4_K"
            elif ftype == "Q3_K_L":
                new = "Q5_K"
            elif ftype in ("IQ4_NL", "IQ4_XS") and ctx.n_gqa >= 4:
                new = "Q5_K"
            elif ftype in ("Q4_K_M", "Q5_K_M") and _more_bits(i_attn_v, n_attn_v):
                new = "Q6_K"
            elif ftype == "Q4_K_S" and i_attn_v < 4:
                new = "Q5_K"
            if ctx.is_70b and new in ("Q3_K", "Q4_K"):
                new = "Q5_K"
            if ctx.n_expert == 8:
                new = "Q8_0"
            i_attn_v += 1
        elif cat == "attn_k":
            if ctx.n_expert == 8:
                new = "Q8_0"
        elif cat == "ffn_down":
            i, n = layer, ctx.n_layer
            if ftype == "Q2_K":
                new = "Q3_K"
            elif ftype == "Q3_K_M":
                new = "Q5_K" if i < n // 16 else "Q4_K"
            elif ftype == "Q3_K_L":
                new = "Q5_K"
            elif ftype == "Q4_K_M":
                if _more_bits(i, n):
                    new = "Q6_K"
            elif i < n // 8 and ftype in ("IQ4_NL", "IQ4_XS"):
                new = "Q5_K"
            elif ftype == "Q5_K_M" and _more_bits(i, n):
                new = "Q6_K"
            elif ftype == "Q4_K_S" and i < n // 8:
                new = "Q5_K"
        elif cat == "attn_output":
            if ctx.n_expert == 8:
                if ftype in ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS"):
                    new = "Q5_K"
            elif ftype == "Q2_K":
                new = "Q3_K"
            elif ftype == "Q3_K_M":
                new = "Q4_K"
            elif ftype == "Q3_K_L":
                new = "Q5_K"
        # tensor_type_fallback: the row length must be a multiple of the type's block
        if t.shape[0] % GGML_TYPES[new][0] != 0:
            new = _FALLBACK.get(new, new)
            if t.shape[0] % GGML_TYPES[new][0] != 0:
                new = "F16"
        out.append(new)
    return out
