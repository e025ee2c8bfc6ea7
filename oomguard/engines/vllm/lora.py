"""GPU memory that --enable-lora preallocates: max_loras adapter slots of max_lora_rank in every wrapped layer.

vLLM replaces each LinearBase layer (and, for models that declare them, the embeddings and the logits processor) by a
*WithLoRA layer whose create_lora_weights allocates zeroed A and B stacks of shape (max_loras, 1, rank, in) and
(max_loras, 1, out, rank) per packed slice, in lora_dtype (vllm/lora/layers/*.py; lora/layers.py before 0.10.2).
V1 allocates them inside load_model's memory profiler (gpu_model_runner.load_model -> load_lora_model), so they are
part of "Model loading took" and come out of the KV budget. Dummy adapters for the profile run live in pinned host
memory and are copied into these slots: no more GPU memory. The kernels' scratch is tens of MB at most, so the
activation peak is taken as without LoRA.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.engines.vllm.releases import VllmRelease
from oomguard.errors import UsageError
from oomguard.models.spec import DTYPE_BYTES, ModelSpec

DEFAULT_MAX_LORAS = 1        # vllm/config/lora.py LoRAConfig.max_loras
DEFAULT_MAX_LORA_RANK = 16   # LoRAConfig.max_lora_rank
LORA_VOCAB_PADDING = 256     # platforms/interface.py get_lora_vocab_padding_size (CUDA)


@dataclass(frozen=True)
class LoraConfig:
    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    fully_sharded: bool = False
    extra_vocab_size: int | None = None   # --lora-extra-vocab-size (up to 0.11; default 256)
    dtype: str | None = None              # --lora-dtype; auto: the model's dtype
    max_cpu_loras: int | None = None

    @classmethod
    def from_flags(cls, flags: dict) -> LoraConfig | None:
        if not flags.get("enable_lora"):
            return None   # vLLM ignores the sizes without --enable-lora (ignored_flags says so)
        config = cls(flags.get("max_loras", DEFAULT_MAX_LORAS), flags.get("max_lora_rank", DEFAULT_MAX_LORA_RANK),
                     bool(flags.get("fully_sharded_loras")), flags.get("lora_extra_vocab_size"),
                     flags.get("lora_dtype"), flags.get("max_cpu_loras"))
        if config.max_loras < 1 or config.max_lora_rank < 1:
            raise UsageError("--max-loras and --max-lora-rank must be positive integers")
        if config.max_cpu_loras is not None and config.max_cpu_loras < config.max_loras:
            # vllm/config/lora.py LoRAConfig.__post_init__
            raise UsageError(f"max_cpu_loras ({config.max_cpu_loras}) must be >= max_loras ({config.max_loras})")
        return config


def ignored_flags(flags: dict) -> list[str]:
    """LoRA sizes given without --enable-lora: vLLM accepts and ignores them."""
    if flags.get("enable_lora"):
        return []
    return [f"--{k.replace('_', '-')}" for k in ("max_loras", "max_lora_rank", "fully_sharded_loras", "max_cpu_loras",
                                                 "lora_extra_vocab_size", "lora_dtype") if flags.get(k)]


def check(cfg: LoraConfig, rel: VllmRelease, tp: int) -> None:
    """The flag checks vLLM makes before it allocates anything (config/lora.py, arg_utils.py)."""
    if cfg.max_lora_rank not in rel.lora_ranks:
        raise UsageError(f"--max-lora-rank {cfg.max_lora_rank} is not one vLLM takes: use one of "
                         f"{', '.join(map(str, rel.lora_ranks))}")
    if cfg.extra_vocab_size is not None and not rel.lora_extra_vocab:
        raise UsageError("--lora-extra-vocab-size was removed in vLLM 0.12: drop it")
    if cfg.dtype not in (None, "auto", "float16", "bfloat16"):
        raise UsageError(f"--lora-dtype {cfg.dtype!r}: use auto, float16 or bfloat16")
    if cfg.fully_sharded and tp > 1 and cfg.max_lora_rank % tp:
        raise UsageError(f"--fully-sharded-loras splits the rank over TP ranks: --max-lora-rank {cfg.max_lora_rank} "
                         f"must be divisible by --tensor-parallel-size {tp}")


def wraps_embeddings(model: ModelSpec, rel: VllmRelease) -> bool:
    """The model declares embedding_modules (models/<family>.py), so embed_tokens and the logits get LoRA stacks."""
    return model.model_type in rel.lora_embedding_model_types


def _layer_elements(model: ModelSpec, tp: int, moe_wrapped: bool, fully_sharded: bool) -> tuple[int, int, int]:
    """Stack elements per unit of max_loras x rank: (attention of any layer, a MoE block, a dense MLP of width w per
    unit of w) (lora/layers: BaseLinearLayerWithLoRA and its column/row subclasses; FusedMoEWithLoRA from 0.11.1).
    Column layers keep the whole input width in A and their output shard in B; row layers their input shard in A
    and the whole output width in B; --fully-sharded-loras also splits column A's rank and row B's output."""
    h, hd = model.hidden_size, model.head_dim
    kv = max(1, model.num_kv_heads // tp) * hd
    q = model.num_heads * hd // tp
    a_in = h // tp if fully_sharded else h
    b_out = h // tp if fully_sharded else h
    attention = 3 * a_in + q + 2 * kv + q + b_out          # qkv_proj (three slices) and o_proj
    moe = model.moe
    block = 0
    if moe and any(moe.moe_layers):
        block = h + moe.num_experts                         # the router gate (ReplicatedLinear)
        if moe_wrapped:   # w13 A 2 x (E, r, H), w2 A (E, r, I), w13 B 2 x (E, I, r), w2 B (E, H, r)
            inter, slices = moe.expert_intermediate_size // tp, 2 if model.gated_mlp else 1
            block += moe.num_experts * (slices * a_in + inter + slices * inter + b_out)
    return attention, block, (2 if model.gated_mlp else 1) * a_in + b_out


def _mlp_elements(model: ModelSpec, width: int, tp: int, fixed: int) -> int:
    """gate_up_proj (merged column) and down_proj (row) of a dense MLP `width` wide; `fixed`: their width-free part."""
    return fixed + ((2 if model.gated_mlp else 1) + 1) * width // tp if width else 0


def lora_bytes(model: ModelSpec, cfg: LoraConfig, rel: VllmRelease, tp: int, layers_on_rank: int,
               first_stage: bool, last_stage: bool, model_dtype: str, max_num_batched_tokens: int,
               max_num_seqs: int) -> int:
    """The LoRA stacks and Punica metadata one GPU allocates at load."""
    b = DTYPE_BYTES[cfg.dtype if cfg.dtype not in (None, "auto") else model_dtype]
    slots = cfg.max_loras * cfg.max_lora_rank
    attention, block, fixed = _layer_elements(model, tp, rel.lora_wraps_moe, cfg.fully_sharded)
    moe = model.moe
    moe_layers = round(sum(moe.moe_layers) * layers_on_rank / model.num_layers) if moe else 0
    shared = moe.shared_intermediate_size if moe else 0
    elements = layers_on_rank * attention + moe_layers * (block + _mlp_elements(model, shared, tp, fixed)) \
        + (layers_on_rank - moe_layers) * _mlp_elements(model, model.intermediate_size, tp, fixed)
    total = slots * elements * b
    if wraps_embeddings(model, rel):
        h, v = model.hidden_size, model.vocab_size
        if rel.lora_extra_vocab:   # vocal_parallel_embedding.py / logits_processor.py up to 0.11
            extra = cfg.extra_vocab_size if cfg.extra_vocab_size is not None else 256
            padded = -(-(v + extra) // LORA_VOCAB_PADDING) * LORA_VOCAB_PADDING
            embed = slots * (v + extra + h) * b + cfg.max_loras * extra * h * DTYPE_BYTES[model_dtype]
            head = slots * (h + padded) * b + cfg.max_loras * extra * h * DTYPE_BYTES[model_dtype]
        else:                      # (L, V, r) + (L, 1, H, r), and (L, 1, r, H) + (L, 1, V, r)
            embed = head = slots * (v + h) * b
        total += (embed if first_stage else 0) + (head if last_stage else 0)
    # punica_wrapper/punica_base.py: four int64 index buffers of max_num_batched_tokens, three of max_num_seqs;
    # punica_gpu.py: two LoRAKernelMeta of int32 per token
    total += 48 * max_num_batched_tokens + 24 * max_num_seqs
    return total


def graph_capture_factor(cfg: LoraConfig | None, rel: VllmRelease) -> int:
    """How many times each CUDA graph is captured with LoRA on: with and without adapters from 0.11.1
    (v1/cudagraph_dispatcher.py, cudagraph_specialize_lora defaults to True)."""
    return rel.lora_graph_cases if cfg else 1
