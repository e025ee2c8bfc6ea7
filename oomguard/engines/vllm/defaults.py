"""vLLM's defaults for the flags a user did not give, per version (vllm/engine/arg_utils.py, vllm/config/*)."""

from __future__ import annotations

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import Version


def batch_defaults(version: Version, engine: str, gpu_name: str, total_bytes: int, usage_context: str,
                   max_model_len: int, multimodal: bool, long_context_chunks: bool = True) -> tuple[int, int, str]:
    """(max_num_seqs, max_num_batched_tokens, why) before the min() post-processing.

    V1: EngineArgs._set_default_args / get_batch_defaults (vllm/engine/arg_utils.py); usage_context is
    "serve" (UsageContext.OPENAI_API_SERVER) or "llm" (UsageContext.LLM_CLASS).
    V0: SchedulerConfig.__post_init__ (vllm/config.py); `long_context_chunks`: whether V0 turns chunked prefill on by
    itself past 32K tokens for this setup (v0_chunks_long_context).
    """
    gib = total_bytes / (1 << 30)
    if engine == "v0":
        if max_model_len > 32768 and long_context_chunks and not multimodal:
            return 256, 2048, "V0 with max_model_len > 32768 enables chunked prefill at 2048 tokens"
        tokens = max(max_model_len, 5120 if multimodal else 2048)
        return 256, tokens, "V0 without chunked prefill batches max(max_model_len, 2048) tokens"
    rel = release(version)
    is_a100 = "a100" in gpu_name.lower()
    if rel.large_gpu_tier_gib and gib >= rel.large_gpu_tier_gib:
        tier, seqs, tokens = ">=160 GiB", 1024, {"llm": 16384, "serve": 16384}
    elif gib >= 70 and (rel.a100_in_large_tier or not is_a100):
        tier, seqs, tokens = ">=70 GiB, not A100", 1024, {"llm": 16384, "serve": 8192}
    else:
        tier, seqs, tokens = "smaller", 256, {"llm": 8192, "serve": 2048}
    return seqs, tokens[usage_context], f"vLLM {usage_context} default for {tier} GPUs"


def v0_chunks_long_context(version: Version, rocm: bool, sliding_window: bool, mla: bool, lora: bool,
                           speculative: bool) -> bool:
    """Whether V0 enables chunked prefill by itself for a context over 32K tokens (EngineArgs.create_engine_config
    in 0.6-0.7, _set_default_args_v0 from 0.8): on CUDA only, not with a sliding window, speculative decoding or
    LoRA, and from 0.8 not for MLA models (multimodal models never: batch_defaults)."""
    mla_off = mla and release(version).v0_mla_without_chunked_prefill
    return not (rocm or sliding_window or lora or speculative or mla_off)


def resolve_batch(version: Version, engine: str, gpu_name: str, total_bytes: int, usage_context: str,
                  max_model_len: int, multimodal: bool, max_num_seqs: int | None,
                  max_num_batched_tokens: int | None, performance_mode: str = "balanced",
                  long_context_chunks: bool = True) -> tuple[int, int, list[str]]:
    """Apply defaults and vLLM's post-processing (_set_default_max_num_seqs_and_batched_tokens_args); the
    throughput performance mode doubles both defaults there."""
    notes: list[str] = []
    seqs_default, tokens_default, why = batch_defaults(version, engine, gpu_name, total_bytes, usage_context,
                                                       max_model_len, multimodal, long_context_chunks)
    if performance_mode == "throughput":
        seqs_default, tokens_default, why = 2 * seqs_default, 2 * tokens_default, why + ", doubled in throughput mode"
    seqs, tokens = max_num_seqs, max_num_batched_tokens
    if tokens is None:
        tokens = tokens_default
        if engine == "v1":
            if multimodal:
                tokens = max(tokens, release(version).multimodal_min_batched_tokens)
            tokens = min((seqs or seqs_default) * max_model_len, tokens)
        notes.append(f"max_num_batched_tokens={tokens} ({why})")
    if seqs is None:
        seqs = min(seqs_default, tokens) if engine == "v1" else seqs_default
        notes.append(f"max_num_seqs={seqs} ({why})")
    return seqs, tokens, notes
