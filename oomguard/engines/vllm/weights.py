"""Weight bytes per GPU as vLLM allocates them (measured by DeviceMemoryProfiler in GPUModelRunner.load_model).

Sharding mirrors vllm/model_executor/layers/linear.py (column/row parallel), vocab_parallel_embedding.py
(vocabulary padded to 64, split over TP), fused_moe/layer.py (experts split over TP, or over EP with full
width) and distributed/utils.py:get_pp_indices (pipeline stages). Quantized linears store
QuantSpec.bytes_per_param(); embeddings, norms and routers stay in the model dtype. MXFP4 experts are laid out
for the MoE kernel vLLM picks for the GPU and version (mxfp4_expert_bytes), padding included.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import Version
from oomguard.models.spec import ModelSpec
from oomguard.units import cdiv

VOCAB_PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    pp: int = 1
    ep: bool = False  # --enable-expert-parallel: experts split over tp*dp ranks at full width
    dp: int = 1       # data parallel ranks: replicas, but one expert group under EP (FusedMoEParallelConfig.make)

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


def _up(n: int, multiple: int) -> int:
    return cdiv(n, multiple) * multiple


def mxfp4_backend(compute_capability: tuple[int, int] | None, version: Version | None) -> str | None:
    """The MXFP4 MoE kernel vLLM picks on a CUDA GPU with the default environment; None: not known (no padding).

    FlashInfer TRTLLM on data-centre Blackwell; OpenAI's Triton matmul_ogs on Hopper once the wheel bundles
    triton_kernels (vllm/third_party, from 0.12; before, only when installed by hand); Marlin everywhere else.
    """
    # 0.10: quantization/mxfp4.py Mxfp4MoEMethod._should_use_marlin; 0.11/0.12: mxfp4.py get_mxfp4_backend;
    # 0.19: fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend
    if compute_capability is None or version is None:
        return None
    if compute_capability[0] == 10:
        return "flashinfer_trtllm"
    if compute_capability[0] == 9 and release(version).mxfp4_triton_on_hopper:
        return "triton"
    return "marlin"


def mxfp4_expert_bytes(backend: str | None, experts: int, hidden: int, inter: int, bias: bool = True) -> int:
    """One MoE layer's MXFP4 experts on one rank (`inter` = intermediate size on this rank), with their biases.

    Weights are uint8 pairs of e2m1 values with one e8m0 scale per 32; vLLM pads the sizes for its kernel.
    """
    if backend == "marlin":  # create_weights: Marlin needs n % 256 == 0 and k % 128 == 0
        # mxfp4.py Mxfp4MoEMethod.create_weights (0.10/0.11) / oracle mxfp4_round_up_hidden_size_and_intermediate_size
        inter, hidden = _up(inter, 128), _up(hidden, 256)
        bias_bytes = 2                                  # marlin_utils_fp4 permute_bias keeps the model dtype
    elif backend == "flashinfer_trtllm":  # same functions, TRTLLM branch: both rounded to 256, biases fp32
        inter, hidden = _up(inter, 256), _up(hidden, 256)
        bias_bytes = 4
    elif backend == "triton":
        inter = _up(inter, 64)  # same functions, default CUDA branch
        # quantization/utils/mxfp4_utils.py _swizzle_mxfp4 -> triton_kernels HopperMXValueLayout.swizzle_data pads
        # both uint8 dims of the transposed weight to 64; HopperMXScaleLayout pads rows to 256 and columns to 2.
        # The loaded uint8 scales stay registered on the layer beside the swizzled copies; biases become fp32.
        values = experts * (_up(hidden // 2, 64) * _up(2 * inter, 64) + _up(inter // 2, 64) * _up(hidden, 64))
        loaded_scales = experts * (2 * inter * (hidden // 32) + hidden * (inter // 32))
        swizzled_scales = experts * (_up(2 * inter, 256) * _up(hidden // 32, 2)
                                     + _up(hidden, 256) * _up(inter // 32, 2))
        return values + loaded_scales + swizzled_scales + (experts * (2 * inter + hidden) * 4 if bias else 0)
    else:  # the checkpoint's own layout
        bias_bytes = 2
    params = experts * 3 * hidden * inter
    return params // 2 + params // 32 + (experts * (2 * inter + hidden) * bias_bytes if bias else 0)


def _linear(model: ModelSpec, name: str, params: int, act_bytes: int) -> float:
    quant = model.quant
    if quant and quant.bits < 16 and quant.quantizes(name):
        return params * quant.bytes_per_param()
    return params * act_bytes


def _gated_delta_net_bytes(model: ModelSpec, tp: int, act_bytes: int) -> float:
    """One Gated DeltaNet layer on one TP rank (layers/mamba/gdn_linear_attn.py GatedDeltaNetAttention):
    in_proj_qkvz [2k + 2v, H], in_proj_ba [2 nv, H], conv1d [2k + v, K], dt_bias and A_log [nv] (fp32),
    the gated norm [dv], out_proj [H, v]; k = key heads x key dim, v = value heads x value dim."""
    g, h = model.recurrent, model.hidden_size
    k, v = g.num_key_heads * g.key_head_dim, g.num_value_heads * g.value_head_dim
    total = _linear(model, "in_proj_qkvz", (2 * k + 2 * v) // tp * h, act_bytes)
    total += _linear(model, "in_proj_ba", 2 * g.num_value_heads // tp * h, act_bytes)
    total += (2 * k + v) // tp * g.conv_kernel * act_bytes
    total += 2 * g.num_value_heads // tp * 4 + g.value_head_dim * act_bytes
    return total + _linear(model, "out_proj", h * v // tp, act_bytes)


def _mamba2_mixer_bytes(model: ModelSpec, tp: int, act_bytes: int) -> float:
    """One Mamba2 mixer on one TP rank (layers/mamba/mamba_mixer2.py MambaMixer2): in_proj [2I + 2GN + heads, H],
    conv1d [I + 2GN, K] with its bias, A (fp32), D and dt_bias [heads], the gated norm [I], out_proj [H, I];
    G the B/C groups on the rank (replicated when TP does not divide them)."""
    m, h = model.recurrent, model.hidden_size
    inter, groups_state = m.intermediate_size // tp, m.groups(tp) * m.state_size // tp
    heads = m.num_heads // tp
    total = _linear(model, "in_proj", (2 * inter + 2 * groups_state + heads) * h, act_bytes)
    conv_dim = inter + 2 * groups_state
    total += conv_dim * m.conv_kernel * act_bytes + (conv_dim * act_bytes if m.conv_bias else 0)
    total += heads * 4 + 2 * heads * act_bytes + inter * act_bytes
    return total + _linear(model, "out_proj", h * inter, act_bytes)


def layer_bytes(model: ModelSpec, layer: int, par: Parallel, act_bytes: int, mxfp4: str | None = None) -> float:
    """Bytes of one decoder layer on one TP rank; `mxfp4` is the MXFP4 MoE kernel (mxfp4_backend)."""
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
    elif model.layer_attention[layer] == "linear":
        total += _gated_delta_net_bytes(model, tp, act_bytes)
    elif model.layer_attention[layer] == "mamba":
        total += _mamba2_mixer_bytes(model, tp, act_bytes)
    elif model.layer_attention[layer] == "none":
        pass
    else:
        hd = model.head_dim
        q_heads = model.num_heads // tp
        kv_heads = max(1, model.num_kv_heads // tp)  # replicated when tp > kv heads (QKVParallelLinear)
        gate = q_heads if model.attn_output_gate else 0  # qwen3_next.py Qwen3NextAttention: q and its gate
        total += _linear(model, "qkv_proj", h * (q_heads + gate + 2 * kv_heads) * hd, act_bytes)
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
    ffn = model.layer_ffn[layer] if model.layer_ffn else "moe" if moe and moe.moe_layers[layer] else "mlp"
    mats = 3 if model.gated_mlp else 2   # gate, up, down; or up, down (relu2)
    if ffn == "moe":
        inter = moe.expert_intermediate_size
        experts_here, width = (cdiv(moe.num_experts, tp * par.dp), inter) if par.ep else (moe.num_experts, inter // tp)
        if model.quant and model.quant.method == "mxfp4" and model.quant.quantizes("experts"):
            total += mxfp4_expert_bytes(mxfp4, experts_here, h, width, bias=model.model_type == "gpt_oss")
        else:
            total += _linear(model, "experts", experts_here * mats * h * width, act_bytes)
            if model.model_type == "gpt_oss":
                total += experts_here * (2 * width + h) * act_bytes  # expert biases
        total += h * moe.num_experts * act_bytes + (moe.num_experts * act_bytes if moe.router_bias else 0)
        if moe.shared_intermediate_size:
            total += _linear(model, "shared_expert", mats * h * moe.shared_intermediate_size // tp, act_bytes)
        if moe.shared_expert_gate:
            total += h * act_bytes
    elif ffn == "mlp":
        inter = model.intermediate_size
        if model.model_type in ("phi", "gpt2", "starcoder2"):  # fc1/fc2 with biases, no gate
            total += _linear(model, "mlp", 2 * h * inter // tp, act_bytes) + (inter // tp + h) * act_bytes
        else:
            total += _linear(model, "mlp", mats * h * inter // tp, act_bytes)
    return total


def stage_weight_bytes(model: ModelSpec, par: Parallel, stage: int, act_bytes: int,
                       compute_capability: tuple[int, int] | None = None, version: Version | None = None) -> int:
    """Weights held by one GPU of pipeline stage `stage` (every TP rank of a stage holds the same amount).

    The GPU's compute capability and the vLLM version pick kernel-specific layouts (MXFP4 padding); without
    them the checkpoint's own layout is counted."""
    mxfp4 = mxfp4_backend(compute_capability, version)
    h = model.hidden_size
    first, last = stage == 0, stage == par.pp - 1
    vocab_shard = padded_vocab(model.vocab_size) // par.tp * h
    total = 0.0
    quant = model.quant
    embedding = quant.measured_embedding if quant and quant.measured_embedding else act_bytes
    if first or (last and model.tie_word_embeddings):
        total += vocab_shard * embedding  # VocabParallelEmbedding (unquantized but for GGUF's)
    if last:
        if not model.tie_word_embeddings:
            head = quant.measured_lm_head or quant.bytes_per_param() if quant and quant.lm_head_quantized else act_bytes
            total += vocab_shard * head
        total += h * act_bytes  # final norm
    for layer in par.stage_layers(model.num_layers, stage):
        total += layer_bytes(model, layer, par, act_bytes, mxfp4)
    # RotaryEmbedding.cos_sin_cache [max_position, rotary_dim] in the model dtype, one per distinct RoPE
    rope_bytes = 4 if model.model_type == "gpt_oss" else act_bytes  # models/gpt_oss.py: get_rope(dtype=torch.float32)
    total += sum(positions * model.rotary_dim * rope_bytes for positions in model.rope_cache_positions)
    if first and model.vision:
        total += model.vision.params * act_bytes / par.tp
    return int(total)
