"""How many parameters a model has, and how many each token passes through (for roofline speed estimates)."""

from __future__ import annotations

from oomguard.models.spec import ModelSpec


def parameter_counts(model: ModelSpec) -> tuple[float, float, float]:
    """(parameters stored, parameters each token multiplies through, share of the stored ones in routed experts),
    from config.json's shapes. The token path counts the output projection once and no embedding lookup."""
    h = model.hidden_size
    attention = h * model.num_heads * model.head_dim * 2 + 2 * h * model.num_kv_heads * model.head_dim
    if model.mla:
        m = model.mla
        q_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank * model.num_heads * q_head) if m.q_lora_rank else h * model.num_heads * q_head
        attention = q + h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * model.num_heads * (
            m.qk_nope_head_dim + m.v_head_dim) + model.num_heads * m.v_head_dim * h
    total = active = experts = 0.0
    for layer in range(model.num_layers):
        total += attention
        active += attention
        if model.moe and model.moe.moe_layers[layer]:
            moe = model.moe
            one = 3 * h * moe.expert_intermediate_size
            shared = 3 * h * moe.shared_intermediate_size + h * moe.num_experts
            total += one * moe.num_experts + shared
            active += one * moe.top_k + shared
            experts += one * moe.num_experts
        else:
            total += 3 * h * model.intermediate_size
            active += 3 * h * model.intermediate_size
    total += model.vocab_size * h * (1 if model.tie_word_embeddings else 2)
    return total, active + model.vocab_size * h, experts / total
