"""`oomguard proxy --workers N`: N processes on one port (SO_REUSEPORT), each with its own admission state.

What stays exact and what becomes approximate across workers (the README's "Proxy" section says the same):

* Watermarks and hysteresis: every worker polls every upstream itself and applies the same rule to the same
  numbers, so all pause at the high watermark and resume below the low one, within one poll interval of each
  other. Stale metrics fail closed in each worker alike. (The engine's /metrics is read N times per interval.)
* Caps: each worker gets 1/N of `--max-in-flight`, `--max-prompt-tokens-in-flight` and `--max-queue`
  (rounded down), so the totals never exceed the flags. A worker may be at its share while another has
  room: the kernel spreads *connections*, not requests, over the workers, so few long-lived client
  connections balance poorly (use one worker for those).
* Queue order: priority classes and FIFO hold within a worker, not across workers: a high request queued in
  one worker does not overtake a low one queued in another. The queue timeout is per request, unchanged.
* Retry-After: each worker divides its own queue position by its own drain rate; both are about 1/N of the
  whole, so the ratio is about the same.
* /metrics and /oomguard/status answer for all workers: the worker that gets the scrape asks its siblings
  (each also listens on a private Unix socket in a run directory) and merges their answers;
  Prometheus series carry a `worker` label.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("oomguard.proxy")


@dataclass(frozen=True)
class WorkerInfo:
    index: int  # 0..count-1
    count: int
    run_dir: str  # where each worker listens on its private Unix socket

    def socket_path(self, index: int) -> Path:
        return Path(self.run_dir) / f"worker-{index}.sock"

    def sibling_sockets(self) -> dict[int, Path]:
        """The other workers' private sockets that exist (a worker still starting has none yet)."""
        paths = {i: self.socket_path(i) for i in range(self.count) if i != self.index}
        return {i: p for i, p in paths.items() if p.exists()}


def share(value: int | None, index: int, count: int) -> int | None:
    """Worker `index`'s share of a cap, so that the shares add up to the cap exactly."""
    if value is None:
        return None
    return value // count + (1 if index < value % count else 0)


def worker_limits(limits: Any, index: int, count: int) -> Any:
    return dataclasses.replace(
        limits, max_in_flight=share(limits.max_in_flight, index, count),
        max_prompt_tokens_in_flight=share(limits.max_prompt_tokens_in_flight, index, count),
        max_queue=share(limits.max_queue, index, count))


def run_workers(count: int, serve: Callable[[WorkerInfo], None]) -> int:
    """Fork `count` workers that each call `serve(info)`; stop them all on SIGINT/SIGTERM or when one dies.

    Forked before any event loop or thread exists in this process."""
    run_dir = tempfile.mkdtemp(prefix="oomguard-proxy-")
    pids: dict[int, int] = {}
    try:
        for index in range(count):
            pid = os.fork()
            if pid == 0:  # the worker
                code = 0
                try:
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    serve(WorkerInfo(index, count, run_dir))
                except KeyboardInterrupt:
                    pass
                except BaseException as exc:  # noqa: BLE001 - report, then leave without the parent's cleanup
                    log.error("worker %d failed: %r", index, exc)
                    code = 1
                finally:
                    logging.shutdown()
                    os._exit(code)
            pids[pid] = index
        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True
            for p in pids:
                _kill(p, signal.SIGTERM)

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        status = 0
        while pids:
            try:
                pid, wait_status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            index = pids.pop(pid, None)
            if index is None:
                continue
            code = os.waitstatus_to_exitcode(wait_status)
            if not stopping:
                log.error("worker %d exited (%s); stopping the others", index, code)
                status = 1
                stopping = True
                for p in pids:
                    _kill(p, signal.SIGTERM)
        return status
    finally:
        deadline = time.monotonic() + 5
        for p in list(pids):
            _kill(p, signal.SIGTERM)
        while pids and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.05)
            else:
                pids.pop(pid, None)
        for p in pids:
            _kill(p, signal.SIGKILL)
        shutil.rmtree(run_dir, ignore_errors=True)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# ----------------------------------------------------------------------------- merging the workers' answers
async def gather_siblings(info: WorkerInfo, path: str, headers: dict[str, str], own: Any,
                          timeout: float = 2.0) -> dict[int, Any]:
    """`path` from every other worker's private socket (bytes), with this worker's own answer under its index."""
    import aiohttp

    out: dict[int, Any] = {info.index: own}

    async def one(i: int, socket_path: Path) -> None:
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket_path)),
                                             timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
                    session.get(f"http://worker{path}", headers={**headers, "x-oomguard-worker-local": "1"}) as resp:
                if resp.status == 200:
                    out[i] = await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            pass  # a worker that does not answer is left out of the merged view

    await asyncio.gather(*(one(i, p) for i, p in info.sibling_sockets().items()))
    return out


def merge_metrics(texts: dict[int, bytes]) -> bytes:
    """Prometheus text from each worker -> one exposition with a `worker` label on every sample."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Any] = {}
    for index in sorted(texts):
        for fam in text_string_to_metric_families(texts[index].decode("utf-8", "replace")):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = fam
                samples = []
            else:
                samples = merged.samples
            samples.extend(Sample(s.name, {**s.labels, "worker": str(index)}, s.value, s.timestamp, s.exemplar)
                           for s in fam.samples)
            merged.samples = samples

    class _Merged:
        def collect(self):  # noqa: ANN202 - prometheus_client's collector protocol
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())
    return generate_latest(registry)


def merge_status(snaps: dict[int, dict]) -> dict:
    """The workers' /oomguard/status answers -> one: counts summed, each upstream's state from every worker."""
    order = sorted(snaps)
    base = json.loads(json.dumps(snaps[order[0]]))  # a deep copy
    base["workers"] = len(order)
    for key in ("queue",):
        base[key] = {p: sum(s.get(key, {}).get(p, 0) for s in snaps.values()) for p in base.get(key, {})}
    base["drain_rate_per_s"] = round(sum(s.get("drain_rate_per_s", 0) for s in snaps.values()), 3)
    base["admitted"] = sum(s.get("admitted", 0) for s in snaps.values())
    rejected: dict[str, float] = {}
    for s in snaps.values():
        for reason, n in s.get("rejected", {}).items():
            rejected[reason] = rejected.get(reason, 0) + n
    base["rejected"] = rejected
    worst = {"down": 2, "paused": 1, "open": 0}
    for name, up in base.get("upstreams", {}).items():
        per = [s["upstreams"][name] for s in snaps.values() if name in s.get("upstreams", {})]
        for key in ("in_flight", "prompt_tokens_in_flight", "admitted_total"):
            up[key] = sum(p.get(key) or 0 for p in per)
        states = [p.get("state") for p in per]
        up["state"] = max(states, key=lambda x: worst.get(x, 0))
        if len(set(states)) > 1:
            up["reason"] = (up.get("reason") or "") + f" (workers: {', '.join(states)})"
    limits = base.get("limits", {})
    for key in ("max_in_flight", "max_prompt_tokens_in_flight", "max_queue"):
        values = [s.get("limits", {}).get(key) for s in snaps.values()]
        limits[key] = None if any(v is None for v in values) else sum(values)
    return base

