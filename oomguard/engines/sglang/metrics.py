"""SGLang's Prometheus metric names (python/sglang/srt/metrics/collector.py)."""

PREFIX = "sglang:"

NAMES: dict[str, tuple[str, ...]] = {
    "kv_usage": ("sglang:token_usage",),
    "running": ("sglang:num_running_reqs",),
    "waiting": ("sglang:num_queue_reqs",),
    "prefix_cache_hit_rate": ("sglang:cache_hit_rate",),
    "prompt_tokens_total": ("sglang:prompt_tokens_total",),
    "generation_tokens_total": ("sglang:generation_tokens_total",),
    "ttft_seconds_sum": ("sglang:time_to_first_token_seconds_sum",),
    "ttft_seconds_count": ("sglang:time_to_first_token_seconds_count",),
    "e2e_seconds_sum": ("sglang:e2e_request_latency_seconds_sum",),
    "e2e_seconds_count": ("sglang:e2e_request_latency_seconds_count",),
}
