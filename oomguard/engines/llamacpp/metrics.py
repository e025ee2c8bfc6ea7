"""llama.cpp `llama-server --metrics` names (tools/server/server.cpp, handle_metrics).

Older servers exported `llamacpp:kv_cache_usage_ratio` and `llamacpp:kv_cache_tokens`; newer ones dropped
them, so KV usage may be unknown for llama.cpp (callers must treat None as "not reported").
"""

PREFIX = "llamacpp:"

NAMES: dict[str, tuple[str, ...]] = {
    "kv_usage": ("llamacpp:kv_cache_usage_ratio",),
    "kv_tokens": ("llamacpp:kv_cache_tokens",),
    "running": ("llamacpp:requests_processing",),
    "waiting": ("llamacpp:requests_deferred",),
    "prompt_tokens_total": ("llamacpp:prompt_tokens_total",),
    "generation_tokens_total": ("llamacpp:tokens_predicted_total",),
    "decode_calls_total": ("llamacpp:n_decode_total",),
}
