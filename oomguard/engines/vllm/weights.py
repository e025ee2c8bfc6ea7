"""Weight bytes per GPU as vLLM allocates them (measured by DeviceMemoryProfiler in GPUModelRunner.load_model).

Sharding mirrors vllm/model_executor/layers/linear.py (column/row parallel), vocab_parallel_embedding.py
(vocabulary padded to 64, split over TP), fused_moe/layer.py (experts split over TP, or over EP with full
width) and distributed/utils.py:get_pp_indices (pipeline stages). Quantized linears store
QuantSpec.bytes_per_param(); embeddings, norms and routers stay in the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.models.spec import ModelSpec
from oomguard.units import cdiv

VOCAB_PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    pp: int = 1
    ep: bool = False  # --enable-expert-parallel: experts split over tp*dp ranks at full width

    def stage_layers(self, num_layers: int, stage: int) -> range:
        """vllm/distributed/utils.py:get_pp_indices: remainder layers go to the stages before the last."""
        per, rem = divmod(num_layers, self.pp)
        sizes = [per] * self.pp
        for i in range(rem):
            sizes[-2 - i if self.pp > 1 else 0] += 1
        start = sum(sizes[:stage])
        return range(start, start + sizes[stage])


def padded_vocab(vocab: int) -> int:
    return cdiv(vocab, VOCAB_PADDING) * VOCAB_PADDING


def _linear(model: ModelSpec, name: str, params: int, act_bytes: int) -> float:
    quant = model.quant
    if quant and quant.bits < 16 and quant.quantizes(name):
        return params * quant.bytes_per_param()
    return params * act_bytes


def layer_bytes(model: ModelSpec, layer: int, par: Parallel, act_bytes: int) -> float:
    """Bytes of one decoder layer on one TP rank."""
    h, tp = model.hidden_size, par.tp
    total = model.norms_per_layer * h * act_bytes
    if model.mla:
        m = model.mla
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        heads = model.num_heads // tp
        if m.q_lora_rank:
            total += _linear(model, "q_a_proj", h * m.q_lora_rank, act_bytes) + m.q_lora_rank * act_bytes
            total += _linear(model, "q_b_proj", m.q_lora_rank * heads * qk_head, act_bytes)
        else:
            total += _linear(model, "q_proj", h * heads * qk_head, act_bytes)
        total += _linear(model, "kv_a_proj_with_mqa", h * (m.kv_lora_rank + m.qk_rope_head_dim), act_bytes)
        total += m.kv_lora_rank * act_bytes
        kv_b = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        total += _linear(model, "kv_b_proj", kv_b, act_bytes)
        total += kv_b * act_bytes  # W_UK_T and W_UV, absorbed copies made after loading (mla attention backends)
        total += _linear(model, "o_proj", heads * m.v_head_dim * h, act_bytes)
    else:
        hd = model.head_dim
        q_heads = model.num_heads // tp
        kv_heads = max(1, model.num_kv_heads // tp)  # replicated when tp > kv heads (QKVParallelLinear)
        total += _linear(model, "qkv_proj", h * (q_heads + 2 * kv_heads) * hd, act_bytes)
        total += _linear(model, "o_proj", q_heads * hd * h, act_bytes)
        if model.qkv_bias:
            total += (q_heads + 2 * kv_heads) * hd * act_bytes
        if model.o_bias:
            total += h * act_bytes
        if model.qk_norm:
            total += 2 * hd * act_bytes
        if model.model_type == "gpt_oss":
            total += q_heads * 4  # attention sinks, fp32
    moe = model.moe
    if moe and moe.moe_layers[layer]:
        inter = moe.expert_intermediate_size
        experts_here, width = (cdiv(moe.num_experts, tp), inter) if par.ep else (moe.num_experts, inter // tp)
        total += _linear(model, "experts", experts_here * 3 * h * width, act_bytes)
        if model.model_type == "gpt_oss":
            total += experts_here * (2 * width + h) * act_bytes  # expert biases
        total += h * moe.num_experts * act_bytes + (moe.num_experts * act_bytes if moe.router_bias else 0)
        if moe.shared_intermediate_size:
            total += _linear(model, "shared_expert", 3 * h * moe.shared_intermediate_size // tp, act_bytes)
        if moe.shared_expert_gate:
            total += h * act_bytes
    else:
        inter = model.intermediate_size
        if model.model_type in ("phi", "gpt2", "starcoder2"):  # fc1/fc2 with biases, no gate
            total += _linear(model, "mlp", 2 * h * inter // tp, act_bytes) + (inter // tp + h) * act_bytes
        else:
            total += _linear(model, "mlp", 3 * h * inter // tp, act_bytes)
    return total


def stage_weight_bytes(model: ModelSpec, par: Parallel, stage: int, act_bytes: int) -> int:
    """Weights held by one GPU of pipeline stage `stage` (every TP rank of a stage holds the same amount)."""
    h = model.hidden_size
    first, last = stage == 0, stage == par.pp - 1
    vocab_shard = padded_vocab(model.vocab_size) // par.tp * h
    total = 0.0
    if first or (last and model.tie_word_embeddings):
        total += vocab_shard * act_bytes  # VocabParallelEmbedding (never quantized)
    if last:
        if not model.tie_word_embeddings:
            head_quantized = model.quant is not None and model.quant.lm_head_quantized
            total += vocab_shard * (model.quant.bytes_per_param() if head_quantized else act_bytes)
        total += h * act_bytes  # final norm
    for layer in par.stage_layers(model.num_layers, stage):
        total += layer_bytes(model, layer, par, act_bytes)
    # RotaryEmbedding.cos_sin_cache [max_position, rotary_dim] in the model dtype, one per distinct RoPE
    total += sum(positions * model.rotary_dim * act_bytes for positions in model.rope_cache_positions)
    if first and model.vision:
        total += model.vision.params * act_bytes / par.tp
    return int(total)
