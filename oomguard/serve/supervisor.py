"""The process shell of `oomguard serve`: runs the engine and `oomguard proxy` as children, watches them, asks the
policy (policy.py) what to run after a failure, and serves its own /status and /metrics.

Events are JSON lines on stderr (`{"ts", "event", ...}`); the engine's own output goes to stdout verbatim.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

from oomguard.proxy import metric_names

from .engine import EngineCommand
from .policy import MEMORY_CLASSES, Adjustment, Outcome, next_configuration
from .state import Restart, StateDir, story

EXIT_STOPPED, EXIT_GAVE_UP, EXIT_USAGE = 0, 1, 2
HEAD_LINES, TAIL_LINES = 400, 2000
METRICS_READ_LIMIT = 4 << 20           # the proxy's /metrics is small; a cap all the same     # the log kept per run: its startup (figures) and its end (the error)
_KV_RAN_OUT = re.compile(r"KV cache (?:ran out|is full|exhausted)", re.IGNORECASE)


@dataclass(frozen=True)
class ServeConfig:
    engine: EngineCommand
    listen: tuple[str, int]
    status_listen: tuple[str, int]
    state_dir: str | None = None
    max_restarts: int = 5
    restart_backoff: float = 1.0
    ready_timeout: float = 900.0
    hang_timeout: float = 30.0
    gpu_poll: float = 60.0
    alert_at: float = 0.85
    on_alert: str | None = None
    health_interval: float = 1.0
    drain_timeout: float = 30.0
    proxy_args: tuple[str, ...] = ()
    planner_gpu: str | None = None
    vllm_version: str | None = None


def emit(event: str, **fields) -> None:
    """One structured log line on stderr."""
    line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, default=str, separators=(",", ":"))
    try:
        print(line, file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def gpu_alerts(readings: list[dict], threshold: float, alerting: set[int]) -> tuple[set[int], list[dict]]:
    """Which GPUs are at or above `threshold` now, and the readings that newly crossed it (an alert fires once per
    crossing, again only after the GPU fell below)."""
    now = {r["index"] for r in readings if r["total_bytes"] and r["used_bytes"] / r["total_bytes"] >= threshold}
    return now, [r for r in readings if r["index"] in now - alerting]


def read_gpus() -> list[dict]:
    from oomguard.gpus.nvml import detect_gpus
    return [{"index": g.index, "name": g.name, "used_bytes": g.used_bytes, "total_bytes": g.total_bytes,
             "free_bytes": g.free_bytes} for g in detect_gpus()]


class Supervisor:
    def __init__(self, config: ServeConfig, gpu_reader: Callable[[], list[dict]] = read_gpus) -> None:
        self.config = config
        self.original = config.engine
        self.engine = config.engine
        self.engine_port = free_port()
        self.state = "starting"
        self.restarts: list[Restart] = []
        self.gpu_reader = gpu_reader
        self.gpu: list[dict] = []
        self.gpu_alerting: set[int] = set()
        self.gpu_alerts_total = 0
        self.ready_seconds: list[float] = []
        self.stopping = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None
        self.proxy: asyncio.subprocess.Process | None = None
        self.proxy_url = f"http://{_host(config.listen[0])}:{config.listen[1]}"
        self.store = StateDir(config.state_dir) if config.state_dir else None
        self.last_requests: dict = {"ok": 0, "rejected": 0, "failed": 0}
        self.queue_length = 0.0
        self.started_at = time.time()
        self.run_started = 0.0
        self.oom_seen = 0
        self.engine_gauges: dict = {}    # the proxy's per-engine admission gauges, last read
        self.run_scanner = None          # the diagnose scanner reading this run's output as it comes

    # ------------------------------------------------------------------ the loop
    async def run(self) -> int:
        from aiohttp import ClientSession, ClientTimeout
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, self._on_stop_signal, sig)
        status_site = await self._serve_status()
        gpu_task = asyncio.create_task(self._poll_gpu())
        self.http = ClientSession(timeout=ClientTimeout(total=2))
        try:
            await self._start_proxy()
            code = await self._supervise()
        finally:
            gpu_task.cancel()
            await self._stop_children()
            await self.http.close()
            await status_site.cleanup()
        return code

    def _on_stop_signal(self, sig: int) -> None:
        if not self.stopping.is_set():
            emit("stop_requested", signal=signal.Signals(sig).name)
            self.state = "draining"
            self.stopping.set()

    async def _supervise(self) -> int:
        consecutive = 0
        first = True
        while not self.stopping.is_set():
            outcome, text = await self._run_once(first)
            if outcome is None:          # stopping
                return EXIT_STOPPED
            if first and not outcome.ready and outcome.exit_code == 2 and \
                    outcome.finding_class not in MEMORY_CLASSES:
                last = next((l for l in reversed(text.splitlines()) if l.strip()), "")[:300]
                print(f"oomguard: error: the engine refused its command line: {last}", file=sys.stderr)
                self.state = "gave_up"
                return EXIT_USAGE
            first = False
            consecutive = 0 if outcome.ready and time.monotonic() - self.run_started > 60 else consecutive + 1
            if len(self.restarts) >= self.config.max_restarts:
                return self._give_up(outcome, f"{self.config.max_restarts} restarts used (--max-restarts)")
            adjustment = next_configuration(self.engine, outcome)
            if adjustment is None:
                return self._give_up(outcome, "nothing left to lower on the axis the diagnosis points to")
            adjustment = self._checked(adjustment)
            before = dict(self.engine.flags)
            self.engine = self.engine.with_flags(adjustment.changes)
            record = Restart(cause=outcome.cause, finding_class=outcome.finding_class, summary=outcome.summary,
                             exit_code=outcome.exit_code, flags_before=before, flags_after=dict(self.engine.flags),
                             reason=adjustment.reason)
            self.restarts.append(record)
            self._save(None)
            delay = min(30.0, self.config.restart_backoff * 2 ** max(0, consecutive - 1))
            self.state = "restarting"
            emit("restart", n=len(self.restarts), cause=record.cause, finding_class=record.finding_class,
                 summary=record.summary, changes=adjustment.changes, reason=record.reason, backoff_s=delay)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
        return EXIT_STOPPED

    def _checked(self, adjustment: Adjustment) -> Adjustment:
        """The planner's word on the next vLLM configuration, where it can plan the model; its nearest start when
        the policy's change would not start."""
        if adjustment.same or not self.engine.is_vllm_like:
            return adjustment
        from oomguard.errors import UsageError
        from .plancheck import check
        try:
            verdict = check(self.engine.with_flags(adjustment.changes), self.config.planner_gpu,
                            self.config.vllm_version, self.config.state_dir)
        except (UsageError, ValueError) as exc:
            emit("plan_skipped", reason=str(exc)[:300])
            return adjustment
        if verdict.verdict == "adjusted":
            emit("plan_adjusted", note=verdict.note)
            return Adjustment({**adjustment.changes, **verdict.changes}, adjustment.reason + "; " + verdict.note)
        if verdict.verdict == "fails":
            emit("plan_warning", note=verdict.note)
        return adjustment

    def _give_up(self, outcome: Outcome, why: str) -> int:
        self.state = "gave_up"
        self._save(None)
        emit("gave_up", why=why, restarts=[r.to_dict() for r in self.restarts])
        last = f"last failure: {outcome.cause} (exit {outcome.exit_code}) {outcome.finding_class or ''} " \
               f"{outcome.summary}".rstrip()
        print(f"oomguard serve: gave up: {why}; {last}\n{story(self.restarts) or '  (no restarts)'}",
              file=sys.stderr, flush=True)
        return EXIT_GAVE_UP

    def _save(self, good_flags: dict | None) -> None:
        if self.store is not None:
            try:
                self.store.save(self.original.key(), good_flags, self.restarts)
            except OSError as exc:
                emit("state_dir_error", error=str(exc))

    # ------------------------------------------------------------------ one run of the engine
    async def _run_once(self, first: bool) -> tuple[Outcome | None, str]:
        argv = self.engine.argv("127.0.0.1", self.engine_port)
        self.state = "starting"
        emit("engine_start", argv=argv, port=self.engine_port, flags=self.engine.flags)
        self.run_started = time.monotonic()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        except OSError as exc:
            if first:
                from oomguard.errors import UsageError
                raise UsageError(f"cannot run the engine {argv[0]!r}: {exc.strerror or exc}") from None
            return Outcome(cause="exit", ready=False, exit_code=127, summary=str(exc)), ""
        head: list[str] = []
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        reader = asyncio.create_task(self._read_output(self.proc, head, tail))
        outcome = await self._watch(self.proc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(reader, 5)
        reader.cancel()
        text = "\n".join(head + (["..."] if len(head) + len(tail) >= HEAD_LINES + TAIL_LINES else []) + list(tail))
        if outcome is None:
            return None, text
        outcome = _diagnosed(outcome, text)
        emit("engine_ended", cause=outcome.cause, exit_code=outcome.exit_code, ready=outcome.ready,
             finding_class=outcome.finding_class, summary=outcome.summary)
        return outcome, text

    async def _read_output(self, proc, head: list[str], tail: deque) -> None:
        from oomguard.diagnose.scan import Scanner
        scanner, number = Scanner(), 0
        self.run_scanner = scanner   # what the engine says about its memory at startup is read from it (_learn)
        out = sys.stdout.buffer
        assert proc.stdout is not None
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                return
            with contextlib.suppress(BrokenPipeError, ValueError):
                out.write(raw)
                out.flush()
            line = raw.decode("utf-8", errors="replace").rstrip("\n")[:4000]
            number += 1
            (head if len(head) < HEAD_LINES else tail).append(line)
            scanner.feed(number, line, "engine")
            if scanner.oom_count > self.oom_seen:      # seen as it happens: the exit or the hang check follows
                self.oom_seen = scanner.oom_count
                emit("engine_oom_seen", line=line[:300])

    async def _watch(self, proc) -> Outcome | None:
        cfg = self.config
        ready = False
        t0 = time.monotonic()
        last_ok = t0
        url = f"http://127.0.0.1:{self.engine_port}/health"
        while True:
            waiter = asyncio.ensure_future(proc.wait())
            stopper = asyncio.ensure_future(self.stopping.wait())
            done, _ = await asyncio.wait({waiter, stopper}, timeout=cfg.health_interval,
                                         return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if waiter in done:
                code = proc.returncode
                return Outcome(cause="signal" if code is not None and code < 0 else "exit", ready=ready,
                               exit_code=code)
            waiter.cancel()
            if self.stopping.is_set():
                return None
            ok = await self._healthy(url)
            now = time.monotonic()
            if ok:
                last_ok = now
                # the user's URL is the proxy's: ready once it answers too (a loaded machine starts it after the engine)
                if not ready and (self.proxy is None or await self._healthy(self.proxy_url + "/metrics")):
                    ready = True
                    self._on_ready(now - t0)
            elif ready and now - last_ok > cfg.hang_timeout:
                emit("engine_hung", seconds_without_health=round(now - last_ok, 1))
                await self._kill(proc)
                return Outcome(cause="hang", ready=True, exit_code=proc.returncode)
            elif not ready and now - t0 > cfg.ready_timeout:
                emit("engine_not_ready", seconds=round(now - t0, 1))
                await self._kill(proc)
                return Outcome(cause="startup_timeout", ready=False, exit_code=proc.returncode)
            if self.proxy is not None and self.proxy.returncode is not None and not self.stopping.is_set():
                emit("proxy_exited", exit_code=self.proxy.returncode)
                await self._start_proxy()

    async def _healthy(self, url: str) -> bool:
        try:
            async with self.http.get(url) as resp:
                await resp.read()
                return resp.status == 200
        except Exception:
            return False

    def _on_ready(self, seconds: float) -> None:
        self.state = "ready"
        self.ready_seconds.append(seconds)
        if self.restarts and self.restarts[-1].seconds_to_ready is None:
            self.restarts[-1].seconds_to_ready = round(seconds, 2)
        self._save(dict(self.engine.flags))
        emit("engine_ready", seconds_to_ready=round(seconds, 2), flags=self.engine.flags,
             url=f"http://127.0.0.1:{self.engine_port}")
        self._learn()

    def _learn(self) -> None:
        """Keep what this start printed about its memory for the next plan of the same setup (serve/learn.py)."""
        if self.config.state_dir is None or not self.engine.is_vllm_like:
            return
        from .learn import learn
        try:
            event, fields = learn(self.engine, self.run_scanner, self.config.planner_gpu,
                                  self.config.vllm_version, self.config.state_dir)
        except Exception as exc:   # a log or a state directory we cannot use must not stop serving
            event, fields = "figures_not_kept", {"reason": repr(exc)[:200]}
        emit(event, **fields)

    async def _kill(self, proc) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)

    # ------------------------------------------------------------------ the proxy child
    async def _start_proxy(self) -> None:
        host, port = self.config.listen
        argv = [sys.executable, "-m", "oomguard", "proxy", "--upstream", f"http://127.0.0.1:{self.engine_port}",
                "--listen", f"{_host(host)}:{port}", "--queue-while-down", *self.config.proxy_args]
        self.proxy = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                          start_new_session=True)
        emit("proxy_start", argv=argv, url=self.proxy_url)

    async def _stop_children(self) -> None:
        """Drain: the proxy first (it stops taking requests and finishes those in flight), then the engine."""
        if self.proxy is not None and self.proxy.returncode is None:
            from aiohttp import ClientError
            # the last counts are best effort: a proxy not listening yet (the engine refused its command line at once)
            # or already gone keeps the previous ones, and is stopped all the same
            with contextlib.suppress(asyncio.TimeoutError, ClientError, OSError):
                self.last_requests, self.queue_length = await asyncio.wait_for(self._proxy_counts(), 2)
            with contextlib.suppress(ProcessLookupError):
                self.proxy.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proxy.wait(), self.config.drain_timeout)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proxy.kill()
                await self.proxy.wait()
            emit("proxy_stopped", exit_code=self.proxy.returncode)
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGCONT)    # a stopped engine cannot act on SIGTERM
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except asyncio.TimeoutError:
                await self._kill(proc)
            emit("engine_stopped", exit_code=proc.returncode)
        if self.state not in ("gave_up",):
            self.state = "stopped"
        emit("stopped", state=self.state, restarts=len(self.restarts), requests=self.last_requests)

    async def _proxy_counts(self) -> tuple[dict, float]:
        """requests {ok, rejected, failed} and the queue length, from the proxy's /metrics; its per-engine admission
        gauges are kept to export again."""
        from prometheus_client.parser import text_string_to_metric_families
        async with self.http.get(self.proxy_url + "/metrics") as resp:
            text = await resp.content.read(METRICS_READ_LIMIT)
        admitted = rejected = failed = queue = 0.0
        gauges: dict = {}
        for family in text_string_to_metric_families(text.decode("utf-8", "replace")):
            for s in family.samples:
                if s.name in metric_names.ENGINE_GAUGES:
                    gauges.setdefault(s.name, []).append((tuple(s.labels.get(k, "") for k in
                                                                metric_names.ENGINE_LABELS), s.value))
                elif s.name == "oomguard_proxy_admitted_total":
                    admitted += s.value
                elif s.name == "oomguard_proxy_rejected_total":
                    rejected += s.value
                elif s.name == "oomguard_proxy_upstream_errors_total":
                    failed += s.value
                    if s.labels.get("kind") == "before_response":
                        admitted -= s.value   # retried: dispatched again, counted once
                        failed -= s.value
                elif s.name == "oomguard_proxy_queue_length":
                    queue += s.value
        self.engine_gauges = gauges
        return {"ok": int(max(0, admitted - failed)), "rejected": int(rejected), "failed": int(failed)}, queue

    # ------------------------------------------------------------------ GPU memory
    async def _poll_gpu(self) -> None:
        while True:
            try:
                self.gpu = await asyncio.to_thread(self.gpu_reader)
            except Exception as exc:   # NVML hiccups must not stop serving
                emit("gpu_poll_error", error=repr(exc)[:200])
                self.gpu = []
            self.gpu_alerting, fired = gpu_alerts(self.gpu, self.config.alert_at, self.gpu_alerting)
            for r in fired:
                self.gpu_alerts_total += 1
                fraction = r["used_bytes"] / r["total_bytes"]
                emit("gpu_memory_alert", gpu=r["index"], name=r["name"], used_fraction=round(fraction, 4),
                     threshold=self.config.alert_at)
                if self.config.on_alert:
                    env = dict(os.environ, OOMGUARD_GPU_INDEX=str(r["index"]), OOMGUARD_GPU_USED_FRACTION=f"{fraction:.4f}",
                               OOMGUARD_GPU_USED_BYTES=str(r["used_bytes"]), OOMGUARD_GPU_TOTAL_BYTES=str(r["total_bytes"]))
                    with contextlib.suppress(OSError):
                        await asyncio.create_subprocess_shell(self.config.on_alert, env=env,
                                                              stdin=asyncio.subprocess.DEVNULL)
            await asyncio.sleep(self.config.gpu_poll)

    # ------------------------------------------------------------------ /status and /metrics
    async def status(self) -> dict:
        try:
            self.last_requests, self.queue_length = await self._proxy_counts()
        except Exception:
            pass   # the proxy is restarting or stopped: the last counts read
        return {"state": self.state, "engine_command": self.engine.argv(), "engine_kind": self.engine.kind,
                "engine_flags": dict(self.engine.flags), "engine_url": f"http://127.0.0.1:{self.engine_port}",
                "engine_pid": self.proc.pid if self.proc is not None and self.proc.returncode is None else None,
                "proxy_url": self.proxy_url, "uptime_s": round(time.time() - self.started_at, 1),
                "restarts": [r.to_dict() for r in self.restarts], "requests": dict(self.last_requests),
                "queue_length": self.queue_length, "engine_admission": self._admission(),
                "gpu_memory": [{**g, "used_fraction": round(g["used_bytes"] / g["total_bytes"], 4)
                                if g["total_bytes"] else None} for g in self.gpu],
                "gpu_alert_at": self.config.alert_at, "max_restarts": self.config.max_restarts}

    def _admission(self) -> dict:
        """The proxy's view of the engine from its /metrics polls: admit (1 open, 0 paused), KV headroom and
        capacity in tokens (proxy/metric_names.py)."""
        short = {metric_names.ADMIT: "admit", metric_names.KV_HEADROOM_TOKENS: "kv_headroom_tokens",
                 metric_names.KV_CAPACITY_TOKENS: "kv_capacity_tokens"}
        return {short[name]: samples[0][1] for name, samples in self.engine_gauges.items() if samples}

    async def _serve_status(self):
        from aiohttp import web
        from prometheus_client import generate_latest

        registry = _registry(self)

        async def status(_request):
            return web.json_response(await self.status())

        async def metrics(_request):
            with contextlib.suppress(Exception):
                self.last_requests, self.queue_length = await self._proxy_counts()
            return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")

        async def health(_request):
            return web.json_response({"state": self.state}, status=200 if self.state == "ready" else 503)

        app = web.Application()
        app.router.add_get("/status", status)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, port = self.config.status_listen
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()
            from oomguard.errors import UsageError
            raise UsageError(f"cannot serve the status endpoint on {host}:{port}: {exc.strerror or exc}") from None
        emit("status_listen", url=f"http://{_host(host)}:{port}/status")
        return runner


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _diagnosed(outcome: Outcome, text: str) -> Outcome:
    """The outcome with what diagnose reads in the run's log."""
    from oomguard.diagnose.pipeline import diagnose_text
    try:
        diagnosis = diagnose_text(text, use_planner=False, name="engine")
    except Exception as exc:   # a log we cannot read must not stop the recovery
        emit("diagnose_error", error=repr(exc)[:200])
        return outcome
    if not diagnosis.findings:
        return replace(outcome, facts=_numbers(dict(diagnosis.facts)))
    top = diagnosis.findings[0]
    facts = _numbers({**dict(diagnosis.facts), **top.numbers})
    fixes = tuple((f.flag, f.value) for f in top.fixes if getattr(f, "flag", None))
    return replace(outcome, finding_class=str(top.cls), summary=top.summary, fixes=fixes, facts=facts,
                   kv_exhausted=bool(_KV_RAN_OUT.search(text)))


def _numbers(facts: dict) -> dict:
    return {k: v for k, v in facts.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


def _registry(sup: Supervisor):
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    from .state import STATES

    class _Collector(Collector):
        def collect(self):
            restarts = CounterMetricFamily("oomguard_serve_restarts", "Engine restarts, by cause and finding",
                                           labels=["cause", "finding_class"])
            counts: dict = {}
            for r in sup.restarts:
                key = (r.cause, r.finding_class or "none")
                counts[key] = counts.get(key, 0) + 1
            for key, n in counts.items():
                restarts.add_metric(list(key), n)
            yield restarts
            state = GaugeMetricFamily("oomguard_serve_state", "1 for the supervisor's current state",
                                      labels=["state"])
            for s in STATES:
                state.add_metric([s], 1.0 if s == sup.state else 0.0)
            yield state
            ready = GaugeMetricFamily("oomguard_serve_time_to_ready_seconds",
                                      "Seconds from launch to the engine's first good /health, last start")
            if sup.ready_seconds:
                ready.add_metric([], sup.ready_seconds[-1])
            yield ready
            used = GaugeMetricFamily("oomguard_serve_gpu_memory_used_bytes", "GPU memory in use (NVML)",
                                     labels=["gpu"])
            total = GaugeMetricFamily("oomguard_serve_gpu_memory_total_bytes", "GPU memory (NVML)", labels=["gpu"])
            alert = GaugeMetricFamily("oomguard_serve_gpu_memory_alert",
                                      "1 while the GPU's used fraction is at or above --alert-at", labels=["gpu"])
            for g in sup.gpu:
                used.add_metric([str(g["index"])], g["used_bytes"])
                total.add_metric([str(g["index"])], g["total_bytes"])
                alert.add_metric([str(g["index"])], 1.0 if g["index"] in sup.gpu_alerting else 0.0)
            yield from (used, total, alert)
            alerts = CounterMetricFamily("oomguard_serve_gpu_memory_alerts", "GPU memory alerts fired")
            alerts.add_metric([], sup.gpu_alerts_total)
            yield alerts
            queue = GaugeMetricFamily("oomguard_serve_queue_length", "Requests waiting in the proxy's queue")
            queue.add_metric([], sup.queue_length)
            yield queue
            reqs = CounterMetricFamily("oomguard_serve_requests", "Requests through the proxy, by outcome",
                                       labels=["outcome"])
            for k, v in sup.last_requests.items():
                reqs.add_metric([k], v)
            yield reqs
            # the proxy's admission signals, under the same names and labels, so an Endpoint Picker reads them from
            # serve's /metrics as from a proxy's
            for name, samples in sup.engine_gauges.items():
                family = GaugeMetricFamily(name, metric_names.HELP[name], labels=list(metric_names.ENGINE_LABELS))
                for labels, value in samples:
                    family.add_metric(list(labels), value)
                yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return registry
