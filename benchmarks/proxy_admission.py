#!/usr/bin/env python3
"""Does `oomguard proxy`'s admission keep the engine out of trouble? The same overload, direct and through the proxy.

One run: a simulated vLLM (`oomguard simulate`) whose KV cache holds about three requests while `--max-num-seqs`
lets eight in, driven by the same closed-loop load (`oomguard loadtest --concurrency 8`), first directly, then
through `oomguard proxy` with its defaults. The engine's own counters (preemptions, finished requests) are read from
its /metrics before and after each phase, so the proxy's figures cannot flatter it.

Targets (issue 17): 0 preemptions through the proxy; requests completed through the proxy at least 90% of direct's.
Also reported: TTFT p99 of the requests that were admitted, and end-to-end p99 as the client saw it.

Usage: python benchmarks/proxy_admission.py [--seconds 20] [--concurrency 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], url: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "oomguard", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.2)
    stop(proc)
    raise SystemExit(f"{' '.join(args[:2])} did not come up at {url}")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def counters(engine_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(engine_url + "/metrics", timeout=5).read().decode()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([\d.e+-]+)$", text, re.M))

    return {"preemptions": total("vllm:num_preemptions_total"), "finished": total("vllm:request_success_total")}


def load(url: str, seconds: float, concurrency: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "oomguard", "loadtest", url, "--concurrency", str(concurrency),
                    "--duration", f"{seconds}s", "--prompt-tokens", "100", "--output-tokens", "100",
                    "--progress", "off", "--json", str(out), "--no-gpu"], cwd=ROOT, capture_output=True, timeout=600)
    return json.loads(out.read_text())["stages"][0]


def phase(name: str, target: str, engine: str, seconds: float, concurrency: int, tmp: Path) -> dict:
    before = counters(engine)
    stage = load(target, seconds, concurrency, tmp / f"{name}.json")
    after = counters(engine)
    lat = stage["latency"]
    return {"target": name, "completed": stage["requests"]["ok"], "errors": stage["requests"]["errors"],
            "preemptions": after["preemptions"] - before["preemptions"],
            "ttft_p99_s": lat["ttft_s"]["p99"], "e2e_p99_with_unfinished_s": lat["e2e_with_unfinished_s"]["p99"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    sim_port, proxy_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{sim_port}"
    proxy = f"http://127.0.0.1:{proxy_port}"
    # 40 blocks of 16 tokens (39 usable): three requests of 100 + 100 tokens (13 blocks each) fit, eight may run
    sim = start(["simulate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "l4", "--num-gpu-blocks", "40",
                 "--max-model-len", "512", "--max-num-seqs", "8", "--speed", "20", "--port", str(sim_port)],
                engine + "/health")
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(phase("direct", engine, engine, args.seconds, args.concurrency, Path(tmp)))
            gate = start(["proxy", "--upstream", engine, "--listen", f"127.0.0.1:{proxy_port}", "--log-level",
                          "warning"], proxy + "/health")
            try:
                rows.append(phase("oomguard proxy", proxy, engine, args.seconds, args.concurrency, Path(tmp)))
            finally:
                stop(gate)
    finally:
        stop(sim)
    direct, proxied = rows
    verdict = {"zero_preemptions": proxied["preemptions"] == 0,
               "completed_vs_direct": round(proxied["completed"] / max(1, direct["completed"]), 3)}
    verdict["met"] = verdict["zero_preemptions"] and verdict["completed_vs_direct"] >= 0.9
    print(f"{'target':<16} {'completed':>9} {'errors':>6} {'preemptions':>11} {'TTFT p99 s':>10} {'E2E p99 s*':>10}")
    for r in rows:
        print(f"{r['target']:<16} {r['completed']:>9} {r['errors']:>6} {r['preemptions']:>11.0f} "
              f"{r['ttft_p99_s'] or 0:>10.3f} {r['e2e_p99_with_unfinished_s'] or 0:>10.3f}")
    print(f"* unfinished requests counted at the time they were cancelled\nproxy vs direct: "
          f"{verdict['completed_vs_direct']:.0%} of the requests completed, "
          f"{proxied['preemptions']:g} preemptions "
          f"(targets: 0, >= 90%): {'met' if verdict['met'] else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "verdict": verdict}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
