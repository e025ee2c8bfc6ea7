#!/usr/bin/env python3
"""What `oomguard proxy` costs: added latency and throughput against direct access, nginx and LiteLLM.

One run, one machine, one fast local upstream (a raw-asyncio OpenAI-like server that answers in microseconds
and streams SSE at a fixed pace), four ways to reach it:

  direct      the client talks to the upstream
  oomguard    `oomguard proxy --upstream ...` (admission control on, as shipped; --log-level warning, so
              no access-log lines, like nginx's `access_log off`)
  oomguard-2w the same with `--workers 2` (two processes on one port, SO_REUSEPORT)
  nginx       Debian's nginx as a plain reverse proxy (proxy_buffering off, keep-alive upstream pool)
  litellm     LiteLLM's proxy (`pip install 'litellm[proxy]'`), an `openai/` model pointing at the upstream

Phases, per target:
  latency     100 concurrent SSE streams (5 events 20 ms apart each), closed loop: time to first byte and to
              the last byte per request; "added" = the target's percentile minus direct's
  throughput  small non-streaming completions, closed loop at 32 and 128 connections: the higher req/s,
              and the CPU time the proxy's processes spent per request (the figure other jobs on a shared
              machine disturb least)
  memory      (oomguard only) 100,000 requests; the proxy's RSS after a 5,000-request warm-up and at the end

Usage:
  python benchmarks/proxy_overhead.py [--targets direct,oomguard,oomguard-2w,nginx,litellm]
         [--litellm-venv VENV] [--baseline OTHER_CHECKOUT] [--json out.json] [--quick]
nginx must be on PATH (apt-get install nginx-light); LiteLLM in a venv of its own (python -m venv VENV &&
VENV/bin/pip install 'litellm[proxy]'; --litellm-venv or $LITELLM_VENV). Missing ones are reported, not faked.
The `baseline` target runs the proxy of another checkout (--baseline DIR) in the same run, for before/after.
Internally the same file is also the upstream (`_upstream PORT`) and the load generator (`_load JSON`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

STREAM_EVENTS = 5
STREAM_GAP_S = 0.020

# --------------------------------------------------------------------------------------------- the upstream
_METRICS = (b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.1\n"
            b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 1\n"
            b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 0\n")
_MODELS = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "vllm",
                                                  "max_model_len": 4096}]}).encode()
_COMPLETION = json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 1, "model": "bench",
                          "choices": [{"index": 0, "text": " hello world", "logprobs": None,
                                       "finish_reason": "length"}],
                          "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}).encode()


def _chunk_event(i: int) -> bytes:
    event = {"id": "cmpl-bench", "object": "text_completion", "created": 1, "model": "bench",
             "choices": [{"index": 0, "text": f" t{i}", "logprobs": None, "finish_reason": None}]}
    data = b"data: " + json.dumps(event).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


_CHUNKS = [_chunk_event(i) for i in range(STREAM_EVENTS)]
_DONE = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


class _UpstreamProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, Content-Length bodies only (what every client here sends)."""

    def connection_made(self, transport):
        self.t = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end]
            length = 0
            lower = head.lower()
            i = lower.find(b"content-length:")
            if i >= 0:
                j = lower.find(b"\r\n", i)
                length = int(lower[i + 15:j if j > 0 else len(lower)])
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4:head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            self.answer(head, body)

    def answer(self, head: bytes, body: bytes) -> None:
        line = head[:head.find(b"\r\n")]
        path = line.split(b" ")[1]
        if path.startswith(b"/metrics"):
            self.send(b"200 OK", b"text/plain; version=0.0.4", _METRICS)
        elif path.startswith(b"/v1/models"):
            self.send(b"200 OK", b"application/json", _MODELS)
        elif path.startswith(b"/health"):
            self.send(b"200 OK", b"application/json", b"{}")
        elif b'"stream": true' in body or b'"stream":true' in body:
            self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                         b"Connection: keep-alive\r\n\r\n")
            loop = asyncio.get_running_loop()
            for i, chunk in enumerate(_CHUNKS):
                loop.call_later(i * STREAM_GAP_S, self._write, chunk)
            loop.call_later((STREAM_EVENTS - 1) * STREAM_GAP_S, self._write, _DONE)
        else:
            self.send(b"200 OK", b"application/json", _COMPLETION)

    def _write(self, data: bytes) -> None:
        if not self.t.is_closing():
            self.t.write(data)

    def send(self, status: bytes, ctype: bytes, body: bytes) -> None:
        self.t.write(b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n%s"
                     % (status, ctype, len(body), body))


def run_upstream(port: int) -> None:
    _fast_loop()

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_UpstreamProtocol, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --------------------------------------------------------------------------------------------- the load
async def _one_request(reader, writer, request: bytes) -> tuple[float, float, float, int]:
    t0 = time.perf_counter()
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    t_first = time.perf_counter()
    status = int(head[9:12])
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        first = True
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if first:
                t_first = time.perf_counter()
                first = False
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        i = lower.find(b"content-length:")
        length = int(lower[i + 15:lower.find(b"\r\n", i)])
        await reader.readexactly(length)
        t_first = time.perf_counter()
    return t0, t_first, time.perf_counter(), status


async def _load(spec: dict) -> dict:
    host, port = spec["host"], spec["port"]
    body = json.dumps(spec["body"]).encode()
    headers = "".join(f"{k}: {v}\r\n" for k, v in spec.get("headers", {}).items())
    request = (f"POST {spec['path']} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"{headers}Content-Length: {len(body)}\r\n\r\n").encode() + body
    duration, warmup = spec["duration"], spec["warmup"]
    limit = spec.get("requests")  # stop after this many (memory phase)
    samples: list[tuple[float, float, float]] = []
    errors = 0
    done = 0
    t_start = time.perf_counter()
    t_measure = t_start + warmup
    t_end = t_measure + duration

    async def worker():
        nonlocal errors, done
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        try:
            while True:
                now = time.perf_counter()
                if limit is None and now >= t_end:
                    return
                if limit is not None and done >= limit:
                    return
                done += 1
                try:
                    t0, t1, t2, status = await _one_request(reader, writer, request)
                except (asyncio.IncompleteReadError, ConnectionError):
                    errors += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
                    continue
                if status != 200:
                    errors += 1
                if t0 >= t_measure and (limit is not None or t2 <= t_end):
                    samples.append((t1 - t0, t2 - t0, t2))
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(spec["concurrency"])))
    elapsed = (time.perf_counter() - t_measure) if limit is not None else duration
    ttfb = sorted(s[0] for s in samples)
    total = sorted(s[1] for s in samples)
    return {"n": len(samples), "sent": done, "errors": errors,
            "rps": len(samples) / elapsed if elapsed > 0 else 0.0,
            "ttfb_p50_ms": _pct(ttfb, 50), "ttfb_p99_ms": _pct(ttfb, 99),
            "total_p50_ms": _pct(total, 50), "total_p99_ms": _pct(total, 99)}


def _pct(sorted_s: list[float], p: float) -> float | None:
    if not sorted_s:
        return None
    k = min(len(sorted_s) - 1, max(0, int(round(p / 100 * len(sorted_s) + 0.5)) - 1))
    return sorted_s[k] * 1000


def run_load(spec_json: str) -> None:
    _fast_loop()
    print(json.dumps(asyncio.run(_load(json.loads(spec_json)))))


def _fast_loop() -> None:
    try:
        import uvloop  # type: ignore[import-not-found]
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass


# --------------------------------------------------------------------------------------------- orchestration
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0, headers: dict | None = None) -> None:
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last = exc
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout:.0f} s ({last})")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Target:
    def __init__(self, name: str, port: int, proc: subprocess.Popen | None = None, path_prefix: str = "/v1",
                 headers: dict | None = None, model: str = "bench", pid_for_rss: int | None = None,
                 note: str = "") -> None:
        self.name, self.port, self.proc, self.prefix = name, port, proc, path_prefix
        self.headers = headers or {}
        self.model = model
        self.pid = pid_for_rss
        self.note = note


def start_oomguard(upstream_port: int, tmp: Path, env_extra: dict | None = None, workers: int = 1,
                   source: Path = REPO) -> Target:
    port = free_port()
    log = open(tmp / "oomguard.log", "w")
    env = dict(os.environ, **(env_extra or {}))
    if source != REPO:  # another checkout (--baseline): its package first on the path
        env["PYTHONPATH"] = str(source) + os.pathsep + env.get("PYTHONPATH", "")
    extra = ["--workers", str(workers)] if workers > 1 else []
    proc = subprocess.Popen([sys.executable, "-m", "oomguard", "proxy", "--upstream",
                             f"http://127.0.0.1:{upstream_port}", "--listen", f"127.0.0.1:{port}",
                             "--max-in-flight", "1024", "--log-level", "warning", *extra],
                            cwd=source, stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_http(f"http://127.0.0.1:{port}/health")
    time.sleep(0.5 if workers > 1 else 0)  # every worker up, not only the first to answer
    return Target("oomguard", port, proc, pid_for_rss=proc.pid, note=f"{workers} workers" if workers > 1 else "")


def start_nginx(upstream_port: int, tmp: Path) -> Target | str:
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        return "nginx not found (apt-get install nginx-light)"
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(textwrap.dedent(f"""\
        worker_processes auto;
        daemon off;
        pid {tmp}/nginx.pid;
        error_log {tmp}/nginx-error.log warn;
        events {{ worker_connections 4096; }}
        http {{
            access_log off;
            keepalive_requests 10000000;
            client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
            fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
            upstream engine {{ server 127.0.0.1:{upstream_port}; keepalive 256; }}
            server {{
                listen 127.0.0.1:{port};
                location / {{
                    proxy_pass http://engine;
                    proxy_http_version 1.1;
                    proxy_set_header Connection "";
                    proxy_buffering off;
                    proxy_request_buffering off;
                }}
            }}
        }}
        """))
    proc = subprocess.Popen([binary, "-c", str(conf), "-p", str(tmp)], stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "nginx.out", "w"))
    wait_http(f"http://127.0.0.1:{port}/health", timeout=20)
    return Target("nginx", port, proc, pid_for_rss=proc.pid)


def start_litellm(upstream_port: int, tmp: Path, venv: Path) -> Target | str:
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        return f"LiteLLM not found at {exe} (python -m venv {venv} && {venv}/bin/pip install 'litellm[proxy]')"
    port = free_port()
    conf = tmp / "litellm.yaml"
    conf.write_text(textwrap.dedent(f"""\
        model_list:
          - model_name: bench
            litellm_params:
              model: text-completion-openai/bench
              api_base: http://127.0.0.1:{upstream_port}/v1
              api_key: none
        litellm_settings:
          telemetry: false
          drop_params: true
          set_verbose: false
        """))
    key = "sk-oomguard-bench-" + os.urandom(8).hex()  # LiteLLM refuses to start without a master key
    env = dict(os.environ, LITELLM_MASTER_KEY=key, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False",
               LITELLM_LOG="ERROR", DISABLE_SCHEMA_UPDATE="True", NO_DOCS="True")
    proc = subprocess.Popen([str(exe), "--config", str(conf), "--host", "127.0.0.1", "--port", str(port),
                             "--num_workers", "1"], stdout=open(tmp / "litellm.log", "w"),
                            stderr=subprocess.STDOUT, env=env, cwd=tmp)
    try:
        wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout=180)
    except RuntimeError as exc:
        proc.kill()
        return f"LiteLLM did not start: {exc}"
    return Target("litellm", port, proc, headers={"Authorization": f"Bearer {key}"}, note="1 worker",
                  pid_for_rss=proc.pid)


def tree_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of `pid` and all its descendants (nginx's and --workers' children)."""
    if pid is None:
        return None
    stats: dict[int, tuple[int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen or p not in stats:
            continue
        seen.add(p)
        total += stats[p][1]
        todo.extend(c for c, (ppid, _) in stats.items() if ppid == p)
    return total


def load(target: Target, concurrency: int, duration: float, warmup: float, stream: bool,
         requests: int | None = None) -> dict:
    spec = {"host": "127.0.0.1", "port": target.port, "path": target.prefix + "/completions",
            "body": {"model": target.model, "prompt": "Say hello", "max_tokens": 8, "stream": stream},
            "headers": target.headers, "concurrency": concurrency, "duration": duration, "warmup": warmup,
            "requests": requests}
    cpu_before = tree_cpu_s(target.pid)
    out = subprocess.run([sys.executable, __file__, "_load", json.dumps(spec)], capture_output=True, text=True,
                         timeout=duration + warmup + 600)
    cpu = None if cpu_before is None else tree_cpu_s(target.pid) - cpu_before
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if cpu is not None and result.get("sent"):
        # CPU seconds the proxy (all its processes) spent per request sent, warm-up included: the figure
        # least disturbed by other jobs on the machine
        result["proxy_cpu_us_per_req"] = round(cpu / result["sent"] * 1e6, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_upstream"]:
        run_upstream(int(argv[1]))
        return 0
    if argv[:1] == ["_load"]:
        run_load(argv[1])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="direct,oomguard,oomguard-2w,nginx,litellm")
    ap.add_argument("--litellm-venv", default=os.environ.get("LITELLM_VENV", "litellm-venv"))
    ap.add_argument("--baseline", metavar="DIR", help="another oomguard checkout, measured as the `baseline` target")
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds measured per phase")
    ap.add_argument("--memory-requests", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="short phases, 10k memory requests (a smoke run)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.memory_requests = 3.0, 10_000
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]

    tmp = Path(tempfile.mkdtemp(prefix="oomguard-bench-"))
    up_port = free_port()
    upstream = subprocess.Popen([sys.executable, __file__, "_upstream", str(up_port)])
    procs: list[subprocess.Popen] = [upstream]
    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health")
        for name in targets:
            if name == "direct":
                t: Target | str = Target("direct", up_port)
            elif name == "oomguard":
                t = start_oomguard(up_port, tmp)
            elif name == "oomguard-asyncio":  # the same without uvloop, to justify the choice
                t = start_oomguard(up_port, tmp, {"OOMGUARD_NO_UVLOOP": "1"})
                t.name = name
            elif name.startswith("oomguard-") and name.endswith("w") and name[9:-1].isdigit():
                t = start_oomguard(up_port, tmp, workers=int(name[9:-1]))
                t.name = name
            elif name == "baseline":  # another checkout of oomguard, for before/after comparisons
                if not args.baseline:
                    raise SystemExit("the baseline target needs --baseline DIR (a checkout of oomguard)")
                t = start_oomguard(up_port, tmp, source=Path(args.baseline).resolve())
                t.name, t.note = name, Path(args.baseline).name
            elif name == "nginx":
                t = start_nginx(up_port, tmp)
            elif name == "litellm":
                t = start_litellm(up_port, tmp, Path(args.litellm_venv))
            else:
                raise SystemExit(f"unknown target {name}")
            if isinstance(t, str):
                skipped[name] = t
                print(f"[skip] {name}: {t}", file=sys.stderr)
                continue
            if t.proc is not None:
                procs.append(t.proc)
            print(f"[run] {name} on port {t.port}", file=sys.stderr)
            r: dict = {"note": t.note}
            r["latency"] = load(t, args.streams, args.duration, 1.0, stream=True)
            best = None
            for conc in (32, 128):
                tp = load(t, conc, args.duration, 1.0, stream=False)
                tp["concurrency"] = conc
                if best is None or tp["rps"] > best["rps"]:
                    best = tp
            r["throughput"] = best
            if name == "oomguard" and t.pid and args.memory_requests:
                load(t, 64, 0, 0, stream=False, requests=5_000)
                before = rss_kib(t.pid)
                m = load(t, 64, 0, 0, stream=False, requests=args.memory_requests)
                after = rss_kib(t.pid)
                r["memory"] = {"requests": args.memory_requests, "rss_before_kib": before, "rss_after_kib": after,
                               "growth_kib": after - before, "errors": m["errors"], "rps": m["rps"]}
            results[name] = r
            print(f"[done] {name}: {json.dumps(r)}", file=sys.stderr)
            if t.proc is not None:
                t.proc.send_signal(signal.SIGTERM)
                try:
                    t.proc.wait(10)
                except subprocess.TimeoutExpired:
                    t.proc.kill()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    table = render(results, skipped, args)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "skipped": skipped,
                                               "machine": machine()}, indent=2))
    return 0


def machine() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0],
            **{name: installed(name) for name in ("httptools", "orjson", "uvloop", "granian", "aiohttp")}}


def render(results: dict, skipped: dict, args) -> str:
    direct = results.get("direct", {}).get("latency", {})
    nginx_rps = results.get("nginx", {}).get("throughput", {}).get("rps")
    litellm_rps = results.get("litellm", {}).get("throughput", {}).get("rps")

    def ms(r: dict, key: str) -> str:  # a target that completed no request in a phase has no percentiles
        return "-" if r.get(key) is None else f"{r[key]:.2f}"

    def add(r: dict, key: str) -> str:
        if not direct or r.get(key) is None or direct.get(key) is None:
            return "-"
        return f"{r[key] - direct[key]:+.2f}"

    m = machine()
    lines = [f"{m['cpus']} CPUs, Python {m['python']}, httptools {m['httptools']}, orjson {m['orjson']}, "
             f"uvloop {m['uvloop']}; "
             f"{args.streams} concurrent SSE streams ({STREAM_EVENTS} events, {STREAM_GAP_S * 1000:.0f} ms apart)",
             "",
             "| path | TTFB p50 / p99 (ms) | added p50 / p99 (ms) | stream p50 / p99 (ms) | added p50 / p99 (ms) "
             "| max req/s (conns) | CPU us/req | vs nginx | vs LiteLLM | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lat, tp = r["latency"], r["throughput"]
        vs_nginx = f"{tp['rps'] / nginx_rps:.0%}" if nginx_rps else "-"
        vs_litellm = f"{tp['rps'] / litellm_rps:.1f}x" if litellm_rps else "-"
        label = name + (f" ({r['note']})" if r.get("note") else "")
        lines.append(
            f"| {label} | {ms(lat, 'ttfb_p50_ms')} / {ms(lat, 'ttfb_p99_ms')} | {add(lat, 'ttfb_p50_ms')} / "
            f"{add(lat, 'ttfb_p99_ms')} | {ms(lat, 'total_p50_ms')} / {ms(lat, 'total_p99_ms')} | "
            f"{add(lat, 'total_p50_ms')} / {add(lat, 'total_p99_ms')} | {tp['rps']:.0f} ({tp['concurrency']}) | "
            f"{tp.get('proxy_cpu_us_per_req', '-')} | {vs_nginx} | {vs_litellm} | {lat['errors'] + tp['errors']} |")
    for name, r in results.items():
        if "memory" in r:
            mem = r["memory"]
            lines.append("")
            lines.append(f"{name} memory: RSS {mem['rss_before_kib'] / 1024:.1f} MiB after 5,000 warm-up requests, "
                         f"{mem['rss_after_kib'] / 1024:.1f} MiB after {mem['requests']:,} more "
                         f"({mem['growth_kib'] / 1024:+.1f} MiB, {mem['errors']} errors, {mem['rps']:.0f} req/s)")
    for name, why in skipped.items():
        lines.append(f"\n{name}: skipped: {why}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
