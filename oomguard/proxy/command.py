"""`oomguard proxy`: an OpenAI-compatible gateway that keeps an engine's KV cache out of trouble."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import ipaddress
import math
import logging
import os
import signal
import sys
from pathlib import Path
from typing import AsyncIterator

from oomguard.errors import UsageError

DESCRIPTION = """\
OpenAI-compatible gateway with KV-aware admission control.

Stops sending requests to an engine when its KV cache usage reaches --high-watermark (0.90) and resumes
below --low-watermark (0.80); queues the rest by priority (header x-priority: high|normal|low), answers
429 with Retry-After when the queue is full or a request waited too long, 503 when no engine is reachable.
Rejects prompts that cannot fit the engine's max_model_len before the engine sees them.

examples:
  oomguard proxy --upstream http://127.0.0.1:8000
  oomguard proxy --upstream http://10.0.0.5:8000 --upstream http://10.0.0.6:8000 --api-key-file keys.txt
  oomguard proxy --status http://127.0.0.1:8001
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", action="append", default=[], metavar="URL",
                   help="an OpenAI-compatible engine (vLLM, llama-server, SGLang, oomguard simulate); repeatable")
    p.add_argument("--listen", default="127.0.0.1:8001", metavar="HOST:PORT",
                   help="address to serve on (default 127.0.0.1:8001, loopback only)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes serving the port (SO_REUSEPORT), each with 1/N of the caps and its own queue; "
                        "priorities hold within a worker (default 1)")
    p.add_argument("--status", metavar="URL", help="print the live state of a running proxy as a table, then exit")
    p.add_argument("--json", action="store_true", help="with --status: print JSON instead of a table")
    g = p.add_argument_group("admission control")
    g.add_argument("--high-watermark", type=float, default=0.90,
                   help="pause an upstream when its KV usage reaches this (default 0.90)")
    g.add_argument("--low-watermark", type=float, default=0.80,
                   help="resume a paused upstream when its KV usage falls below this (default 0.80)")
    g.add_argument("--max-in-flight", type=int, default=256, help="requests in flight per upstream (default 256)")
    g.add_argument("--max-prompt-tokens-in-flight", type=int, default=None,
                   help="prompt tokens in flight per upstream (default: no cap)")
    g.add_argument("--max-queue", type=int, default=1024, help="queued requests, all priorities (default 1024)")
    g.add_argument("--queue-timeout", type=float, default=30.0,
                   help="seconds a request may wait in the queue before 429 (default 30)")
    g.add_argument("--poll-interval", type=float, default=0.5,
                   help="seconds between /metrics scrapes of each upstream (default 0.5); metrics older than "
                        "three intervals count as saturated")
    g.add_argument("--max-retry-after", type=int, default=60, help="largest Retry-After in seconds (default 60)")
    g.add_argument("--queue-while-down", action="store_true",
                   help="while no upstream is up, queue new requests (up to --queue-timeout) instead of answering "
                        "503: for an engine that is restarting (oomguard serve sets it)")
    g.add_argument("--upstream-idle-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="close an upstream response that sends nothing for this long (default 120: a prefill of "
                        "a long prompt under load; a hung engine frees the request's slot after it)")
    g = p.add_argument_group("request checks")
    g.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="a request's line and headers must arrive within this of its first byte, else 408 and the "
                        "connection closes (default 10)")
    g.add_argument("--body-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a request's body must arrive within this of its headers, else 408 (default 60)")
    g.add_argument("--keepalive-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="close a client's idle keep-alive connection after this (default 60)")
    g.add_argument("--send-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="drop a client that reads nothing of its answer for this long, so that the engine stops "
                        "working for it (default 60)")
    g.add_argument("--max-body-bytes", type=int, default=8 << 20, help="largest request body (default 8 MiB)")
    g.add_argument("--max-tokens-cap", type=int, default=None,
                   help="lower max_tokens/max_completion_tokens above this to it (and set it when absent)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer.json (or its folder) for exact prompt counts; needs the `tokenizers` package")
    g = p.add_argument_group("security")
    g.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="a key clients must send as `Authorization: Bearer KEY`; repeatable")
    g.add_argument("--api-key-file", metavar="PATH", help="client keys, one a line (# comments)")
    g.add_argument("--upstream-api-key", metavar="KEY",
                   help="key sent to the upstreams (default: $OOMGUARD_UPSTREAM_API_KEY); never a client's")
    g.add_argument("--allow-remote", action="store_true",
                   help="allow --listen on a non-loopback address without client API keys")
    g = p.add_argument_group("logging")
    g.add_argument("--no-access-log", action="store_true", help="no access log line per request")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    if args.status:
        from .status import print_status
        return print_status(args.status, api_key=(args.api_key or [None])[0], as_json=args.json)
    config, listen = config_from_args(args)
    workers = args.workers
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format=("%(asctime)s %(levelname)s %(name)s: %(message)s" if workers == 1 else
                                "%(asctime)s %(levelname)s %(name)s [%(process)d]: %(message)s"))
    if listen[1] != 0:
        _check_bindable(*listen)
    if workers == 1:
        _use_fast_loop()
        asyncio.run(_serve_forever(config, None, *listen))
        return 0
    from .workers import run_workers, worker_limits

    def serve(info) -> None:
        _use_fast_loop()
        own = dataclasses.replace(config, limits=worker_limits(config.limits, info.index, info.count))
        asyncio.run(_serve_forever(own, None, *listen, worker=info))

    return run_workers(workers, serve)


def config_from_args(args: argparse.Namespace):
    from .admission import Limits
    from .server import ProxyConfig
    from .upstreams import parse_upstream

    if not args.upstream:
        raise UsageError("give at least one --upstream URL (e.g. --upstream http://127.0.0.1:8000)")
    upstreams = [parse_upstream(u) for u in args.upstream]
    if len({u.name for u in upstreams}) != len(upstreams):
        raise UsageError("the same --upstream is given twice")
    try:
        limits = Limits(high_watermark=args.high_watermark, low_watermark=args.low_watermark,
                        max_in_flight=args.max_in_flight, max_prompt_tokens_in_flight=args.max_prompt_tokens_in_flight,
                        max_queue=args.max_queue, queue_timeout=args.queue_timeout,
                        poll_interval=args.poll_interval, max_retry_after=args.max_retry_after,
                        queue_while_down=args.queue_while_down)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    keys = list(args.api_key)
    if args.api_key_file:
        from_file = read_key_file(args.api_key_file)
        if not from_file:   # an empty file must not turn authentication off
            raise UsageError(f"--api-key-file {args.api_key_file} holds no key: one key a line")
        keys.extend(from_file)
    if any(not k for k in keys):
        raise UsageError("an API key cannot be empty")
    host, port = parse_listen(args.listen)
    host = _resolve(host)
    if not _is_loopback(host) and not keys and not args.allow_remote:
        raise UsageError(f"--listen {args.listen} is reachable from other machines: give --api-key/--api-key-file, "
                         "or --allow-remote to serve without keys")
    if not (math.isfinite(args.upstream_idle_timeout) and args.upstream_idle_timeout >= 1):
        raise UsageError(f"--upstream-idle-timeout must be at least 1 second (got {args.upstream_idle_timeout})")
    for flag in ("header_timeout", "body_timeout", "keepalive_timeout", "send_timeout"):
        value = getattr(args, flag)
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"--{flag.replace('_', '-')} must be a number of seconds above 0 (got {value})")
    if args.max_tokens_cap is not None and args.max_tokens_cap < 1:
        raise UsageError(f"--max-tokens-cap must be at least 1 (got {args.max_tokens_cap})")
    if args.max_body_bytes < 1024:
        raise UsageError("--max-body-bytes must be at least 1024")
    workers = getattr(args, "workers", 1)
    if not 1 <= workers <= 64:
        raise UsageError("--workers must be between 1 and 64")
    if workers > 1:
        if not hasattr(os, "fork"):
            raise UsageError("--workers above 1 needs a platform with fork(); use --workers 1")
        if port == 0:
            raise UsageError("--workers above 1 needs a fixed --listen port (all workers share it)")
        if args.max_in_flight < workers:
            raise UsageError(f"--max-in-flight ({args.max_in_flight}) must be at least --workers ({workers}): "
                             "each worker gets its share of the cap")
    config = ProxyConfig(upstreams=upstreams, limits=limits, api_keys=tuple(keys),
                         upstream_api_key=args.upstream_api_key or os.environ.get("OOMGUARD_UPSTREAM_API_KEY"),
                         max_body_bytes=args.max_body_bytes, max_tokens_cap=args.max_tokens_cap,
                         access_log=not args.no_access_log, tokenizer=args.tokenizer,
                         read_timeout=args.upstream_idle_timeout, header_timeout=args.header_timeout,
                         body_timeout=args.body_timeout, keepalive_timeout=args.keepalive_timeout,
                         send_timeout=args.send_timeout)
    return config, (host, port)


def _check_bindable(host: str, port: int) -> None:
    """Fail with one line if anything listens on the port already. The workers bind with SO_REUSEPORT, which
    would otherwise join another proxy's listener silently and split its traffic."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections in TIME_WAIT do not count
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def read_key_file(path: str) -> list[str]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read --api-key-file {path}: {exc.strerror}") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    try:
        port_n = int(port)
    except ValueError:
        raise UsageError(f"--listen wants HOST:PORT (got {value!r})") from None
    if not 0 <= port_n <= 65535:
        raise UsageError(f"--listen port out of range: {port_n}")
    return host, port_n


def _resolve(host: str) -> str:
    """The IP address to listen on (the server takes addresses only): `host` itself, or what the name resolves to."""
    import socket

    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError) as exc:
        raise UsageError(f"--listen host {host!r} does not resolve ({exc}); give an IP address such as 127.0.0.1") \
            from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _use_fast_loop() -> None:
    """uvloop when installed (measured faster, see benchmarks/proxy_overhead.py); asyncio's loop otherwise."""
    if os.environ.get("OOMGUARD_NO_UVLOOP"):
        return
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


@contextlib.asynccontextmanager
async def running_proxy(config, counter=None, host: str = "127.0.0.1", port: int = 0,
                        worker=None) -> AsyncIterator:
    """Start a proxy in this event loop; yields (server, base_url). For tests and embedding; port 0 picks a
    free port.

    The port is opened with SO_REUSEPORT when there are several workers, so they share it; each worker also
    answers on a private Unix socket in the run directory, where its siblings ask for its metrics."""
    from .http import HttpServer
    from .server import DROP_REQUEST_HEADERS, ProxyServer

    server = ProxyServer(config, counter, worker)
    await server.start()
    http = HttpServer(server.handle, header_timeout=config.header_timeout, body_timeout=config.body_timeout,
                      keepalive_timeout=config.keepalive_timeout, max_body_bytes=config.max_body_bytes,
                      drop_headers=DROP_REQUEST_HEADERS, send_timeout=config.send_timeout)
    try:
        many = worker is not None and worker.count > 1
        try:
            bound_port = await http.listen(host, port, reuse_port=many)
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        if many:
            await http.listen_unix(str(worker.socket_path(worker.index)))
        h = f"[{host}]" if ":" in host else host
        yield server, f"http://{h}:{bound_port}"
    finally:
        await http.close()
        await server.stop()


async def _serve_forever(config, counter, host: str, port: int, worker=None) -> None:
    log = logging.getLogger("oomguard.proxy")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with running_proxy(config, counter, host, port, worker) as (server, url):
        # What exists now (the modules, the tokenizer, the proxy's state) lives as long as the process: kept out of
        # the collector's full passes, which would otherwise walk it all every few seconds under load and stall
        # every request for ~10 ms (a p99 latency spike)
        gc.collect()
        gc.freeze()
        log.info("oomguard proxy on %s -> %s (watermarks %.2f/%.2f, queue %d, in flight %d, timeout %.0f s, "
                 "%s%s)", url, ", ".join(u.base for u in config.upstreams), config.limits.high_watermark,
                 config.limits.low_watermark, config.limits.max_queue, config.limits.max_in_flight,
                 config.limits.queue_timeout, "client keys required" if config.api_keys else "no client keys",
                 f", worker {worker.index + 1} of {worker.count}" if worker is not None else "")
        await stop.wait()
        log.info("shutting down")
