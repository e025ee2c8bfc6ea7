#!/usr/bin/env python3
"""Does `oomguard proxy`'s admission keep the engine out of trouble? The same overload, direct and through the proxy.

One run: a simulated vLLM (`oomguard simulate`) whose KV cache holds about three requests while `--max-num-seqs`
lets eight in, driven by the same closed-loop load (`oomguard loadtest --concurrency 8`), first directly, then
through `oomguard proxy` with its defaults. The engine's own counters (preemptions, finished requests) are read from
its /metrics before and after each phase, so the proxy's figures cannot flatter it.

Targets (issue 17): 0 preemptions through the proxy; requests completed through the proxy at least 90% of direct's.
Also reported: TTFT p99 of the requests that were admitted, and end-to-end p99 as the client saw it.

And the bound any admission without preemptions has here, in the same run: the simulator's own scheduler
(oomguard/simulate/scheduler.py) and step times, offline, driven directly and behind an exact gate that admits a
request only when the engine's block count can never exceed its cache over the requests' whole future (exact
prompt tokens, no margin). Preempted requests are recomputed, which costs about one memory-bound step here, so
direct runs more requests at once than any preemption-free schedule can: the gate's share of direct's completions is
the most the proxy could reach.

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


# the engine and the load: 40 blocks of 16 tokens (39 usable) hold three requests of 100 + 100 tokens (13 blocks
# each), while --max-num-seqs lets eight run
MODEL, GPU, BLOCKS, MAX_MODEL_LEN, MAX_NUM_SEQS, SPEED = "meta-llama/Llama-3.1-8B-Instruct", "l4", 40, 512, 8, 20
PROMPT_TOKENS, OUTPUT_TOKENS = 100, 100


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
                    "--duration", f"{seconds}s", "--prompt-tokens", str(PROMPT_TOKENS), "--output-tokens",
                    str(OUTPUT_TOKENS),
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


def zero_preemption_bound(seconds: float, concurrency: int) -> dict:
    """Completions offline, direct and behind the exact no-preemption gate, with the benchmark's engine and load."""
    sys.path.insert(0, str(ROOT))
    from oomguard.simulate.plan import plan_simulation
    from oomguard.simulate.scheduler import Scheduler, SchedulerConfig, SimRequest
    from oomguard.simulate.timing import Roofline

    plan = plan_simulation(MODEL, GPU, flags={"max_model_len": MAX_MODEL_LEN, "max_num_seqs": MAX_NUM_SEQS},
                           num_gpu_blocks=BLOCKS)
    roofline = Roofline(plan.flops_per_token, plan.weights_bytes, plan.kv_bytes_per_token, plan.peak_flops,
                        plan.bandwidth, SPEED)
    usable = plan.num_gpu_blocks - 1

    def fits_forever(inside: list, new) -> bool:
        # (tokens held, tokens still to generate) of each request; step k from now each holds held + k + 1
        reqs = [(r.num_tokens, r.max_tokens - r.num_output_tokens) for r in inside] + [(new.prompt_len,
                                                                                        new.max_tokens)]
        return all(sum(-(-(held + k + 1) // plan.block_size) for held, left in reqs if k < left) <= usable
                   for k in range(max(left for _, left in reqs)))

    def run(gated: bool) -> tuple[int, int, float]:
        engine = Scheduler(SchedulerConfig(plan.num_gpu_blocks, plan.block_size, MAX_MODEL_LEN, MAX_NUM_SEQS,
                                           plan.max_num_batched_tokens))
        made = iter(range(1 << 30))
        held = [SimRequest(f"r{next(made)}", PROMPT_TOKENS, OUTPUT_TOKENS) for _ in range(concurrency)]
        inside: dict[str, SimRequest] = {}
        clock, completed, running = 0.0, 0, 0.0
        while clock < seconds:
            while held and (not gated or fits_forever(list(inside.values()), held[0])):
                request = held.pop(0)
                inside[request.request_id] = request
                engine.add_request(request)
            output = engine.schedule()
            step = roofline.step_seconds(output)
            clock += step
            running += len(engine.running) * step
            for event in engine.update(output):
                if event.finish_reason:
                    completed += 1
                    inside.pop(event.request_id)
                    held.append(SimRequest(f"r{next(made)}", PROMPT_TOKENS, OUTPUT_TOKENS))
        return completed, engine.num_preemptions_total, running / clock

    (direct, preempted, direct_running), (gate, gate_preempted, gate_running) = run(False), run(True)
    assert gate_preempted == 0
    return {"direct_completed": direct, "direct_preemptions": preempted, "direct_running": round(direct_running, 2),
            "gate_completed": gate, "gate_running": round(gate_running, 2),
            "gate_vs_direct": round(gate / max(1, direct), 3)}


def best_periodic_schedule(max_starts: int = 4, block_size: int = 16) -> tuple[float, int, tuple[int, ...]]:
    """The most requests running at once on average over periodic start schedules (up to `max_starts` starts a
    period) that never need more blocks than the cache: (requests at once, period in steps, start offsets).
    A request holds cdiv(prompt + age + 1, block size) blocks at each of its OUTPUT_TOKENS steps."""
    import itertools
    life, usable = OUTPUT_TOKENS, BLOCKS - 1
    need = [-(-(PROMPT_TOKENS + age + 1) // block_size) for age in range(life)]

    def fits(period: int, offsets: tuple[int, ...]) -> bool:
        for t in range(period):
            total = 0
            for o in offsets:
                age = (t - o) % period
                while age < life:
                    total += need[age]
                    age += period
            if total > usable:
                return False
        return True

    best = (0.0, 0, ())
    for k in range(1, max_starts + 1):
        # periods from the densest the fluid bound (usable blocks / mean blocks a request) allows, until one fits
        densest = max(1, int(life * k * sum(need) / life / usable))
        for period in range(densest, life * k + 1):
            if life * k / period <= best[0]:
                break
            hit = next((o for o in itertools.combinations(range(1, period), k - 1) if fits(period, (0, *o))), None)
            if hit is not None:
                best = (life * k / period, period, (0, *hit))
                break
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--search-schedules", action="store_true",
                        help="also search periodic start schedules for the densest preemption-free one (minutes)")
    args = parser.parse_args(argv)
    sim_port, proxy_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{sim_port}"
    proxy = f"http://127.0.0.1:{proxy_port}"
    sim = start(["simulate", MODEL, "--gpu", GPU, "--num-gpu-blocks", str(BLOCKS), "--max-model-len",
                 str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS), "--speed", str(SPEED), "--port",
                 str(sim_port)], engine + "/health")
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
    bound = zero_preemption_bound(args.seconds, args.concurrency)
    verdict["no_preemption_bound_vs_direct"] = bound["gate_vs_direct"]
    print(f"{'target':<16} {'completed':>9} {'errors':>6} {'preemptions':>11} {'TTFT p99 s':>10} {'E2E p99 s*':>10}")
    for r in rows:
        print(f"{r['target']:<16} {r['completed']:>9} {r['errors']:>6} {r['preemptions']:>11.0f} "
              f"{r['ttft_p99_s'] or 0:>10.3f} {r['e2e_p99_with_unfinished_s'] or 0:>10.3f}")
    print(f"* unfinished requests counted at the time they were cancelled\nproxy vs direct: "
          f"{verdict['completed_vs_direct']:.0%} of the requests completed, "
          f"{proxied['preemptions']:g} preemptions "
          f"(targets: 0, >= 90%): {'met' if verdict['met'] else 'NOT met'}")
    print(f"bound, offline on the simulator's scheduler: an exact gate that never lets the engine preempt completes "
          f"{bound['gate_completed']} where direct completes {bound['direct_completed']} "
          f"({bound['direct_preemptions']} preemptions): {bound['gate_vs_direct']:.0%}; requests running at once "
          f"{bound['gate_running']} gated, {bound['direct_running']} direct")
    if args.search_schedules:
        running, period, offsets = best_periodic_schedule()
        bound["best_periodic_schedule"] = {"requests_at_once": round(running, 3), "period_steps": period,
                                           "offsets": offsets}
        print(f"densest periodic preemption-free schedule (up to 4 starts a period): {running:.2f} requests at once "
              f"(period {period} steps, starts at {offsets})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "verdict": verdict, "bound": bound}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
