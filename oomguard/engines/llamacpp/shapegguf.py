"""A "shape-only" GGUF: the real header of a model at a given quantization, with a sparse (all-zero) data area.

llama.cpp's fit logic (`llama-fit-params`, common/fit.cpp) loads models with `no_alloc` and never reads tensor
data, so a file whose header describes, say, Llama-3.1-8B at Q4_K_M lets llama.cpp itself compute the memory
and the layer split for a full-size model, while the file takes no disk space (the data area is a hole).
The tokenizer is llama.cpp's "none" model with `llama.vocab_size` dummy tokens. Written for the `llama`
architecture (dense and Mixtral-style MoE); the tensor types come from `quant.choose_types`.

Needs the `gguf` package (a test dependency).
"""

from __future__ import annotations

import os
from pathlib import Path

from oomguard.engines.llamacpp.quant import choose_types, tensor_bytes
from oomguard.engines.llamacpp.tensors import gguf_tensors, mix_context
from oomguard.models.spec import ModelSpec

# llama_ftype numbers (include/llama.h) for general.file_type
FILE_TYPE = {"F16": 1, "Q4_0": 2, "Q8_0": 7, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18,
             "IQ4_XS": 30, "BF16": 32}


def write_shape_gguf(path: str | os.PathLike, model: ModelSpec, ftype: str = "Q4_K_M",
                     n_ctx_train: int | None = None) -> Path:
    """Write the header of `model` quantized as `ftype` and extend the file sparsely to its full size."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    if model.mla or model.qk_norm or model.norms_per_layer != 2 or model.model_type in ("gpt_oss",):
        raise ValueError(f"{model.model_id}: shape GGUFs are written for llama-architecture models only")
    path = Path(path)
    tensors = gguf_tensors(model)
    types = choose_types(tensors, ftype, mix_context(model))
    writer = GGUFWriter(str(path), "llama")
    writer.add_name(f"{model.model_id} ({ftype}, shape only)")
    writer.add_context_length(n_ctx_train or model.derived_max_model_len)
    writer.add_embedding_length(model.hidden_size)
    writer.add_block_count(model.num_layers)
    writer.add_feed_forward_length(model.moe.expert_intermediate_size if model.moe else model.intermediate_size)
    writer.add_head_count(model.num_heads)
    writer.add_head_count_kv(model.num_kv_heads)
    writer.add_key_length(model.head_dim)
    writer.add_value_length(model.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(model.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(model.vocab_size)
    if model.moe:
        writer.add_expert_count(model.moe.num_experts)
        writer.add_expert_used_count(model.moe.top_k)
    if ftype in FILE_TYPE:
        writer.add_file_type(FILE_TYPE[ftype])
    writer.add_tokenizer_model("none")
    total = 0
    for t, ggml_type in zip(tensors, types):
        nbytes = tensor_bytes(ggml_type, t.shape)
        writer.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), nbytes,
                               raw_dtype=GGMLQuantizationType[ggml_type])
        total += GGUFWriter.ggml_pad(nbytes, writer.data_alignment)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    header = fout.tell()
    data_start = GGUFWriter.ggml_pad(header, writer.data_alignment)
    fout.truncate(data_start + total)  # a hole: no blocks are written
    writer.close()
    return path
