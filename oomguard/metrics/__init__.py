"""Engine metrics normalised across engines and versions.

`parse_metrics(text)` reads a Prometheus text page (with prometheus_client's parser) and returns an
`EngineSample` whose fields have one meaning whatever the engine or version exported. Which names map to
which field lives with each engine (`oomguard/engines/<engine>/metrics.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oomguard.engines.llamacpp import metrics as _llamacpp
from oomguard.engines.sglang import metrics as _sglang
from oomguard.engines.vllm import metrics as _vllm

ENGINES = {"vllm": _vllm, "sglang": _sglang, "llamacpp": _llamacpp}

# Gauges that describe one shared resource take the worst engine (DP ranks, several models); counts add up.
_MAX_FIELDS = {"kv_usage", "prefix_cache_hit_rate"}


@dataclass(frozen=True)
class EngineSample:
    """One scrape of an engine's /metrics, in canonical names. None means 'not exported by this engine'."""

    engine: str  # "vllm", "sglang", "llamacpp" or "unknown"
    kv_usage: float | None = None  # 0..1 fraction of KV blocks in use
    running: float | None = None
    waiting: float | None = None
    waiting_capacity: float | None = None  # of `waiting`: for KV blocks or a scheduler slot (vLLM's by-reason split)
    waiting_deferred: float | None = None  # of `waiting`: on something else (a grammar, a KV transfer, a LoRA slot)
    swapped: float | None = None
    preemptions_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_hit_rate: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    requests_success_total: float | None = None
    ttft_seconds_sum: float | None = None
    ttft_seconds_count: float | None = None
    queue_seconds_sum: float | None = None
    queue_seconds_count: float | None = None
    e2e_seconds_sum: float | None = None
    e2e_seconds_count: float | None = None
    kv_tokens: float | None = None
    decode_calls_total: float | None = None
    cache_config: dict[str, str] = field(default_factory=dict)  # vLLM cache_config_info labels
    raw: dict[str, float] = field(default_factory=dict)  # every sample name -> value summed over labels

    @property
    def hit_rate(self) -> float | None:
        """Prefix-cache hit rate 0..1 from counters (or the engine's own gauge)."""
        if self.prefix_cache_queries_total:
            return (self.prefix_cache_hits_total or 0.0) / self.prefix_cache_queries_total
        return self.prefix_cache_hit_rate


class MetricsParseError(ValueError):
    """The text is not a Prometheus exposition page."""


MAX_PAGE_BYTES = 16 << 20   # an engine's /metrics is a few hundred KiB; more than this is not read


async def read_page(response, limit: int = MAX_PAGE_BYTES) -> str:
    """An HTTP response's body as text (an aiohttp ClientResponse), refused once it passes `limit` bytes: a huge or
    endless page never sits whole in memory."""
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise MetricsParseError(f"the page is larger than {limit >> 20} MiB: not an engine's metrics")
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def detect_engine(names: set[str] | dict[str, float]) -> str:
    for engine, table in ENGINES.items():
        if any(name.startswith(table.PREFIX) for name in names):
            return engine
    return "unknown"


def parse_metrics(text: str) -> EngineSample:
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    maxima: dict[str, float] = {}
    labelled: dict[tuple[str, str, str], float] = {}   # (name, label, value) -> sum, for the engines' LABELLED
    wanted = {(name, label) for table in ENGINES.values() for name, label, _ in getattr(table, "LABELLED", {}).values()}
    cache_config: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                totals[sample.name] = totals.get(sample.name, 0.0) + value
                maxima[sample.name] = max(maxima.get(sample.name, value), value)
                if sample.name == _vllm.CACHE_CONFIG_INFO:
                    cache_config = dict(sample.labels)
                for name, label in wanted:
                    if sample.name == name and label in sample.labels:
                        key = (name, label, sample.labels[label])
                        labelled[key] = labelled.get(key, 0.0) + value
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsParseError(f"not a Prometheus metrics page: {exc}") from exc

    engine = detect_engine(totals)
    values: dict[str, float] = {}
    if engine in ENGINES:
        for canonical, names in ENGINES[engine].NAMES.items():
            for name in names:
                if name in totals:
                    values[canonical] = maxima[name] if canonical in _MAX_FIELDS else totals[name]
                    break
        for canonical, key in getattr(ENGINES[engine], "LABELLED", {}).items():
            if key[0] in totals:   # the family is exported: a reason with no sample waits 0
                values[canonical] = labelled.get(key, 0.0)
    return EngineSample(engine=engine, cache_config=cache_config, raw=totals, **values)
