"""The proxy's own Prometheus metrics (its own registry, so nothing global leaks between instances)."""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from . import metric_names
from .admission import AdmissionController, Priority, State

QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class _StateCollector(Collector):
    """Read at scrape time from the controller: queue lengths and each upstream's state."""

    def __init__(self, controller: AdmissionController) -> None:
        self.controller = controller

    def collect(self) -> Iterator[GaugeMetricFamily]:
        c = self.controller
        queue = GaugeMetricFamily("oomguard_proxy_queue_length", "Requests waiting in the proxy's queue",
                                  labels=["priority"])
        for p in Priority:
            queue.add_metric([p.name.lower()], c.queue_length(p))
        yield queue
        now = c.clock()
        state = GaugeMetricFamily("oomguard_proxy_upstream_state",
                                  "1 for the upstream's current state (open, paused, down), else 0",
                                  labels=["upstream", "state"])
        kv = GaugeMetricFamily("oomguard_proxy_upstream_kv_usage",
                               "Last KV cache usage (0..1) read from the upstream's /metrics", labels=["upstream"])
        in_flight = GaugeMetricFamily("oomguard_proxy_upstream_in_flight",
                                      "Requests the proxy has in flight to the upstream", labels=["upstream"])
        age = GaugeMetricFamily("oomguard_proxy_upstream_metrics_age_seconds",
                                "Seconds since the upstream's last good /metrics scrape", labels=["upstream"])
        for up in c.upstreams.values():
            current, _ = up.state(now, c.limits)
            for s in State:
                state.add_metric([up.name, s.value], 1.0 if s is current else 0.0)
            if up.kv_usage is not None:
                kv.add_metric([up.name], up.kv_usage)
            in_flight.add_metric([up.name], up.in_flight)
            if up.metrics_at is not None:
                age.add_metric([up.name], max(0.0, now - up.metrics_at))
        yield from (state, kv, in_flight, age)
        yield from self._engine_gauges(now)
        drain = GaugeMetricFamily("oomguard_proxy_drain_rate", "Completed requests per second (drain window)")
        drain.add_metric([], c.drain_rate())
        yield drain

    def _engine_gauges(self, now: float) -> Iterator[GaugeMetricFamily]:
        """The admission signals an Endpoint Picker filters and scores on (proxy/metric_names.py), labelled as
        vLLM labels its own gauges."""
        c = self.controller
        labels = list(metric_names.ENGINE_LABELS)
        admit, headroom, capacity = (GaugeMetricFamily(name, metric_names.HELP[name], labels=labels)
                                     for name in metric_names.ENGINE_GAUGES)
        for up in c.upstreams.values():
            values = [up.model_name or "", up.name]
            admit.add_metric(values, 1.0 if up.state(now, c.limits)[0] is State.OPEN else 0.0)
            room = up.kv_headroom_tokens(c.limits)
            if room is not None:
                headroom.add_metric(values, float(room))
                capacity.add_metric(values, float(up.kv_capacity_tokens))
        yield from (admit, headroom, capacity)


class _QueueTime(Collector):
    """The time-in-queue histogram per priority, counted in plain integers on the hot path (a prometheus_client
    Histogram takes a lock and walks its buckets in Python for every observation) and rendered at scrape time."""

    def __init__(self) -> None:
        self.counts = {p: [0] * (len(QUEUE_BUCKETS) + 1) for p in Priority}  # per bucket, +Inf last
        self.sums = {p: 0.0 for p in Priority}

    def observe(self, priority: Priority, seconds: float) -> None:
        self.counts[priority][bisect_left(QUEUE_BUCKETS, seconds)] += 1  # le: a value on a bound counts in it
        self.sums[priority] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily("oomguard_proxy_queue_time_seconds",
                                       "Time from arrival to dispatch (admitted requests)", labels=["priority"])
        for p in Priority:
            buckets, total = [], 0
            for bound, n in zip((*QUEUE_BUCKETS, float("inf")), self.counts[p]):
                total += n
                buckets.append((_le(bound), total))
            family.add_metric([p.name.lower()], buckets, self.sums[p])
        yield family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class ProxyMetrics:
    def __init__(self, controller: AdmissionController) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.admitted = Counter("oomguard_proxy_admitted", "Requests dispatched to an upstream",
                                ["upstream", "priority"], registry=self.registry)
        self.rejected = Counter("oomguard_proxy_rejected",
                                "Requests answered by the proxy itself with an error, by reason",
                                ["reason"], registry=self.registry)
        self.queue_time = _QueueTime()
        self.registry.register(self.queue_time)
        self.upstream_errors = Counter("oomguard_proxy_upstream_errors",
                                       "Upstream failures seen while forwarding, by kind", ["upstream", "kind"],
                                       registry=self.registry)
        self.registry.register(_StateCollector(controller))
        # admissions counted in plain integers on the hot path, added to the counter when it is read
        self._admitted_pending: dict[tuple[str, Priority], int] = {}

    def on_admit(self, upstream: str, priority: Priority, waited_s: float) -> None:
        key = (upstream, priority)
        pending = self._admitted_pending
        pending[key] = pending.get(key, 0) + 1
        self.queue_time.observe(priority, waited_s)

    def flush(self) -> None:
        """Move the admissions counted since the last read into the `admitted` counter."""
        pending, self._admitted_pending = self._admitted_pending, {}
        for (upstream, priority), n in pending.items():
            self.admitted.labels(upstream, priority.name.lower()).inc(n)

    def on_reject(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def render(self) -> bytes:
        self.flush()
        return generate_latest(self.registry)
