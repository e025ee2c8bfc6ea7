"""The simulator's /metrics with vLLM's names for a chosen version (vllm/v1/metrics/loggers.py; V0 engine/metrics.py).

Names by version (research/vllm-memory-model.md section 7):
- KV usage: `vllm:gpu_cache_usage_perc` up to 0.8, both names 0.9-0.10, `vllm:kv_cache_usage_perc` from 0.11.
- Prefix cache counters: `vllm:gpu_prefix_cache_{queries,hits}_total` up to 0.10, `vllm:prefix_cache_*` from 0.9.
- Per-token latency: `vllm:time_per_output_token_seconds` up to 0.11, `vllm:inter_token_latency_seconds` and
  `vllm:request_time_per_output_token_seconds` from 0.11.
- `vllm:num_requests_swapped` only for the V0 engine (< 0.8).
- `vllm:cache_config_info` carries the block count and size as labels (plus kv_cache_size_tokens and
  kv_cache_max_concurrency from 0.24).
Labels: `model_name`, and `engine="0"` for the V1 engine (>= 0.8). Latencies are wall-clock seconds as a client
sees them (already divided by --speed).
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import Version

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)


class SimMetrics:
    """Every metric the simulator exports, in its own registry (several simulators can live in one process)."""

    def __init__(self, version: Version, model_name: str, cache_config: dict[str, object],
                 kv_usage: Callable[[], float], running: Callable[[], float], waiting: Callable[[], float]):
        self.version = version
        self.registry = registry = CollectorRegistry(auto_describe=True)
        rel = release(version)
        v1 = rel.engine_label
        names = ["model_name"] + (["engine"] if v1 else [])
        values = [model_name] + (["0"] if v1 else [])

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, names, registry=registry).labels(*values).set_function(fn)

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running)
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        if rel.swapped_gauge:
            gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", lambda: 0.0)
        for name in rel.kv_usage_metrics:
            gauge(name, "KV-cache usage. 1 means 100 percent usage.", kv_usage)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, names + list(extra), registry=registry)

        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.") \
            .labels(*values)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(*values)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.") \
            .labels(*values)
        self._success = counter("vllm:request_success", "Count of successfully processed requests.",
                                ("finished_reason",))
        self._values = values
        for base in rel.prefix_cache_metrics:  # no prefix caching is simulated: the counters exist and stay at zero
            counter(f"{base}_queries", "Prefix cache queries, in terms of number of queried tokens.").labels(*values)
            counter(f"{base}_hits", "Prefix cache hits, in terms of number of cached tokens.").labels(*values)

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=registry).labels(*values)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.", LATENCY_BUCKETS)
        self.prompt_hist = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                     _token_buckets(int(cache_config.get("max_model_len", 8192) or 8192)))
        self.generation_hist = histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                         _token_buckets(int(cache_config.get("max_model_len", 8192) or 8192)))
        itl_docs = {"vllm:time_per_output_token_seconds": "Histogram of time per output token in seconds.",
                    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds."}
        self.itl: list[Histogram] = [histogram(name, itl_docs[name], ITL_BUCKETS) for name in rel.itl_metrics]
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS) \
            if rel.request_tpot_histogram else None

        info_labels = {k: str(v) for k, v in cache_config.items() if k != "max_model_len"}
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info_labels),
                     registry=registry)
        info.labels(**info_labels).set(1)

    def request_success(self, finished_reason: str) -> None:
        self._success.labels(*self._values, finished_reason).inc()

    def observe_token_gap(self, seconds: float) -> None:
        for hist in self.itl:
            hist.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's build_1_2_5_buckets(max_model_len)."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10 ** exponent
            if value > max_model_len:
                return tuple(float(v) for v in out)
            out.append(value)
        exponent += 1
