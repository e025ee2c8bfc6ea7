"""vLLM's Prometheus metric names, newest name first (vllm/v1/metrics/loggers.py; V0 engine/metrics.py).

Renames: `vllm:gpu_cache_usage_perc` became `vllm:kv_cache_usage_perc` (0.9; old name removed in 0.12);
`vllm:gpu_prefix_cache_{queries,hits}` became `vllm:prefix_cache_{queries,hits}` (same versions);
`vllm:time_per_output_token_seconds` became `vllm:inter_token_latency_seconds` (0.11; removed 0.15).
"""

PREFIX = "vllm:"

# canonical field -> exported sample names, preferred first
NAMES: dict[str, tuple[str, ...]] = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "swapped": ("vllm:num_requests_swapped",),
    "preemptions_total": ("vllm:num_preemptions_total",),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_cache_hit_rate": ("vllm:gpu_prefix_cache_hit_rate",),  # V0 gauge, 0..1
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "requests_success_total": ("vllm:request_success_total",),
    "ttft_seconds_sum": ("vllm:time_to_first_token_seconds_sum",),
    "ttft_seconds_count": ("vllm:time_to_first_token_seconds_count",),
    "queue_seconds_sum": ("vllm:request_queue_time_seconds_sum",),
    "queue_seconds_count": ("vllm:request_queue_time_seconds_count",),
    "e2e_seconds_sum": ("vllm:e2e_request_latency_seconds_sum",),
    "e2e_seconds_count": ("vllm:e2e_request_latency_seconds_count",),
}

# canonical field -> (sample name, label, value): gauges split by a label. V1's waiting queue by why a request waits
# (v1/metrics/loggers.py): "capacity" (no KV blocks or scheduler slot for it) or "deferred" (waiting on something
# else: a structured-output grammar, a remote KV transfer, a LoRA slot); their sum is vllm:num_requests_waiting
LABELLED: dict[str, tuple[str, str, str]] = {
    "waiting_capacity": ("vllm:num_requests_waiting_by_reason", "reason", "capacity"),
    "waiting_deferred": ("vllm:num_requests_waiting_by_reason", "reason", "deferred"),
}

# `vllm:cache_config_info` carries CacheConfig as labels: the real block count, block size, utilization.
CACHE_CONFIG_INFO = "vllm:cache_config_info"

# histogram families (exported as _bucket, _sum and _count) that dashboards read
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_queue_time_seconds", "vllm:inter_token_latency_seconds",
              "vllm:time_per_output_token_seconds")
