#!/usr/bin/env python3
"""Is the load generator ever the bottleneck? One `oomguard loadtest` process against a trivial local upstream.

Measures, in one run, on this machine:
  1. non-streamed requests: the highest rate one process sustains (closed loop, 64 connections), and whether an
     open-loop --rate of 2,000 req/s (and 4,000) is delivered on time (achieved rate, dispatch lag);
  2. streams: 500 concurrent streams of 64 tokens at a true 50 ms inter-token latency: how far the measured
     TTFT and ITL are from the truth (the generator's own error) and the client's CPU use;
  3. the same loads from plain peers in the same run: a minimal aiohttp loop and a minimal httpx loop (httpx
     from a throwaway venv: --peer-python VENV/bin/python), as ratios.
The upstream (`python -m testsupport.upstream`, raw asyncio) is pinned to one core and the client to
the other, so that the two do not fight for a core. Targets on 2 cores: >= 2,000 non-streamed req/s and >= 500
concurrent streams.

    python benchmarks/loadgen_speed.py [--duration 10] [--peer-python VENV/bin/python] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A minimal closed loop, the way people write one by hand; argv: lib url concurrency duration stream max_tokens
PEER = r'''
import asyncio, json, sys, time
lib, url, conc, dur, stream, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1", int(sys.argv[6])
body = {"model": "tiny-upstream", "prompt": "hello " * 16, "max_tokens": max_tokens, "stream": stream}
ttfts, itls, done = [], [], 0
async def main():
    global done
    end = time.perf_counter() + dur
    if lib == "aiohttp":
        import aiohttp
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        async def one():
            t0 = time.perf_counter(); first = last = None
            async with session.post(url + "/v1/completions", json=body) as r:
                if stream:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            now = time.perf_counter()
                            if first is None: first = now
                            else: itls.append(now - last)
                            last = now
                else:
                    await r.json()
            if stream: ttfts.append(first - t0)
    else:
        import httpx
        session = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=None), timeout=600)
        async def one():
            t0 = time.perf_counter(); first = last = None
            if stream:
                async with session.stream("POST", url + "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            now = time.perf_counter()
                            if first is None: first = now
                            else: itls.append(now - last)
                            last = now
                ttfts.append(first - t0)
            else:
                r = await session.post(url + "/v1/completions", json=body); r.json()
    async def worker():
        global done
        while time.perf_counter() < end:
            await one(); done += 1
    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    el = time.perf_counter() - t
    if lib == "aiohttp": await session.close()
    else: await session.aclose()
    def pct(v, q):
        v = sorted(v); return v[min(len(v) - 1, int(q / 100 * len(v)))] if v else None
    print(json.dumps({"requests": done, "seconds": el, "rps": done / el, "ttft_p50": pct(ttfts, 50),
                      "ttft_p99": pct(ttfts, 99), "itl_p50": pct(itls, 50), "itl_p99": pct(itls, 99)}))
asyncio.run(main())
'''


def _pin(core: int):
    def fn():
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {core})
    return fn


class Upstream:
    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "testsupport.upstream", "--port", "0", "--model",
                                      "tiny-upstream", *args],
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=_pin(1))
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            raise SystemExit(f"upstream did not start: {line!r}")
        self.url = line.split()[-1]

    def __enter__(self) -> "Upstream":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _cpu_of_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_oomguard(url: str, *load: str, duration: float, stream: bool, max_tokens: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    cmd = [sys.executable, "-m", "oomguard", "loadtest", url, *load, "--duration", f"{duration}s",
           "--prompt-tokens", "16", "--output-tokens", str(max_tokens), "--json", out, "--progress", "off",
           "--drain-timeout", "0", "--max-requests", "10000000"]
    if not stream:
        cmd.append("--no-stream")
    cpu0, t0 = _cpu_of_children(), time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, preexec_fn=_pin(0), check=False)
    cpu, wall = _cpu_of_children() - cpu0, time.perf_counter() - t0
    with open(out) as fh:
        report = json.load(fh)
    os.unlink(out)
    s = report["stages"][0]
    lat = s["latency"]
    return {"rps": s["throughput"]["requests_per_s"], "requests": s["requests"]["ok"], "errors": s["requests"]["errors"],
            "offered_rps": s["throughput"]["offered_requests_per_s"], "dispatch_lag": s["dispatch_lag_s"],
            "ttft_p50": lat["ttft_s"]["p50"], "ttft_p99": lat["ttft_s"]["p99"], "itl_p50": lat["itl_s"]["p50"],
            "itl_p99": lat["itl_s"]["p99"], "peak_in_flight": s["requests"]["peak_in_flight"],
            "cpu_s": round(cpu, 2), "wall_s": round(wall, 2)}


def run_peer(python: str, lib: str, url: str, concurrency: int, duration: float, stream: bool,
             max_tokens: int) -> dict | None:
    cpu0 = _cpu_of_children()
    proc = subprocess.run([python, "-c", PEER, lib, url, str(concurrency), str(duration), "1" if stream else "0",
                           str(max_tokens)], capture_output=True, text=True, preexec_fn=_pin(0))
    if proc.returncode != 0:
        print(f"  peer {lib} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    out = json.loads(proc.stdout)
    out["cpu_s"] = round(_cpu_of_children() - cpu0, 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    ap.add_argument("--peer-python", default=sys.executable,
                    help="interpreter with httpx (and aiohttp) for the peers, e.g. a throwaway venv with httpx installed")
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    d = a.duration
    res: dict = {"cpu_count": os.cpu_count(), "python": sys.version.split()[0], "duration_s": d}
    print(f"loadgen speed, {os.cpu_count()} cores, {d:g} s a measurement", file=sys.stderr)

    with Upstream() as up:
        print("1. non-streamed requests", file=sys.stderr)
        res["closed_64"] = run_oomguard(up.url, "--concurrency", "64", duration=d, stream=False, max_tokens=16)
        for rate in (2000, 4000):
            res[f"rate_{rate}"] = run_oomguard(up.url, "--rate", str(rate), duration=d, stream=False, max_tokens=16)
        for lib in ("aiohttp", "httpx"):
            res[f"peer_{lib}_closed_64"] = run_peer(a.peer_python, lib, up.url, 64, d, False, 16)

    with Upstream("--itl", "0.05") as up:
        print(f"2. {a.streams} concurrent streams, 64 tokens at 50 ms", file=sys.stderr)
        res["streams"] = run_oomguard(up.url, "--concurrency", str(a.streams), duration=d, stream=True, max_tokens=64)
        for lib in ("aiohttp", "httpx"):
            res[f"peer_{lib}_streams"] = run_peer(a.peer_python, lib, up.url, a.streams, d, True, 64)

    def ratio(ours: dict | None, peer: dict | None, key: str = "rps") -> str:
        if not ours or not peer or not peer.get(key):
            return "-"
        return f"{ours[key] / peer[key]:.2f}x"

    def ms(x):
        return "-" if x is None else f"{x * 1000:.1f}"

    c = res["closed_64"]
    lines = [
        "| measurement | oomguard loadtest | plain aiohttp loop | plain httpx loop |",
        "|---|---|---|---|",
        f"| non-streamed, closed loop, 64 connections: req/s | {c['rps']:.0f} | "
        f"{_get(res, 'peer_aiohttp_closed_64', 'rps')} (ours/peer {ratio(c, res.get('peer_aiohttp_closed_64'))}) | "
        f"{_get(res, 'peer_httpx_closed_64', 'rps')} (ours/peer {ratio(c, res.get('peer_httpx_closed_64'))}) |",
    ]
    for rate in (2000, 4000):
        r = res[f"rate_{rate}"]
        lag = r["dispatch_lag"] or {}
        lines.append(f"| open loop --rate {rate}: achieved req/s, dispatch lag p99 | {r['rps']:.0f}, "
                     f"{ms(lag.get('p99'))} ms | - | - |")
    s = res["streams"]
    lines.append(f"| {a.streams} streams (true TTFT 0, ITL 50 ms): TTFT p50/p99 ms | {ms(s['ttft_p50'])}/"
                 f"{ms(s['ttft_p99'])} | {ms(_get(res, 'peer_aiohttp_streams', 'ttft_p50', raw=True))}/"
                 f"{ms(_get(res, 'peer_aiohttp_streams', 'ttft_p99', raw=True))} | "
                 f"{ms(_get(res, 'peer_httpx_streams', 'ttft_p50', raw=True))}/"
                 f"{ms(_get(res, 'peer_httpx_streams', 'ttft_p99', raw=True))} |")
    lines.append(f"| {a.streams} streams: ITL p50/p99 ms | {ms(s['itl_p50'])}/{ms(s['itl_p99'])} | "
                 f"{ms(_get(res, 'peer_aiohttp_streams', 'itl_p50', raw=True))}/"
                 f"{ms(_get(res, 'peer_aiohttp_streams', 'itl_p99', raw=True))} | "
                 f"{ms(_get(res, 'peer_httpx_streams', 'itl_p50', raw=True))}/"
                 f"{ms(_get(res, 'peer_httpx_streams', 'itl_p99', raw=True))} |")
    lines.append(f"| {a.streams} streams: streams held at once; client CPU seconds | {s['peak_in_flight']}; "
                 f"{s['cpu_s']} | {a.streams}; {_get(res, 'peer_aiohttp_streams', 'cpu_s')} | "
                 f"{a.streams}; {_get(res, 'peer_httpx_streams', 'cpu_s')} |")
    table = "\n".join(lines)
    print(table)
    res["table_markdown"] = table
    ok = c["rps"] >= 2000 and res["rate_2000"]["rps"] >= 1900 and s["peak_in_flight"] >= a.streams \
        and s["errors"] == 0
    res["targets_met"] = ok
    print(f"targets (>= 2,000 non-streamed req/s, >= {a.streams} concurrent streams): "
          f"{'met' if ok else 'NOT met'}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0 if ok else 1


def _get(res: dict, key: str, field: str, raw: bool = False):
    v = (res.get(key) or {}).get(field)
    if raw:
        return v
    return "-" if v is None else (f"{v:.0f}" if isinstance(v, float) and v > 100 else f"{v:.1f}" if isinstance(v, float) else v)


if __name__ == "__main__":
    raise SystemExit(main())
