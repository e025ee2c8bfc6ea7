"""The GGUF tensors of a model, as llama.cpp's converter (convert_hf_to_gguf.py) lays them out. Pure.

Names and ggml shapes (row length first) follow llama.cpp's tensor names (gguf-py constants: token_embd,
blk.N.attn_q, ffn_gate_exps, ...). Norms, biases and MoE routers are F32 in converted files; matrices F16.
Covered: llama-style dense decoders (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, DeepSeek-distills), their
MoE variants (Mixtral, Qwen-MoE, DeepSeek V2/V3 with MLA, gpt-oss, Llama 4) at the level of tensor shapes.
"""

from __future__ import annotations

from oomguard.engines.llamacpp.quant import MixContext, Tensor
from oomguard.models.spec import ModelSpec

_GATED_FREE = {"phi", "gpt2", "gpt_bigcode", "starcoder2", "falcon", "opt"}  # plain (non-gated) MLP


def tied_output(model: ModelSpec) -> bool:
    """No output.weight in the GGUF: the output layer reuses token_embd. Gemma always (llama.cpp's gemma*
    models load no output tensor), others when config.json ties the embeddings."""
    return model.tie_word_embeddings or model.model_type.startswith("gemma")


def gguf_tensors(model: ModelSpec) -> list[Tensor]:
    """Every tensor of the converted (unquantized) GGUF, in file order."""
    h = model.hidden_size
    out = [Tensor("token_embd.weight", (h, model.vocab_size), None)]
    norm = lambda name, n, i: Tensor(name, (n,), i, "F32")  # noqa: E731
    for i in range(model.num_layers):
        p = f"blk.{i}."
        out.append(norm(p + "attn_norm.weight", h, i))
        if model.mla:
            m = model.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                out += [Tensor(p + "attn_q_a.weight", (h, m.q_lora_rank), i),
                        norm(p + "attn_q_a_norm.weight", m.q_lora_rank, i),
                        Tensor(p + "attn_q_b.weight", (m.q_lora_rank, model.num_heads * qk), i)]
            else:
                out.append(Tensor(p + "attn_q.weight", (h, model.num_heads * qk), i))
            out += [Tensor(p + "attn_kv_a_mqa.weight", (h, m.kv_lora_rank + m.qk_rope_head_dim), i),
                    norm(p + "attn_kv_a_norm.weight", m.kv_lora_rank, i),
                    Tensor(p + "attn_kv_b.weight", (m.kv_lora_rank, model.num_heads * (m.qk_nope_head_dim + m.v_head_dim)), i),
                    Tensor(p + "attn_output.weight", (model.num_heads * m.v_head_dim, h), i)]
        else:
            q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
            out += [Tensor(p + "attn_q.weight", (h, q), i), Tensor(p + "attn_k.weight", (h, kv), i),
                    Tensor(p + "attn_v.weight", (h, kv), i)]
            if model.qkv_bias:
                out += [norm(p + "attn_q.bias", q, i), norm(p + "attn_k.bias", kv, i), norm(p + "attn_v.bias", kv, i)]
            if model.qk_norm:
                out += [norm(p + "attn_q_norm.weight", model.head_dim, i), norm(p + "attn_k_norm.weight", model.head_dim, i)]
            out.append(Tensor(p + "attn_output.weight", (q, h), i))
            if model.o_bias:
                out.append(norm(p + "attn_output.bias", h, i))
            if model.model_type == "gpt_oss":
                out.append(norm(p + "attn_sinks.weight", model.num_heads, i))
        if model.norms_per_layer >= 4:  # Gemma 2/3: post-attention and post-FFN norms
            out.append(norm(p + "post_attention_norm.weight", h, i))
        out.append(norm(p + "ffn_norm.weight", h, i))
        moe = model.moe
        if moe and moe.moe_layers[i]:
            e, ff = moe.num_experts, moe.expert_intermediate_size
            out.append(Tensor(p + "ffn_gate_inp.weight", (h, e), i, "F32"))
            if moe.router_bias:
                out.append(norm(p + "ffn_gate_inp.bias", e, i))
            out += [Tensor(p + "ffn_gate_exps.weight", (h, ff, e), i), Tensor(p + "ffn_up_exps.weight", (h, ff, e), i),
                    Tensor(p + "ffn_down_exps.weight", (ff, h, e), i)]
            if moe.shared_intermediate_size:
                sh = moe.shared_intermediate_size
                if moe.shared_expert_gate:
                    out.append(norm(p + "ffn_gate_inp_shexp.weight", h, i))
                out += [Tensor(p + "ffn_gate_shexp.weight", (h, sh), i), Tensor(p + "ffn_up_shexp.weight", (h, sh), i),
                        Tensor(p + "ffn_down_shexp.weight", (sh, h), i)]
        elif model.model_type in _GATED_FREE:
            ff = model.intermediate_size
            out += [Tensor(p + "ffn_up.weight", (h, ff), i), Tensor(p + "ffn_down.weight", (ff, h), i)]
        else:
            ff = model.intermediate_size
            out += [Tensor(p + "ffn_gate.weight", (h, ff), i), Tensor(p + "ffn_up.weight", (h, ff), i),
                    Tensor(p + "ffn_down.weight", (ff, h), i)]
        if model.norms_per_layer >= 4:
            out.append(norm(p + "post_ffw_norm.weight", h, i))
    out.append(norm("output_norm.weight", h, None))
    if not tied_output(model):
        out.append(Tensor("output.weight", (h, model.vocab_size), None))
    return out


def mix_context(model: ModelSpec) -> MixContext:
    return MixContext(
        n_layer=model.num_layers, n_gqa=max(1, model.num_heads // max(1, model.num_kv_heads)),
        n_expert=model.moe.num_experts if model.moe else 0,
        # llama.cpp's LLM_TYPE_70B (src/models/llama.cpp load_hparams: 80 layers)
        is_70b=model.model_type == "llama" and model.num_layers == 80,
        tied_embeddings=tied_output(model))
