"""Runs stages of load: offers requests in a shape, watches the server, stops on a condition, drains.

One `Runner` per run. Each stage is bounded by a duration and a request cap; it ends early when a --stop-when
condition holds, when the server stops answering, or on Ctrl-C. Requests we cut off at the end of a stage are
counted as cancelled (neither successes nor errors).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from oomguard.loadtest.client import OpenAIClient, RequestResult
from oomguard.loadtest.conditions import LATENCIES, PERCENTILES, Condition, Firing, evaluate
from oomguard.loadtest.sampler import MetricPoint, MetricsSampler
from oomguard.loadtest.shapes import Load
from oomguard.loadtest.stats import percentile
from oomguard.loadtest.workload import Workload

TICK_S = 0.5
LATENCY_WINDOW_S = 10.0
LATENCY_WINDOW_MIN = 20
LATENCY_WINDOW_MAX = 4000  # the newest requests at most: a live percentile must not stall the event loop
SERVER_DOWN_ERRORS = 20  # consecutive connection failures ...
SERVER_DOWN_SILENCE_S = 2.0  # ... and no HTTP answer for this long: the server is gone
SERVER_DOWN_LONG_SILENCE_S = 5.0  # or a few consecutive failures and no HTTP answer for this long


class Recorder:
    """Every request of the run."""

    def __init__(self, bin_s: float = TICK_S):
        self.bin_s = bin_s
        self.results: list[RequestResult] = []

    def token_bins(self, n_bins: int) -> list[int]:
        """Output tokens by arrival time, in bins of bin_s: a streamed token arrived at start + ttft + the sum
        of the ITLs before it; without streaming, all of them with the response."""
        bins = [0] * n_bins
        b = self.bin_s
        last = n_bins - 1
        for r in self.results:
            if not r.ok or r.ttft is None:
                continue
            t = r.start + r.ttft
            if r.itls is None:
                bins[min(last, int(t / b))] += r.output_tokens
                continue
            bins[min(last, int(t / b))] += 1
            for gap in r.itls:
                t += gap
                bins[min(last, int(t / b))] += 1
            extra = r.output_tokens - 1 - len(r.itls)  # usage said more tokens than chunks
            if extra > 0:
                bins[min(last, int(r.end / b))] += extra
        return bins


@dataclass
class StageState:
    index: int
    load: Load
    t_start: float
    deadline: float
    cap: int
    results: list[RequestResult] = field(default_factory=list)
    tasks: set = field(default_factory=set)
    sent: int = 0
    ok: int = 0
    errors: int = 0
    cancelled: int = 0
    not_sent: int = 0  # open loop: arrivals skipped because --max-inflight requests were already out
    lags: list[float] = field(default_factory=list)  # open loop: how late each request left (s)
    stopping: bool = False
    dispatch_done: bool = False
    conn_failures: int = 0
    last_answer_t: float = 0.0
    preempt_base: float | None = None
    first_point: int = 0  # the stage's sampler points are points[first_point:last_point]
    last_point: int | None = None
    t_end: float = 0.0
    t_drained: float = 0.0
    ended_because: str = ""
    firings: list[Firing] = field(default_factory=list)
    server_down_reason: str | None = None
    in_flight_peak: int = 0
    drain_timeout: float = 0.0   # how long the stage's last requests were given to finish before being cancelled

    @property
    def in_flight(self) -> int:
        return self.sent - self.ok - self.errors - self.cancelled


class Runner:
    def __init__(self, client: OpenAIClient, workload: Workload, sampler: MetricsSampler, *,
                 max_inflight: int = 10000, seed: int = 0,
                 on_tick: Callable[["Runner", StageState, dict], None] | None = None):
        self.client = client
        self.workload = workload
        self.sampler = sampler
        self.max_inflight = max_inflight
        self.rng = random.Random(seed)
        self.recorder = Recorder()
        self.stages: list[StageState] = []
        self.interrupt = asyncio.Event()
        self.on_tick = on_tick
        self.t0 = client.t0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # ---- sending -------------------------------------------------------------------------------------
    def _record(self, st: StageState, res: RequestResult) -> None:
        self.recorder.results.append(res)
        st.results.append(res)
        if res.cancelled:
            st.cancelled += 1
            return
        if res.ok:
            st.ok += 1
        else:
            st.errors += 1
        if res.status:
            st.conn_failures = 0
            st.last_answer_t = res.end
        elif res.error_kind in ("connect", "disconnect"):
            st.conn_failures += 1

    async def _one(self, st: StageState) -> RequestResult:
        spec = self.workload.next()
        res: RequestResult | None = None
        try:
            res = await self.client.send(spec, st.index)
        except asyncio.CancelledError:
            res = RequestResult(start=self.now(), end=self.now(), cancelled=True, stage=st.index)
            raise
        finally:
            if res is not None:
                self._record(st, res)
        return res

    def _launch(self, st: StageState) -> None:
        st.sent += 1
        task = asyncio.ensure_future(self._one(st))
        st.tasks.add(task)
        task.add_done_callback(st.tasks.discard)
        if len(st.tasks) > st.in_flight_peak:
            st.in_flight_peak = len(st.tasks)

    async def _closed_worker(self, st: StageState) -> None:
        failures = 0
        while not st.stopping and st.sent < st.cap:
            st.sent += 1
            res = await self._one(st)
            if res.error_kind in ("connect", "disconnect"):
                # a dead server must not turn the loop into a spin (nor the report into hundreds of refusals)
                await asyncio.sleep(min(TICK_S, 0.05 * 2 ** failures))
                failures += 1
            else:
                failures = 0

    async def _dispatch(self, st: StageState) -> None:
        load = st.load
        try:
            if load.kind == "concurrency":
                for _ in range(int(load.value)):
                    task = asyncio.ensure_future(self._closed_worker(st))
                    st.tasks.add(task)
                    task.add_done_callback(st.tasks.discard)
                st.in_flight_peak = int(load.value)
            elif load.kind in ("rate", "poisson"):
                await self._dispatch_rate(st, float(load.value), load.kind == "poisson")
            else:
                await self._dispatch_burst(st, int(load.value), load.every)
        finally:
            st.dispatch_done = True

    async def _dispatch_rate(self, st: StageState, rate: float, poisson: bool) -> None:
        perf = time.perf_counter
        rng = self.rng
        next_t = perf()  # the first arrival at once: R req/s for T seconds offers R x T requests
        end_t = self.t0 + st.deadline  # arrivals are scheduled up to the deadline, not beyond
        behind = 0
        first = True
        while not st.stopping and st.sent < st.cap:
            if not first:
                next_t += rng.expovariate(rate) if poisson else 1.0 / rate
            first = False
            if next_t >= end_t:  # no arrival before the deadline: the stage still lasts its duration
                while not st.stopping and perf() < end_t:
                    await asyncio.sleep(min(TICK_S, end_t - perf()))
                break
            delay = next_t - perf()
            if delay > 0:
                behind = 0
                await asyncio.sleep(delay)
            else:
                behind += 1
                if behind % 32 == 0:
                    await asyncio.sleep(0)  # let the requests we launched run
            if st.stopping:
                break
            if len(st.lags) < 200_000:
                st.lags.append(max(0.0, perf() - next_t))
            if len(st.tasks) >= self.max_inflight:
                st.not_sent += 1
                continue
            self._launch(st)

    async def _dispatch_burst(self, st: StageState, size: int, every: float) -> None:
        next_t = time.perf_counter()
        end_t = self.t0 + st.deadline
        while not st.stopping and st.sent < st.cap and next_t < end_t:
            for _ in range(min(size, st.cap - st.sent)):
                if len(st.tasks) >= self.max_inflight:
                    st.not_sent += 1
                else:
                    self._launch(st)
            next_t += every
            while not st.stopping and time.perf_counter() < min(next_t, end_t):
                await asyncio.sleep(min(TICK_S / 2, max(0.0, next_t - time.perf_counter())))

    # ---- watching ------------------------------------------------------------------------------------
    def stage_points(self, st: StageState) -> list[MetricPoint]:
        """The sampler points taken from the stage's start to the end of its drain (none of the next stage's)."""
        return self.sampler.points[st.first_point:st.last_point]

    def snapshot(self, st: StageState, now: float, *, latencies: tuple[str, ...] = ()) -> dict:
        """The figures --stop-when and the progress display read, at this moment of the stage."""
        pts = self.stage_points(st)
        latest = pts[-1] if pts else None
        vals: dict[str, float | None] = {
            "kv": latest.kv_usage if latest else None,
            "running": latest.running if latest else None,
            "waiting": latest.waiting if latest else None,
            "preemptions": None,
            "errors": float(st.errors),
            "error_rate": (st.errors / (st.ok + st.errors)) if (st.ok + st.errors) else None,
        }
        if latest and latest.preemptions_total is not None:
            base = st.preempt_base if st.preempt_base is not None else 0.0
            delta = latest.preemptions_total - base
            vals["preemptions"] = delta if delta >= 0 else latest.preemptions_total  # counter reset: restart
        if latest and latest.gpu_used_bytes is not None:
            vals["gpu_used_bytes"] = float(latest.gpu_used_bytes)
            vals["gpu_total_bytes"] = float(latest.gpu_total_bytes or 0)
        if latencies:
            window = self._window(st, now)
            for lat in latencies:
                if lat == "ttft":
                    data = sorted(r.ttft for r in window if r.ok and r.ttft is not None)
                elif lat == "e2e":
                    data = sorted(r.e2e for r in window if r.ok)
                elif lat == "tpot":
                    data = sorted(t for r in window if r.ok and (t := r.tpot) is not None)
                else:
                    data = sorted(x for r in window if r.ok and r.itls for x in r.itls)
                for p in PERCENTILES:
                    vals[f"{p}_{lat}"] = percentile(data, float(p[1:]))
        return vals

    @staticmethod
    def _window(st: StageState, now: float) -> list[RequestResult]:
        res = st.results
        i = len(res)
        lo = now - LATENCY_WINDOW_S
        floor = max(0, len(res) - LATENCY_WINDOW_MAX)
        while i > floor and (res[i - 1].end >= lo or len(res) - i < LATENCY_WINDOW_MIN):
            i -= 1
        return res[i:]

    def _server_down(self, st: StageState, now: float) -> bool:
        silence = now - st.last_answer_t
        if (st.conn_failures >= SERVER_DOWN_ERRORS and silence >= SERVER_DOWN_SILENCE_S) or \
                (st.conn_failures >= 3 and silence >= SERVER_DOWN_LONG_SILENCE_S):  # few workers back off
            last = next((r for r in reversed(st.results) if r.error), None)
            st.server_down_reason = last.error if last else "no answer"
            return True
        return False

    # ---- a stage -------------------------------------------------------------------------------------
    async def run_stage(self, load: Load, *, duration: float, max_requests: int, conditions: list[Condition],
                        drain_timeout: float = 30.0) -> StageState:
        now = self.now()
        st = StageState(index=len(self.stages), load=load, t_start=now, deadline=now + duration,
                        cap=max_requests, last_answer_t=now, drain_timeout=drain_timeout)
        self.stages.append(st)
        st.first_point = len(self.sampler.points)
        if self.sampler.engine is not None:  # a baseline for counters such as preemptions
            base = await self.sampler.sample_once()
            st.preempt_base = base.preemptions_total
            st.t_start = st.last_answer_t = self.now()  # the load starts now: the duration counts from here
            st.deadline = st.t_start + duration
        wanted = tuple(lat for lat in LATENCIES if any(c.metric.endswith("_" + lat) for c in conditions))
        dispatcher = asyncio.ensure_future(self._dispatch(st))
        interrupt = asyncio.ensure_future(self.interrupt.wait())
        try:
            while True:
                # a tick every 0.5 s, and one at the deadline, so that a stage lasts its duration
                await asyncio.wait([interrupt], timeout=min(TICK_S, max(0.001, st.deadline - self.now())))
                now = self.now()
                if self.interrupt.is_set():
                    st.ended_because = "interrupted"
                elif st.dispatch_done and not st.tasks:
                    st.ended_because = "max_requests" if st.sent >= st.cap else "duration"
                elif now >= st.deadline:
                    st.ended_because = "duration"
                elif self._server_down(st, now):
                    st.ended_because = "server_down"
                else:
                    vals = self.snapshot(st, now, latencies=wanted)
                    st.firings = evaluate(conditions, vals, now)
                    if st.firings:
                        st.ended_because = "stop_condition"
                if self.on_tick:
                    self.on_tick(self, st, self.snapshot(st, now, latencies=("ttft",)))
                if st.ended_because:
                    break
        finally:
            st.stopping = True
            st.t_end = self.now()
            interrupt.cancel()
            if not dispatcher.done():
                dispatcher.cancel()
            await asyncio.gather(dispatcher, return_exceptions=True)
            graceful = st.ended_because in ("duration", "max_requests") and drain_timeout > 0
            await self._drain(st, drain_timeout if graceful else 0.0)
            st.t_drained = self.now()
            st.last_point = len(self.sampler.points)
        return st

    async def _drain(self, st: StageState, timeout: float) -> None:
        """Let in-flight requests finish (up to timeout), then cancel the rest."""
        deadline = self.now() + timeout
        while st.tasks and self.now() < deadline and not self.interrupt.is_set():
            await asyncio.wait(list(st.tasks), timeout=min(TICK_S, max(0.01, deadline - self.now())))
            if self.on_tick:
                self.on_tick(self, st, self.snapshot(st, self.now(), latencies=("ttft",)))
        for task in list(st.tasks):
            task.cancel()
        if st.tasks:
            await asyncio.gather(*list(st.tasks), return_exceptions=True)

    async def settle(self, timeout: float = 30.0) -> None:
        """Between stages: wait until the server reports nothing running or waiting (or timeout)."""
        if self.sampler.engine is None:
            await asyncio.sleep(1.0)
            return
        deadline = self.now() + timeout
        while self.now() < deadline and not self.interrupt.is_set():
            p = await self.sampler.sample_once()
            if not (p.running or 0) and not (p.waiting or 0):
                return
            await asyncio.sleep(TICK_S)
