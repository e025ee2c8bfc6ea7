"""llama.cpp `llama-server --metrics` names.

Read from tools/server/server-task.cpp (`server_task_result_metrics::to_metrics`) of the llama.cpp vendored in
llama-cpp-python 0.3.36 (ggml 0.25.3) and checked against the running server in tests/test_engines.py. It exports:

counters  llamacpp:prompt_tokens_total, llamacpp:prompt_tokens_cached_total, llamacpp:prompt_seconds_total,
          llamacpp:tokens_predicted_total, llamacpp:tokens_predicted_seconds_total, llamacpp:n_decode_total,
          llamacpp:n_tokens_max (declared a counter; it is the largest prompt+generation length seen),
          llamacpp:spec_decode_num_{draft_tokens,accepted_tokens,drafts}_total
gauges    llamacpp:prompt_tokens_seconds, llamacpp:predicted_tokens_seconds (average tokens/s),
          llamacpp:requests_processing (busy slots), llamacpp:requests_deferred (queued requests),
          llamacpp:n_busy_slots_per_decode

No KV-cache usage: older servers exported `llamacpp:kv_cache_usage_ratio` and `llamacpp:kv_cache_tokens`
(kept below so their pages still parse); this one does not, so KV usage is None for llama.cpp and callers must
treat None as "not reported" (per-slot context is in GET /slots: `n_ctx`, and in /v1/models `meta.n_ctx`).
"""

PREFIX = "llamacpp:"

NAMES: dict[str, tuple[str, ...]] = {
    "kv_usage": ("llamacpp:kv_cache_usage_ratio",),        # older servers only
    "kv_tokens": ("llamacpp:kv_cache_tokens",),            # older servers only
    "running": ("llamacpp:requests_processing",),
    "waiting": ("llamacpp:requests_deferred",),
    "prompt_tokens_total": ("llamacpp:prompt_tokens_total",),
    "generation_tokens_total": ("llamacpp:tokens_predicted_total",),
    "decode_calls_total": ("llamacpp:n_decode_total",),
}
