"""Restart time and requests lost over repeated crash cycles of `oomguard serve`.

    python benchmarks/serve_restart.py [--cycles 5] [--clients 4]

Runs `oomguard serve` over `oomguard simulate`, with clients looping through the proxy (retrying 429/503 as the
proxy asks) while the engine is SIGKILLed `--cycles` times; then once more with `--crash-on-kv-exhaustion` and a
load straight at the engine that makes it die like a CUDA OOM. Reports per restart: seconds from the kill to the
relaunched engine's first good /health (detection + backoff + start), and the client requests that got no
well-formed answer or no 200 within their deadline (lost; target 0).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIM = ["oomguard", "simulate", "sim-model", "--num-gpu-blocks", "60", "--max-model-len", "512", "--speed", "50"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(url: str) -> dict:
    with urllib.request.urlopen(url + "/status", timeout=5) as resp:
        return json.loads(resp.read())


def wait(url: str, predicate, timeout: float = 60) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            st = status(url)
            if predicate(st):
                return st
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting on {url}")


def complete(url: str, max_tokens: int = 32, timeout: float = 60) -> int:
    body = json.dumps({"model": "sim-model", "prompt": "hello " * 100, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        json.loads(exc.read())     # well-formed or this raises: counted lost
        return exc.code


class Clients:
    """Client loops: each request is retried on 429/503 until 200 or its 60 s deadline."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.stop = url, threading.Event()
        self.ok = self.lost = self.retries = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(n)]

    def loop(self) -> None:
        while not self.stop.is_set():
            end = time.monotonic() + 60
            while True:
                try:
                    code = complete(self.url)
                except Exception:
                    code = None
                if code == 200:
                    with self.lock:
                        self.ok += 1
                    break
                if code not in (429, 502, 503) or time.monotonic() > end:
                    with self.lock:
                        self.lost += 1
                    break
                with self.lock:
                    self.retries += 1
                time.sleep(0.2)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(90)


def run_serve(engine: list[str], log_dir: Path):
    port, sport = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "oomguard", "serve", "--listen", f"127.0.0.1:{port}",
                             "--status-listen", f"127.0.0.1:{sport}", "--restart-backoff", "0.1",
                             "--health-interval", "0.2", "--max-restarts", "100", "--", *engine],
                            stdout=open(log_dir / "engine.log", "wb"), stderr=open(log_dir / "serve.err", "wb"),
                            env=env, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{sport}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    rows = []
    proc, url, surl = run_serve([*SIM, "--max-num-seqs", "8"], log_dir)
    try:
        wait(surl, lambda s: s["state"] == "ready")
        with Clients(url, args.clients) as clients:
            for i in range(args.cycles):
                time.sleep(1.0)
                st = wait(surl, lambda s: s["state"] == "ready" and s["engine_pid"])
                t0 = time.monotonic()
                os.kill(st["engine_pid"], signal.SIGKILL)
                wait(surl, lambda s: len(s["restarts"]) == i + 1 and s["state"] == "ready")
                rows.append(("SIGKILL", time.monotonic() - t0))
            time.sleep(1.0)
        killed = (clients.ok, clients.lost, clients.retries)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    proc, url, surl = run_serve([*SIM, "--max-num-seqs", "64", "--crash-on-kv-exhaustion"], log_dir)
    try:
        st = wait(surl, lambda s: s["state"] == "ready")
        with Clients(url, args.clients) as clients:
            t0 = time.monotonic()
            threads = [threading.Thread(target=lambda: _quiet(complete, st["engine_url"], 200)) for _ in range(8)]
            for t in threads:
                t.start()
            st = wait(surl, lambda s: s["restarts"] and s["state"] == "ready")
            rows.append((f"OOM ({st['restarts'][0]['finding_class']})", time.monotonic() - t0))
            for t in threads:
                t.join()
            time.sleep(1.0)
        oom = (clients.ok, clients.lost, clients.retries)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    times = [t for _, t in rows]
    print(f"{'restart':<28}{'seconds to ready':>18}")
    for name, t in rows:
        print(f"{name:<28}{t:>18.2f}")
    print(f"\nrestart time: median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)} restarts")
    print(f"SIGKILL cycles: {killed[0]} requests answered 200, {killed[1]} lost, {killed[2]} retries (429/502/503)")
    print(f"OOM cycle:      {oom[0]} requests answered 200, {oom[1]} lost, {oom[2]} retries (429/502/503)")
    print(f"(logs in {log_dir})")
    return 0 if killed[1] == 0 and oom[1] == 0 else 1


def _quiet(fn, *a):
    try:
        fn(*a)
    except Exception:
        pass


if __name__ == "__main__":
    raise SystemExit(main())
