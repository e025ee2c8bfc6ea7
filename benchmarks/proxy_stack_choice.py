#!/usr/bin/env python3
"""Which HTTP server and client should `oomguard proxy` stand on? One run measures them all.

Each candidate pair (server in front, client behind) runs the same minimal pass-through reverse proxy: forward
the method, path, headers (hop-by-hop ones dropped) and body to one upstream through a keep-alive pool, then
send the answer back: whole when the upstream gave a Content-Length, else chunk by chunk as it arrives (SSE).
A client that goes away mid-stream aborts the upstream response (closing its connection). No admission logic.

The upstream, the load generator and the CPU accounting are those of `proxy_overhead.py` (imported, unchanged),
so the figures compare with its table. Per pair:

  checks      against a separate slow SSE upstream: a non-streaming body comes back intact; SSE events arrive
              one by one (each within 30 ms of when the upstream wrote it, not buffered); a client that
              disconnects after two events makes the proxy close its upstream connection (and how fast)
  latency     100 concurrent SSE streams (5 events 20 ms apart), closed loop: TTFB and whole-stream p50/p99,
              "added" = minus direct's (the mean of the direct runs of the same run)
  throughput  small non-streaming completions, 32 connections, closed loop: req/s, and CPU us per request of
              the proxy's process tree (the figure other jobs on a shared machine disturb least)

Plan (default `--plan auto`): every server with the aiohttp client; every client with the best server (lowest
CPU us/req among the pairs that pass the checks); then the best three pairs twice more, to show the noise.
References in the same run: direct (start, middle, end), `oomguard proxy` as shipped, and nginx when on PATH.
`--plan SERVER+CLIENT,...` measures only the pairs named.

Candidates (install them in a virtual environment of their own and run this file with its python):
  servers  aiohttp-web (web.Application), aiohttp-lowlevel (web.Server), granian RSGI (1 worker; variants for
           --runtime-threads, --loop, --runtime-mode, --task-impl), uvicorn-httptools (raw ASGI app, uvloop),
           blacksheep (on uvicorn-httptools), socketify
           oomguard-http (oomguard/proxy/http.py: an asyncio Protocol over httptools, uvloop)
  clients  aiohttp (set up as the proxy's client before pool.py), httpx, curl_cffi (AsyncSession), pyreqwest, rnet,
           pool (oomguard/proxy/pool.py: keep-alive asyncio Protocols over httptools)

Usage:
  python -m venv --system-site-packages VENV && VENV/bin/pip install granian rloop 'uvicorn[standard]' \
      blacksheep socketify httpx curl_cffi pyreqwest rnet
  VENV/bin/python benchmarks/proxy_stack_choice.py [--plan auto|PAIRS] [--duration 5] [--json out.json] [--quick]
Candidates that are not installed, or that fail to start, are reported as skipped, never faked.
Internally the same file is also the proxy (`_proxy SPEC`), the RSGI/ASGI apps and the check upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import proxy_overhead as po  # noqa: E402  (the upstream, the load generator, CPU accounting)

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding", "upgrade"})
DROP_REQUEST = HOP_BY_HOP | {"host", "content-length", "expect"}
DROP_RESPONSE = HOP_BY_HOP | {"content-length", "server", "date"}

SERVERS = {  # name -> (kind, extra options)
    "aiohttp-web": ("aiohttp-web", {}),
    "aiohttp-lowlevel": ("aiohttp-lowlevel", {}),
    "granian-rsgi": ("granian", {"runtime_threads": 1, "loop": "uvloop"}),
    "granian-rsgi-rt2": ("granian", {"runtime_threads": 2, "loop": "uvloop"}),
    "granian-rsgi-st": ("granian", {"runtime_threads": 1, "loop": "uvloop", "runtime_mode": "st"}),
    "granian-rsgi-rloop": ("granian", {"runtime_threads": 1, "loop": "rloop"}),
    "granian-rsgi-asyncio": ("granian", {"runtime_threads": 1, "loop": "asyncio"}),
    "granian-rsgi-rusttask": ("granian", {"runtime_threads": 1, "loop": "uvloop", "task_impl": "rust"}),
    "granian-embed": ("granian-embed", {}),  # granian.server.embed: the app runs in this process's own loop
    "uvicorn-httptools": ("uvicorn", {}),
    "blacksheep": ("blacksheep", {}),
    "socketify": ("socketify", {}),
    "oomguard-http": ("oomguard-http", {}),  # oomguard/proxy/http.py: an asyncio Protocol over httptools
}
CLIENTS = ("aiohttp", "httpx", "curl_cffi", "pyreqwest", "rnet", "pool")
CLIENT_MODULES = {"pool": "httptools"}  # what a client needs importable, where its name is no module
PACKAGES = ("aiohttp", "uvloop", "granian", "rloop", "uvicorn", "httptools", "blacksheep", "socketify", "httpx",
            "curl_cffi", "pyreqwest", "rnet", "orjson")


# ============================================================================================ clients
# Each: `await open(method, target, headers, body)` -> (status, headers, has_length, handle), then either
# `await read(handle)` (whole body) or `async for chunk in chunks(handle)`, and `await done(handle)` at the
# normal end or `await abort(handle)` when the client left (must close the upstream connection).

def _keep(headers) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in DROP_RESPONSE]


class _ReleasingClient:
    """Clients whose response is read whole with read(), handed back to the pool with release(), dropped with close()."""

    async def read(self, resp):
        return await resp.read()

    async def done(self, resp):
        resp.release()

    async def abort(self, resp):
        resp.close()


class AiohttpClient(_ReleasingClient):
    """As oomguard/proxy/client.py: one session, unbounded keep-alive pool, nothing a proxy does not need."""

    def __init__(self, base: str) -> None:
        import aiohttp
        from yarl import URL
        self.base, self._URL = base, URL
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60.0,
                                           enable_cleanup_closed=False),
            cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            raise_for_status=False, trust_env=False, requote_redirect_url=False, read_bufsize=1 << 18,
            timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=600.0))

    async def open(self, method, target, headers, body):
        resp = await self.session.request(method, self._URL(self.base + target, encoded=True), headers=headers,
                                          data=body if body or method == "POST" else None, allow_redirects=False)
        return resp.status, _keep(resp.headers.items()), resp.content_length is not None, resp

    async def chunks(self, resp):
        content = resp.content
        while True:
            chunk = await content.readany()
            if not chunk:
                return
            yield chunk


class HttpxClient:
    def __init__(self, base: str) -> None:
        import httpx
        self.client = httpx.AsyncClient(base_url=base, limits=httpx.Limits(max_connections=None,
                                                                           max_keepalive_connections=1024),
                                        timeout=httpx.Timeout(600.0, connect=5.0), follow_redirects=False,
                                        trust_env=False)
        self.client.headers.clear()

    async def open(self, method, target, headers, body):
        resp = await self.client.send(self.client.build_request(method, target, headers=headers, content=body),
                                      stream=True)
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.headers.raw]
        return resp.status_code, _keep(raw), "content-length" in resp.headers, resp

    async def read(self, resp):
        return await resp.aread()

    async def chunks(self, resp):
        async for chunk in resp.aiter_raw():
            yield chunk

    async def done(self, resp):
        await resp.aclose()

    abort = done  # closing an unfinished response drops its connection


class CurlCffiClient:
    def __init__(self, base: str) -> None:
        from curl_cffi.requests import AsyncSession
        self.base = base
        self.session = AsyncSession(max_clients=1024, timeout=600, allow_redirects=False, default_headers=False,
                                    trust_env=False)

    async def open(self, method, target, headers, body):
        resp = await self.session.request(method, self.base + target, headers=headers, data=body or None,
                                          stream=True)
        items = resp.headers.multi_items()
        return resp.status_code, _keep(items), "content-length" in resp.headers, resp

    async def read(self, resp):
        return await resp.acontent()

    async def chunks(self, resp):
        async for chunk in resp.aiter_content():
            yield chunk

    async def done(self, resp):
        await resp.aclose()

    async def abort(self, resp):
        resp.quit_now.set()  # aclose() alone waits for the transfer to end; this makes curl drop it
        await resp.aclose()


class PyreqwestClient:
    def __init__(self, base: str) -> None:
        from pyreqwest.client import ClientBuilder
        self.base = base
        self.client = (ClientBuilder().max_connections(None).pool_max_idle_per_host(1024).follow_redirects(False)
                       .gzip(False).brotli(False).zstd(False).deflate(False).http1_only().build())

    async def open(self, method, target, headers, body):
        req = (self.client.request(method, self.base + target).headers(headers).body_bytes(body)
               .streamed_read_buffer_limit(0).build_streamed())
        resp = await req.__aenter__()
        handle = (req, resp)
        items = list(resp.headers.items())
        return resp.status, _keep(items), "content-length" in resp.headers, handle

    async def read(self, handle):
        return bytes(await handle[1].bytes())

    async def chunks(self, handle):
        reader = handle[1].body_reader
        while True:
            chunk = await reader.read_chunk()
            if chunk is None:
                return
            yield bytes(chunk)

    async def done(self, handle):
        await handle[0].__aexit__(None, None, None)

    abort = done  # dropping an unfinished response drops its connection (hyper)


class RnetClient:
    def __init__(self, base: str) -> None:
        import rnet
        self.base, self._method = base, {m: getattr(rnet.Method, m) for m in ("GET", "POST", "PUT", "PATCH",
                                                                              "DELETE", "HEAD", "OPTIONS")}
        self.client = rnet.Client(allow_redirects=False, cookie_store=False, gzip=False, brotli=False,
                                  deflate=False, zstd=False, pool_max_idle_per_host=1024, no_proxy=True,
                                  referer=False)

    async def open(self, method, target, headers, body):
        resp = await self.client.request(self._method[method], self.base + target, headers=dict(headers),
                                         body=body)
        items = [(k.decode("latin-1") if isinstance(k, bytes) else k, v.decode("latin-1") if isinstance(v, bytes)
                  else v) for k, v in resp.headers.items()]
        status = resp.status if isinstance(resp.status, int) else resp.status.as_int()
        return status, _keep(items), "content-length" in resp.headers, resp

    async def read(self, resp):
        return await resp.bytes()

    async def chunks(self, resp):
        async for chunk in resp.stream():
            yield chunk

    async def done(self, resp):
        await resp.close()

    abort = done


class PoolClient(_ReleasingClient):
    """oomguard/proxy/pool.py: keep-alive connections as asyncio Protocols over httptools."""

    def __init__(self, base: str) -> None:
        from oomguard.proxy.pool import UpstreamPool
        self.pool = UpstreamPool(base, drop_headers=frozenset(h.encode() for h in DROP_RESPONSE))

    async def open(self, method, target, headers, body):
        lines = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers)
        resp = await self.pool.request(method, target.encode("latin-1"), lines, body)
        out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.passed]
        return resp.status, out, resp.content_length is not None, resp

    async def chunks(self, resp):
        while True:
            chunk = await resp.next_chunk()
            if not chunk:
                return
            yield chunk


CLIENT_CLASSES = {"pool": PoolClient, "aiohttp": AiohttpClient, "httpx": HttpxClient, "curl_cffi": CurlCffiClient,
                  "pyreqwest": PyreqwestClient, "rnet": RnetClient}


class Lazy:
    """The client, made on first use inside the server's running loop."""

    def __init__(self, name: str, base: str) -> None:
        self.name, self.base, self.client = name, base, None

    def get(self):
        if self.client is None:
            self.client = CLIENT_CLASSES[self.name](self.base)
        return self.client


def _env_client() -> Lazy:
    return Lazy(os.environ["STACK_CLIENT"], os.environ["STACK_UPSTREAM"])


# ============================================================================================ servers
def _fwd(items) -> list[tuple[str, str]]:
    return [(k, v) for k, v in items if k.lower() not in DROP_REQUEST]


def aiohttp_handler(lazy: Lazy):
    from aiohttp import web

    async def handler(request):
        body = await request.read()
        c = lazy.get()
        status, headers, has_length, h = await c.open(request.method, request.raw_path, _fwd(request.headers.items()),
                                                      body)
        if has_length:
            return web.Response(status=status, body=await c.read(h), headers=headers)
        out = web.StreamResponse(status=status, headers=headers)
        try:
            await out.prepare(request)
            async for chunk in c.chunks(h):
                await out.write(chunk)
        except BaseException:  # client gone (handler cancelled) or write failed
            await c.abort(h)
            raise
        await c.done(h)
        await out.write_eof()
        return out

    return handler


def serve_aiohttp(port: int, lowlevel: bool) -> None:
    po._fast_loop()
    from aiohttp import web
    handler = aiohttp_handler(_env_client())

    async def main():
        if lowlevel:
            server = web.Server(handler, handler_cancellation=True, access_log=None)
            srv = await asyncio.get_running_loop().create_server(server, "127.0.0.1", port, backlog=4096)
            async with srv:
                await srv.serve_forever()
        app = web.Application(client_max_size=8 << 20)
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        await asyncio.Event().wait()

    asyncio.run(main())


class RsgiApp:
    """Granian RSGI: a client-disconnect watcher cancels the handler while it streams."""

    def __init__(self) -> None:
        self.lazy: Lazy | None = None

    async def __rsgi__(self, scope, proto):
        if self.lazy is None:
            self.lazy = _env_client()
        body = await proto()
        c = self.lazy.get()
        target = scope.path + ("?" + scope.query_string if scope.query_string else "")
        status, headers, has_length, h = await c.open(scope.method, target, _fwd(scope.headers.items()), body)
        if has_length:
            proto.response_bytes(status, headers, await c.read(h))
            return
        transport = proto.response_stream(status, headers)
        task = asyncio.current_task()

        def gone(_fut):
            task.cancel()

        watcher = asyncio.ensure_future(proto.client_disconnect())
        watcher.add_done_callback(gone)
        try:
            async for chunk in c.chunks(h):
                await transport.send_bytes(chunk)
        except asyncio.CancelledError:  # the client left
            await c.abort(h)
            return
        except BaseException:
            watcher.remove_done_callback(gone)
            watcher.cancel()
            await c.abort(h)
            raise
        watcher.remove_done_callback(gone)
        watcher.cancel()
        await c.done(h)


rsgi_app = RsgiApp()


async def asgi_app(scope, receive, send, _state={}):  # noqa: B006 - one client per process
    """Raw ASGI 3 (uvicorn): a receive() watcher cancels the handler when the client disconnects."""
    if scope["type"] != "http":
        return
    lazy = _state.get("lazy") or _state.setdefault("lazy", _env_client())
    body, more = b"", True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    c = lazy.get()
    target = scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"]
    if scope["query_string"] and "?" not in target:
        target += "?" + scope["query_string"].decode("latin-1")
    req_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k.decode("latin-1") not in DROP_REQUEST]
    status, headers, has_length, h = await c.open(scope["method"], target, req_headers, body)
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    if has_length:
        data = await c.read(h)
        raw.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": data})
        return
    await send({"type": "http.response.start", "status": status, "headers": raw})
    task = asyncio.current_task()
    streaming = [True]

    def on_message(fut):
        if streaming[0] and not fut.cancelled() and fut.result().get("type") == "http.disconnect":
            task.cancel()

    watcher = asyncio.ensure_future(receive())
    watcher.add_done_callback(on_message)
    try:
        async for chunk in c.chunks(h):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except BaseException as exc:
        streaming[0] = False
        watcher.cancel()
        await c.abort(h)
        if isinstance(exc, asyncio.CancelledError):
            return  # the client left
        raise
    streaming[0] = False
    watcher.cancel()
    await c.done(h)
    await send({"type": "http.response.body", "body": b""})


def serve_uvicorn(port: int, app) -> None:
    import uvicorn
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", lifespan="off",
                            access_log=False, log_level="warning", backlog=4096, interface="asgi3",
                            proxy_headers=False, server_header=False, date_header=False)
    uvicorn.Server(config).run()


def serve_oomguard_http(port: int) -> None:
    """oomguard/proxy/http.py's server with the same pass-through as the others."""
    po._fast_loop()
    from oomguard.proxy.http import HttpServer

    lazy = _env_client()

    async def handler(req):
        body = await req.body(1 << 30)
        c = lazy.get()
        target = req.path + ("?" + req.query if req.query else "")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in req.raw_headers
                   if k.decode("latin-1").lower() not in DROP_REQUEST]
        status, out, has_length, h = await c.open(req.method, target, headers, body)
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out]
        if has_length:
            req.respond(status, out, await c.read(h))
            await c.done(h)
            return
        stream = req.stream(status, out)
        try:
            async for chunk in c.chunks(h):
                await stream.write(chunk)
        except BaseException:  # client gone (handler cancelled) or write failed
            await c.abort(h)
            raise
        await c.done(h)
        stream.end()

    async def main():
        server = HttpServer(handler)
        await server.listen("127.0.0.1", port)
        await asyncio.Event().wait()

    asyncio.run(main())


def serve_granian_embedded(port: int) -> None:
    po._fast_loop()
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    async def main():
        server = Server(rsgi_app, address="127.0.0.1", port=port, interface=Interfaces.RSGI, http=HTTPModes.http1,
                        websockets=False, backlog=4096, runtime_threads=1, log_enabled=False)
        await server.serve()

    asyncio.run(main())


def blacksheep_app():
    from blacksheep import Application, Content, Response, StreamedContent
    lazy = _env_client()
    app = Application()

    async def handler(request):
        body = await request.read() or b""
        c = lazy.get()
        hdrs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.items()]
        status, headers, has_length, h = await c.open(request.method, request.url.value.decode("latin-1"),
                                                      _fwd(hdrs), body)
        ctype = b"application/octet-stream"
        out = []
        for k, v in headers:
            if k.lower() == "content-type":
                ctype = v.encode("latin-1")
            else:
                out.append((k.encode("latin-1"), v.encode("latin-1")))
        if has_length:
            return Response(status, out, Content(ctype, await c.read(h)))

        async def gen():
            try:
                async for chunk in c.chunks(h):
                    yield chunk
            except BaseException:
                await c.abort(h)
                raise
            await c.done(h)

        return Response(status, out, StreamedContent(ctype, gen))

    for method in ("GET", "POST"):
        app.router.add(method, "*", handler)
    return app


def serve_socketify(port: int) -> None:
    from socketify import App
    lazy = _env_client()
    app = App()

    async def handler(res, req):
        method = req.get_method().upper()
        target = req.get_full_url()
        hdrs = _fwd(req.get_headers().items())
        body = (await res.get_data()).getvalue() if method in ("POST", "PUT", "PATCH") else b""
        task = asyncio.current_task()
        state = {"streaming": False}

        def aborted(_res):
            if state["streaming"]:
                task.cancel()

        res.on_aborted(aborted)
        c = lazy.get()
        status, headers, has_length, h = await c.open(method, target, hdrs, body)
        if res.aborted:
            await c.abort(h)
            return

        def head(r):
            r.write_status(status)
            for k, v in headers:
                r.write_header(k, v)

        if has_length:
            data = await c.read(h)
            if not res.aborted:
                res.cork(lambda r: (head(r), r.end(data)))
            return
        res.cork(head)
        state["streaming"] = True
        try:
            async for chunk in c.chunks(h):
                if res.aborted:
                    raise ConnectionResetError
                res.cork(lambda r, chunk=chunk: r.write(chunk))  # uncorked writes wait for the next loop tick
        except BaseException:
            await c.abort(h)
            return
        state["streaming"] = False
        await c.done(h)
        res.end(b"")

    app.any("/*", handler)
    app.listen(port, lambda cfg: None)
    app.run()


def run_proxy(spec: dict) -> None:
    os.environ["STACK_CLIENT"], os.environ["STACK_UPSTREAM"] = spec["client"], spec["upstream"]
    kind, port = spec["kind"], spec["port"]
    if kind in ("aiohttp-web", "aiohttp-lowlevel"):
        serve_aiohttp(port, lowlevel=kind == "aiohttp-lowlevel")
    elif kind == "uvicorn":
        serve_uvicorn(port, asgi_app)
    elif kind == "blacksheep":
        serve_uvicorn(port, blacksheep_app())
    elif kind == "socketify":
        serve_socketify(port)
    elif kind == "oomguard-http":
        serve_oomguard_http(port)
    elif kind == "granian-embed":
        serve_granian_embedded(port)
    else:
        raise SystemExit(f"unknown server kind {kind}")


# ============================================================================================ check upstream
_CHECK_BODY = json.dumps({"id": "cmpl-check", "choices": [{"text": "ok " * 50}]}).encode()


class _CheckProtocol(asyncio.Protocol):
    """Slow SSE upstream: `"max_tokens": N` events 50 ms apart; records streams cut short by the proxy."""
    state = {"aborted": 0, "completed": 0, "aborted_at": 0.0}

    def connection_made(self, transport):
        self.t, self.buf, self.streaming, self.handles = transport, b"", False, []

    def connection_lost(self, exc):
        if self.streaming:
            self.state["aborted"] += 1
            self.state["aborted_at"] = time.time()
            for handle in self.handles:
                handle.cancel()

    def data_received(self, data):
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        i = head.find(b"content-length:")
        length = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else len(head)]) if i >= 0 else 0
        if len(self.buf) < end + 4 + length:
            return
        body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
        path = head.split(b" ")[1]
        if path.startswith(b"/state"):
            self._send(b"application/json", json.dumps(self.state).encode())
        elif b'"stream": true' in body:
            n = json.loads(body).get("max_tokens", 8)
            self.streaming = True
            self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                         b"X-Check: sse\r\n\r\n")
            loop = asyncio.get_running_loop()
            for k in range(n):
                data = b"data: {\"i\": %d, \"t\": %.6f}\n\n" % (k, 0.0)
                self.handles.append(loop.call_later(k * 0.05, self._event, k))
            self.handles.append(loop.call_later(n * 0.05, self._finish))
        else:
            self._send(b"application/json", _CHECK_BODY)

    def _event(self, k):
        data = b"data: {\"i\": %d, \"t\": %.6f}\n\n" % (k, time.time())
        self.t.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _finish(self):
        data = b"data: [DONE]\n\n"
        self.t.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        self.streaming = False
        self.handles = []
        self.state["completed"] += 1

    def _send(self, ctype, body):
        self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\nX-Check: plain\r\n\r\n%s"
                     % (ctype, len(body), body))


def run_check_upstream(port: int) -> None:
    async def main():
        server = await asyncio.get_running_loop().create_server(_CheckProtocol, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


async def _read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    return int(head[9:12]), head.lower()


async def _checks(proxy_port: int, check_port: int) -> dict:
    """Body intact, SSE event by event, disconnect closes the upstream connection."""
    out: dict = {}
    # 1. non-streaming: status, body and content-type come back intact
    r, w = await asyncio.open_connection("127.0.0.1", proxy_port)
    body = b'{"model": "x", "prompt": "hi", "max_tokens": 4}'
    w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d"
            b"\r\n\r\n%s" % (len(body), body))
    status, head = await asyncio.wait_for(_read_head(r), 10)
    data = b""
    if b"content-length:" in head:
        i = head.find(b"content-length:")
        data = await r.readexactly(int(head[i + 15:head.find(b"\r\n", i)]))
    else:  # chunked
        while True:
            size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
            data += (await r.readexactly(size + 2))[:-2]
            if size == 0:
                break
    out["body_ok"] = status == 200 and data == _CHECK_BODY and b"content-type: application/json" in head \
        and b"x-check: plain" in head
    w.close()

    async def sse(n: int, stop_after: int | None):
        r, w = await asyncio.open_connection("127.0.0.1", proxy_port)
        b = json.dumps({"model": "x", "prompt": "hi", "max_tokens": n, "stream": True}).encode()
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(b), b))
        status, head = await asyncio.wait_for(_read_head(r), 10)
        lags, buf, events = [], b"", 0
        chunked = b"transfer-encoding: chunked" in head
        while True:
            if chunked:
                size = int((await asyncio.wait_for(r.readuntil(b"\r\n"), 10)).split(b";")[0], 16)
                piece = (await r.readexactly(size + 2))[:-2]
                if size == 0:
                    break
            else:
                piece = await asyncio.wait_for(r.read(65536), 10)
                if not piece:
                    break
            now = time.time()
            buf += piece
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                events += 1
                if event.startswith(b"data: {"):
                    lags.append(now - json.loads(event[6:])["t"])
                if stop_after is not None and events >= stop_after:
                    w.close()
                    return status, head, lags, events, time.time()
        w.close()
        return status, head, lags, events, time.time()

    # 2. SSE: 8 events 50 ms apart, each must arrive within 30 ms of being written upstream
    status, head, lags, events, _ = await sse(8, None)
    out["sse_events"] = events
    out["sse_max_lag_ms"] = round(max(lags) * 1000, 1) if lags else None
    out["sse_one_by_one"] = status == 200 and events == 9 and bool(lags) and max(lags) < 0.030 \
        and b"text/event-stream" in head
    # 3. disconnect after 2 of 100 events (5 s): the proxy must close its upstream connection
    state0 = json.loads(await _get(check_port, "/state"))
    _, _, _, _, t_close = await sse(100, 2)
    closed_ms = None
    deadline = time.time() + 3.0
    while time.time() < deadline:
        state = json.loads(await _get(check_port, "/state"))
        if state["aborted"] > state0["aborted"]:
            closed_ms = round(max(0.0, state["aborted_at"] - t_close) * 1000, 1)
            break
        await asyncio.sleep(0.02)
    out["disconnect_closes_upstream"] = closed_ms is not None
    out["disconnect_ms"] = closed_ms
    out["ok"] = bool(out["body_ok"] and out["sse_one_by_one"] and out["disconnect_closes_upstream"])
    return out


async def _get(port: int, path: str) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, head = await _read_head(r)
    i = head.find(b"content-length:")
    data = await r.readexactly(int(head[i + 15:head.find(b"\r\n", i)]))
    w.close()
    return data


# ============================================================================================ orchestration
_MODULES = {"oomguard-http": ("httptools", "uvloop"), "granian": ("granian",), "granian-embed": ("granian", "uvloop"),
            "uvicorn": ("uvicorn", "httptools", "uvloop"),
            "blacksheep": ("blacksheep", "uvicorn", "httptools", "uvloop"), "socketify": ("socketify",)}
_importable: dict[tuple[str, str], str | None] = {}


def missing(python: str, modules: tuple[str, ...]) -> str | None:
    """None when `python` can import every module, else what failed (checked once per module)."""
    for mod in modules:
        if (python, mod) not in _importable:
            out = subprocess.run([python, "-c", f"import {mod}"], capture_output=True, text=True, timeout=60)
            _importable[(python, mod)] = None if out.returncode == 0 else f"{mod} not importable by {python}"
        if _importable[(python, mod)]:
            return _importable[(python, mod)]
    return None


def start_pair(server: str, client: str, upstream_port: int, python: str, log: Path) -> po.Target | str:
    kind, opts = SERVERS[server]
    why = missing(python, _MODULES.get(kind, ()) + (CLIENT_MODULES.get(client, client),)
                  + (("rloop",) if opts.get("loop") == "rloop" else ()))
    if why:
        return why
    port = po.free_port()
    env = dict(os.environ, STACK_CLIENT=client, STACK_UPSTREAM=f"http://127.0.0.1:{upstream_port}",
               PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if kind == "granian":
        cmd = [python, "-m", "granian", "--interface", "rsgi", "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1", "--runtime-threads", str(opts["runtime_threads"]), "--loop", opts["loop"],
               "--http", "1", "--no-ws", "--log-level", "warning", "--backlog", "4096",
               ]
        if "runtime_mode" in opts:
            cmd += ["--runtime-mode", opts["runtime_mode"]]
        if "task_impl" in opts:
            cmd += ["--task-impl", opts["task_impl"]]
        cmd.append("proxy_stack_choice:rsgi_app")
    else:
        spec = {"kind": kind, "client": client, "port": port, "upstream": f"http://127.0.0.1:{upstream_port}"}
        cmd = [python, __file__, "_proxy", json.dumps(spec)]
    with open(log, "a") as fh:
        fh.write(f"\n=== {server}+{client}: {' '.join(cmd)}\n")
    proc = subprocess.Popen(cmd, stdout=open(log, "a"), stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        po.wait_http(f"http://127.0.0.1:{port}/health", timeout=30)
    except RuntimeError as exc:
        stop(proc)
        tail = log.read_text()[-400:].strip().splitlines()
        return f"did not start ({exc}); log: {tail[-1] if tail else ''}"
    return po.Target(f"{server}+{client}", port, proc, pid_for_rss=proc.pid)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(t: po.Target, args) -> dict:
    lat = po.load(t, args.streams, args.duration, 1.0, stream=True)
    tp = po.load(t, 32, args.duration, 1.0, stream=False)
    return {"latency": lat, "throughput": tp}


class Run:
    def __init__(self, args, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.log = tmp / "proxies.log"
        self.up_port = po.free_port()
        self.check_port = po.free_port()
        self.procs = [subprocess.Popen([sys.executable, po.__file__, "_upstream", str(self.up_port)]),
                      subprocess.Popen([sys.executable, __file__, "_check_upstream", str(self.check_port)])]
        po.wait_http(f"http://127.0.0.1:{self.up_port}/health")
        self.rows: list[dict] = []
        self.skipped: dict[str, str] = {}

    def close(self) -> None:
        for p in self.procs:
            stop(p)

    def reference(self, name: str) -> None:
        if name == "direct":
            t: po.Target | str = po.Target("direct", self.up_port)
        elif name == "oomguard":
            t = po.start_oomguard(self.up_port, self.tmp)
        else:
            t = po.start_nginx(self.up_port, self.tmp)
        if isinstance(t, str):
            self.skipped[name] = t
            return
        print(f"[run] {name}", file=sys.stderr, flush=True)
        try:
            row = {"pair": name, "server": name, "client": None, "reference": True, **measure(t, self.args)}
        finally:
            stop(t.proc)
        self.rows.append(row)
        self._print(row)

    def pair(self, server: str, client: str) -> dict | None:
        name = f"{server}+{client}"
        if name in self.skipped:
            return None
        checks = None
        t = start_pair(server, client, self.check_port, self.args.python, self.log)
        if isinstance(t, str):
            self.skipped[name] = t
            print(f"[skip] {name}: {t}", file=sys.stderr, flush=True)
            return None
        try:
            checks = asyncio.run(asyncio.wait_for(_checks(t.port, self.check_port), 60))
        except Exception as exc:  # noqa: BLE001 - a failed check is a result, not a crash
            checks = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
        finally:
            stop(t.proc)
        t = start_pair(server, client, self.up_port, self.args.python, self.log)
        if isinstance(t, str):
            self.skipped[name] = t
            return None
        print(f"[run] {name}", file=sys.stderr, flush=True)
        try:
            row = {"pair": name, "server": server, "client": client, "checks": checks, **measure(t, self.args)}
        except Exception as exc:  # noqa: BLE001
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            died = "" if t.proc.poll() is None else f"; the proxy died (exit {t.proc.returncode})"
            self.skipped[name] = f"load failed: {lines[-1].strip() if lines else exc}{died}"[:300]
            return None
        finally:
            stop(t.proc)
        self.rows.append(row)
        self._print(row)
        return row

    def _print(self, row: dict) -> None:
        lat, tp = row["latency"], row["throughput"]
        print(f"[done] {row['pair']}: ttfb {lat['ttfb_p50_ms']:.2f}/{lat['ttfb_p99_ms']:.2f} ms, stream "
              f"{lat['total_p50_ms']:.2f}/{lat['total_p99_ms']:.2f} ms, {tp['rps']:.0f} req/s, "
              f"{tp.get('proxy_cpu_us_per_req', '-')} us/req, checks {row.get('checks')}", file=sys.stderr,
              flush=True)


def _cpu(row: dict) -> float:
    return row["throughput"].get("proxy_cpu_us_per_req") or float("inf")


def best_rows(rows: list[dict], key=None) -> list[dict]:
    """Pairs that passed every check, lowest CPU us/req first (one row per pair: its best run)."""
    by_pair: dict[str, dict] = {}
    for r in rows:
        if r.get("reference") or not (r.get("checks") or {}).get("ok"):
            continue
        if key and not key(r):
            continue
        if r["pair"] not in by_pair or _cpu(r) < _cpu(by_pair[r["pair"]]):
            by_pair[r["pair"]] = r
    return sorted(by_pair.values(), key=_cpu)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_proxy"]:
        run_proxy(json.loads(argv[1]))
        return 0
    if argv[:1] == ["_check_upstream"]:
        run_check_upstream(int(argv[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", default="auto", help="auto, or SERVER+CLIENT,... (servers: %s; clients: %s)"
                    % (", ".join(SERVERS), ", ".join(CLIENTS)))
    ap.add_argument("--python", default=sys.executable, help="the python that runs the proxies (a venv's)")
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds measured per phase")
    ap.add_argument("--repeat", type=int, default=2, help="extra runs of the best three pairs (auto plan)")
    ap.add_argument("--no-references", action="store_true", help="skip oomguard and nginx")
    ap.add_argument("--quick", action="store_true", help="2-second phases, no repeats (a smoke run)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.repeat = 2.0, 0
    for pair in ([] if args.plan == "auto" else args.plan.split(",")):
        s, _, c = pair.partition("+")
        if s not in SERVERS or c not in CLIENTS:
            raise SystemExit(f"unknown pair {pair!r}: servers {', '.join(SERVERS)}; clients {', '.join(CLIENTS)}")

    tmp = Path(tempfile.mkdtemp(prefix="oomguard-stack-"))
    run = Run(args, tmp)
    t0 = time.time()
    try:
        run.reference("direct")
        if not args.no_references:
            run.reference("nginx")
            run.reference("oomguard")
        if args.plan != "auto":
            for pair in args.plan.split(","):
                s, _, c = pair.partition("+")
                run.pair(s, c)
        else:
            for server in SERVERS:  # phase A: every server with the aiohttp client
                run.pair(server, "aiohttp")
            ranked = best_rows(run.rows)
            best_server = ranked[0]["server"] if ranked else "aiohttp-web"
            for client in CLIENTS[1:]:  # phase B: every client with the best server
                run.pair(best_server, client)
            run.reference("direct")
            ranked = best_rows(run.rows)
            best_client = best_rows(run.rows, key=lambda r: r["server"] == best_server)
            if best_client and best_client[0]["client"] != "aiohttp" and len(ranked) > 1:
                # the best client may suit the runner-up server better
                runner_up = next((r["server"] for r in ranked if r["server"] != best_server), None)
                if runner_up and not any(r["pair"] == f"{runner_up}+{best_client[0]['client']}" for r in run.rows):
                    run.pair(runner_up, best_client[0]["client"])
                    ranked = best_rows(run.rows)
            top = [r["pair"] for r in ranked[:3]]
            for _ in range(args.repeat):  # phase C: the best three again, for the noise
                for pair in top:
                    s, _, c = pair.partition("+")
                    run.pair(s, c)
        run.reference("direct")
    finally:
        run.close()
    elapsed = time.time() - t0
    report = render(run.rows, run.skipped, args, elapsed)
    print(report)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": run.rows, "skipped": run.skipped, "versions": versions(),
                                               "machine": po.machine(), "args": vars(args),
                                               "elapsed_s": round(elapsed)}, indent=2))
    print(f"(proxy logs: {run.log})", file=sys.stderr)
    return 0


def versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def render(rows: list[dict], skipped: dict, args, elapsed: float) -> str:
    directs = [r["latency"] for r in rows if r["pair"] == "direct"]
    keys = ("ttfb_p50_ms", "ttfb_p99_ms", "total_p50_ms", "total_p99_ms")
    base = {k: sum(d[k] for d in directs) / len(directs) for k in keys} if directs else None
    nginx = [r["throughput"]["rps"] for r in rows if r["pair"] == "nginx"]

    def add(lat: dict, k: str) -> str:
        return "-" if base is None else f"{lat[k] - base[k]:+.2f}"

    v = versions()
    lines = [f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
             + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ";",
             f"{args.streams} concurrent SSE streams ({po.STREAM_EVENTS} events, {po.STREAM_GAP_S * 1000:.0f} ms "
             f"apart), {args.duration:.0f} s per phase; throughput at 32 connections; {elapsed / 60:.1f} min",
             "",
             "| pair (server+client) | checks: body / SSE one by one (max lag) / disconnect closes upstream | "
             "TTFB added p50 / p99 (ms) | stream added p50 / p99 (ms) | req/s @32 | CPU us/req | vs nginx | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lat, tp = r["latency"], r["throughput"]
        c = r.get("checks")
        if c is None:
            checks = "(reference)"
        elif "error" in c:
            checks = f"FAILED: {c['error']}"
        else:
            checks = (f"{'ok' if c['body_ok'] else 'BAD'} / "
                      f"{'yes' if c['sse_one_by_one'] else 'NO'} ({c['sse_max_lag_ms']} ms) / "
                      f"{'yes, %s ms' % c['disconnect_ms'] if c['disconnect_closes_upstream'] else 'NO'}")
        vs = f"{tp['rps'] / nginx[0]:.0%}" if nginx else "-"
        lines.append(f"| {r['pair']} | {checks} | {add(lat, 'ttfb_p50_ms')} / {add(lat, 'ttfb_p99_ms')} | "
                     f"{add(lat, 'total_p50_ms')} / {add(lat, 'total_p99_ms')} | {tp['rps']:.0f} | "
                     f"{tp.get('proxy_cpu_us_per_req', '-')} | {vs} | {lat['errors'] + tp['errors']} |")
    if len(directs) > 1:
        lines.append("")
        lines.append("direct runs (noise): " + "; ".join(
            f"TTFB {d['ttfb_p50_ms']:.2f}/{d['ttfb_p99_ms']:.2f}, stream {d['total_p50_ms']:.2f}/"
            f"{d['total_p99_ms']:.2f} ms" for d in directs))
    for name, why in skipped.items():
        lines.append(f"\n{name}: skipped: {why}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
