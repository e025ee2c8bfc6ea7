"""A fake OpenAI-compatible engine for the proxy tests: a real aiohttp server on 127.0.0.1 whose /metrics,
timing and failures the test controls. (Helpers, plus a self-check of the fake itself.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from typing import Any

import aiohttp
from aiohttp import web


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeEngine:
    """vLLM-like: /v1/models with max_model_len, /v1/completions and /v1/chat/completions (SSE or not),
    /metrics with vllm:kv_cache_usage_perc etc., /health."""

    def __init__(self, port: int | None = None, model: str = "fake-model", max_model_len: int = 4096) -> None:
        self.port = port or free_port()
        self.model = model
        self.max_model_len = max_model_len
        self.kv_usage = 0.1
        self.running = 0
        self.waiting = 0
        self.metrics_delay = 0.0  # seconds /metrics takes (to make metrics stale)
        self.metrics_status = 200
        self.metrics_padding = 0  # bytes of comment lines added to /metrics (a page larger than any engine's)
        self.chunks = 3  # SSE chunks per streamed answer
        self.chunk_delay = 0.0
        self.hold: asyncio.Event | None = None  # when set to an Event, requests wait for it
        self.die_after_chunks: int | None = None  # close the connection mid-stream
        self.error_status: int | None = None  # answer every inference request with this status
        self.answer_bytes = 0  # answer inference with this many bytes: SSE events of 64 KiB, or a plain body
        self.seen: list[dict[str, Any]] = []  # every inference request: path, headers, body
        self.active = 0
        self.cancelled = 0
        self.completed = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "FakeEngine":
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._infer)
        app.router.add_post("/v1/chat/completions", self._infer)
        app.router.add_post("/v1/embeddings", self._embed)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        return self

    async def stop(self) -> None:
        """Like a killed process: the port closes and open connections drop."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            for site in list(runner.sites):
                server = getattr(site, "_server", None)
                if server is not None:
                    server.close()
            server = runner.server
            if server is not None:
                for proto in list(server.connections):
                    if proto.transport is not None:
                        proto.transport.abort()
            await runner.cleanup()

    async def __aenter__(self) -> "FakeEngine":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # ------------------------------------------------------------------ handlers
    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_delay:
            await asyncio.sleep(self.metrics_delay)
        text = (
            "# HELP vllm:kv_cache_usage_perc KV-cache usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{self.model}"}} {self.kv_usage}\n'
            "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} {self.running}\n'
            "# HELP vllm:num_requests_waiting Waiting.\n# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="{self.model}"}} {self.waiting}\n'
        )
        if self.metrics_padding:
            text = ("# " + "x" * 1000 + "\n") * (self.metrics_padding // 1003) + text
        return web.Response(text=text, status=self.metrics_status, content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "owned_by": "vllm", "max_model_len": self.max_model_len}]})

    async def _embed(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append({"path": request.path, "headers": dict(request.headers), "body": body})
        return web.json_response({"object": "list", "data": [{"object": "embedding", "index": 0,
                                                              "embedding": [0.0, 1.0]}]})

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        self.seen.append({"path": request.path, "headers": dict(request.headers), "body": body,
                          "t": time.monotonic()})
        self.active += 1
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.error_status is not None:
                return web.json_response({"error": {"message": "engine says no", "type": "BadRequestError",
                                                    "param": None, "code": self.error_status}},
                                         status=self.error_status, headers={"x-engine": "fake"})
            if self.answer_bytes:
                return await self._large(request, body.get("stream") is True)
            if body.get("stream"):
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-engine": "fake"})
                await resp.prepare(request)
                for i in range(self.chunks):
                    if self.die_after_chunks is not None and i == self.die_after_chunks:
                        await resp.write(b'data: {"partial": tr')  # half an event, then the process dies
                        request.transport.abort()
                        return resp
                    event = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i}"}]}
                    await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                    if self.chunk_delay:
                        await asyncio.sleep(self.chunk_delay)
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                self.completed += 1
                return resp
            self.completed += 1
            return web.json_response({"id": "cmpl-1", "object": "text_completion", "model": self.model,
                                      "choices": [{"index": 0, "text": "hello", "finish_reason": "stop"}],
                                      "echo_max_tokens": body.get("max_tokens")},
                                     headers={"x-engine": "fake"})
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
    async def _large(self, request: web.Request, sse: bool) -> web.StreamResponse:
        """`answer_bytes` as fast as the reader takes them (aiohttp's write waits while the socket is full)."""
        event = b"data: " + b"x" * ((64 << 10) - 8) + b"\n\n"
        block = event * 16  # 1 MiB a write
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream" if sse else "application/octet-stream"})
        if not sse:
            resp.content_length = self.answer_bytes
        await resp.prepare(request)
        left = self.answer_bytes
        while left > 0:
            await resp.write(block[:left])
            left -= len(block)
        if sse:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.completed += 1
        return resp


class IdleClosingEngine:
    """A raw HTTP/1.1 engine that closes a keep-alive connection, without answering, when a second inference
    request arrives on it: the race of a server closing an idle connection just as the client reuses it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.answered = 0
        self.dropped = 0
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        inference = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                path = head.split(b" ", 2)[1]
                if path == b"/metrics":
                    body = b'vllm:kv_cache_usage_perc{engine="0"} 0.1\nvllm:num_requests_running{engine="0"} 0\n'
                elif path == b"/v1/models":
                    body = b'{"object":"list","data":[{"id":"fake-model","max_model_len":4096}]}'
                else:
                    inference += 1
                    if inference > 1:
                        self.dropped += 1
                        writer.close()
                        return
                    self.answered += 1
                    body = b'{"choices":[{"index":0,"text":"hello"}]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def __aenter__(self) -> "IdleClosingEngine":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.close()


async def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def client_session():
    async with aiohttp.ClientSession() as session:
        yield session


def test_fake_engine_answers() -> None:
    async def scenario() -> None:
        async with FakeEngine() as engine, client_session() as s:
            async with s.get(engine.url + "/metrics") as r:
                assert "vllm:kv_cache_usage_perc" in await r.text()
            async with s.post(engine.url + "/v1/completions", json={"prompt": "hi", "stream": True}) as r:
                text = await r.text()
            assert text.endswith("data: [DONE]\n\n") and text.count("data: ") == engine.chunks + 1

    asyncio.run(scenario())
