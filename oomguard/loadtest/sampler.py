"""Samples the server's /metrics (every 0.5 s by default) and, for a local server, GPU memory through NVML.

Names are normalised by `oomguard.metrics.parse_metrics`, so vLLM (old and new names), SGLang and llama.cpp
give the same fields. A field the engine does not export stays None ("not reported"), never 0.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

import aiohttp

from oomguard.metrics import EngineSample, MetricsParseError, parse_metrics, read_page


@dataclass(slots=True)
class MetricPoint:
    t: float  # seconds since the run began
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_capacity: float | None = None   # of `waiting`: for KV blocks or a slot (vLLM's by-reason split)
    preemptions_total: float | None = None
    # the engine's time-in-queue histogram (vLLM's request_queue_time_seconds), its running sum and count
    queue_seconds_sum: float | None = None
    queue_seconds_count: float | None = None
    gpu_used_bytes: int | None = None
    gpu_total_bytes: int | None = None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


def nvml_reader() -> Callable[[], tuple[int, int] | None] | None:
    """A function returning (used, total) bytes summed over the local GPUs, or None when NVML is unavailable."""
    try:
        from oomguard.gpus.nvml import detect_gpus  # written by the GPU module; optional
    except ImportError:
        return None

    def read() -> tuple[int, int] | None:
        try:
            gpus = detect_gpus()
        except Exception:  # detect_gpus should never raise; a sampler must not die of it either
            return None
        if not gpus:
            return None
        return (sum(int(g.used_bytes) for g in gpus), sum(int(g.total_bytes) for g in gpus))

    try:
        return read if read() is not None else None
    except Exception:
        return None


class MetricsSampler:
    def __init__(self, session: aiohttp.ClientSession, metrics_url: str | None, *, t0: float,
                 interval: float = 0.5, gpu: bool = False):
        self.session = session
        self.url = metrics_url
        self.t0 = t0
        self.interval = interval
        self.points: list[MetricPoint] = []
        self.engine: str | None = None
        self.cache_config: dict[str, str] = {}
        self.problem: str | None = None  # why server metrics are not available, when they are not
        self.failures = 0
        self.reported: set[str] = set()  # canonical fields the engine exports
        self._gpu = nvml_reader() if gpu else None
        self.gpu_available = self._gpu is not None

    @property
    def latest(self) -> MetricPoint | None:
        return self.points[-1] if self.points else None

    async def probe(self) -> bool:
        """One scrape before the run: says whether the server exports metrics we can read."""
        if self.url is None:
            self.problem = "metrics sampling is off (--no-metrics)"
            return False
        sample = await self._scrape()
        if sample is None:
            return False
        if sample.engine == "unknown":
            self.problem = f"{self.url} has no vLLM, SGLang or llama.cpp metrics; server-side figures are not watched"
            return False
        self.engine = sample.engine
        self.cache_config = dict(sample.cache_config)
        self.reported = {name for name in ("kv_usage", "running", "waiting", "waiting_capacity", "preemptions_total")
                         if getattr(sample, name) is not None}
        return True

    async def _scrape(self) -> EngineSample | None:
        try:
            async with self.session.get(self.url, timeout=aiohttp.ClientTimeout(total=max(2.0, self.interval * 4))) as resp:
                if resp.status != 200:
                    self.problem = f"{self.url} answered HTTP {resp.status}" + (
                        " (llama-server needs --metrics)" if resp.status in (404, 501) else "")
                    return None
                text = await read_page(resp)
        except MetricsParseError as exc:
            self.problem = f"{self.url}: {exc}"
            return None
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.problem = f"cannot read {self.url}: {type(exc).__name__}"
            return None
        try:
            return parse_metrics(text)
        except MetricsParseError as exc:
            self.problem = f"{self.url}: {exc}"
            return None

    async def sample_once(self) -> MetricPoint:
        t = time.perf_counter() - self.t0
        point = MetricPoint(t=t)
        if self.url is not None and self.engine is not None:
            sample = await self._scrape()
            if sample is None:
                self.failures += 1
            else:
                self.failures = 0
                point.kv_usage = sample.kv_usage
                point.running = sample.running
                point.waiting = sample.waiting
                point.waiting_capacity = sample.waiting_capacity
                point.preemptions_total = sample.preemptions_total
                point.queue_seconds_sum, point.queue_seconds_count = sample.queue_seconds_sum, sample.queue_seconds_count
        if self._gpu is not None:
            got = await asyncio.to_thread(self._gpu)
            if got:
                point.gpu_used_bytes, point.gpu_total_bytes = got
        self.points.append(point)
        return point

    async def run(self) -> None:
        """Sample on a fixed grid until cancelled."""
        if self.engine is None and self._gpu is None:
            return
        next_t = time.perf_counter()
        while True:
            await self.sample_once()
            next_t += self.interval
            delay = next_t - time.perf_counter()
            if delay < 0:  # a slow scrape: skip the missed slots rather than bunch samples together
                next_t = time.perf_counter()
                delay = 0
            await asyncio.sleep(delay)
