"""What vLLM measures at startup rather than computes: activation peak, non-torch memory, CUDA-graph pool.

vLLM runs a dummy forward pass (GPUModelRunner.profile_run) and reads the allocator's peak, so there is no
closed form in its source. These are fitted models of those measurements, with the physics in their shape:
- the forward pass of max_num_batched_tokens tokens allocates per-token activations (hidden and MLP widths);
- the sampler dummy run (_dummy_sampler_run) holds fp32 logits [num_reqs, vocab] and a few same-sized
  temporaries (softmax, sort, top-k/top-p masks) on the last pipeline stage;
- pipeline stages keep IntermediateTensors (hidden states and residual) for max_num_batched_tokens;
- non-torch memory grows with NCCL / custom all-reduce buffers once there are several TP ranks;
- the CUDA-graph pool grows with layers and capture sizes.
Coefficients were fitted on the vLLM 0.19.0 H100 records of ../shared/data/vllm_startup_logs.jsonl
(benchmarks/plan_accuracy.py reports how well they fit, per figure):
- sampler: (activation - hidden states) / (num_reqs x vocab) is 14.7-15.0 bytes on five models with
  vocabularies from 128k to 201k (Llama-3.1-8B, Qwen2.5-7B, Qwen2.5-72B TP2, Llama-3.3-70B TP2, gpt-oss-20b);
- dense forward: the two forward-bound workers (CodeLlama-7B, and Llama-3.1-8B pipeline stage 0 after its
  IntermediateTensors) give 0.93 bytes/hidden unit and 4.24 bytes/intermediate unit per token (gate+up,
  the activation, and one temporary: about 4 x intermediate, as expected);
- routed MoE: 13-24 bytes per top_k x expert-intermediate unit (DeepSeek-V2-Lite, Qwen1.5-MoE; bounded by
  gpt-oss-20b); 16 is used;
- non-torch and the CUDA-graph pool: medians of the same records by TP/PP layout, graphs linear in layers.
The planner marks every figure from here as an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.models.spec import ModelSpec
from oomguard.units import GiB


@dataclass(frozen=True)
class ProfileCoefficients:
    sampler_bytes_per_logit: float = 14.9   # fp32 logits plus temporaries, per (request x vocab entry)
    forward_bytes_per_hidden: float = 0.93   # per token per hidden unit, in units of the activation dtype
    forward_bytes_per_inter: float = 4.24     # per token per MLP-intermediate unit on this rank (gate/up/act)
    moe_bytes_per_routed: float = 16.0        # per token per top_k x expert-intermediate unit (fused_moe caches)
    non_torch_single_gib: float = 0.25       # cuBLAS / attention workspaces, one GPU (V1)
    non_torch_tp_gib: float = 2.1            # plus NCCL and custom all-reduce buffers when TP > 1 (V1)
    non_torch_pp_only_gib: float = 0.07      # pipeline-only workers
    non_torch_v0_gib: float = 0.35           # V0 worker.py accounting (0.7-0.10)
    non_torch_v06_gib: float = 1.79          # 0.6.x counted the CUDA context and cuBLAS handles too
    context_gib: float = 0.51                # CUDA context + allocator state present before vLLM's snapshot
    nccl_init_gib: float = 1.0               # NCCL communicators created before the snapshot (V1 >= 0.11)
    graph_base_gib: float = 0.38             # CUDA-graph pool, fixed part
    graph_per_layer_gib: float = 0.0165       # per decoder layer on the rank, at the default capture sizes
    graph_moe_gib: float = 0.7               # MoE models capture larger graphs (routing buffers)


COEFFICIENTS = ProfileCoefficients()


def forward_peak_bytes(model: ModelSpec, tokens: int, tp: int, act_bytes: int,
                       c: ProfileCoefficients = COEFFICIENTS) -> float:
    """Peak of the eager forward pass over `tokens` tokens on one TP rank."""
    per_token = c.forward_bytes_per_hidden * model.hidden_size
    if model.moe and any(model.moe.moe_layers):
        moe = model.moe
        per_token += c.moe_bytes_per_routed * moe.top_k * moe.expert_intermediate_size / tp
        per_token += c.forward_bytes_per_inter * moe.shared_intermediate_size / tp
    else:
        per_token += c.forward_bytes_per_inter * model.intermediate_size / tp
    return tokens * per_token * act_bytes


def sampler_peak_bytes(vocab: int, num_reqs: int, c: ProfileCoefficients = COEFFICIENTS) -> float:
    """Peak of the sampler dummy run: fp32 logits [num_reqs, vocab] and temporaries (_dummy_sampler_run)."""
    return num_reqs * vocab * c.sampler_bytes_per_logit


def activation_peak_bytes(model: ModelSpec, tokens: int, num_reqs: int, vocab: int, tp: int, pp: int,
                          last_stage: bool, act_bytes: int, c: ProfileCoefficients = COEFFICIENTS) -> int:
    """torch peak increase during profile_run on one worker."""
    forward = forward_peak_bytes(model, tokens, tp, act_bytes, c)
    hidden_alive = tokens * model.hidden_size * act_bytes  # hidden_states stay alive while the sampler runs
    sampler = sampler_peak_bytes(vocab, num_reqs, c) + hidden_alive if last_stage else 0.0
    pp_buffers = 2 * tokens * model.hidden_size * act_bytes if pp > 1 else 0.0  # IntermediateTensors
    return int(max(forward, sampler) + pp_buffers)


def non_torch_bytes(engine: str, version: tuple[int, int, int], tp: int, pp: int,
                    c: ProfileCoefficients = COEFFICIENTS) -> int:
    """non_torch_increase during load + profile (memory_profiling in vllm/utils/mem_utils.py)."""
    if engine == "v0":
        gib = c.non_torch_v06_gib if version < (0, 7, 0) else c.non_torch_v0_gib
    elif tp > 1:
        gib = c.non_torch_tp_gib
    elif pp > 1:
        gib = c.non_torch_pp_only_gib
    else:
        gib = c.non_torch_single_gib
    return int(gib * GiB)


def start_used_bytes(engine: str, version: tuple[int, int, int], world_size: int,
                     c: ProfileCoefficients = COEFFICIENTS) -> int:
    """GPU memory already in use when vLLM takes its initial snapshot (what the free-memory check sees)."""
    gib = c.context_gib
    if engine == "v1" and version >= (0, 11, 0) and world_size > 1:
        gib += c.nccl_init_gib  # Worker.init_device initialises NCCL before MemorySnapshot from 0.11
    return int(gib * GiB)


def cuda_graph_bytes(model: ModelSpec, layers_on_rank: int, enforce_eager: bool,
                     c: ProfileCoefficients = COEFFICIENTS) -> int:
    """CUDA-graph pool after capture (GPUModelRunner.capture_model); 0 with --enforce-eager."""
    if enforce_eager:
        return 0
    gib = c.graph_base_gib + c.graph_per_layer_gib * layers_on_rank
    if model.moe:
        gib += c.graph_moe_gib
    return int(gib * GiB)
