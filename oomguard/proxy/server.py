"""The HTTP shell of `oomguard proxy`: aiohttp server in front, aiohttp client behind (`client.py`).

Per request: authenticate, check the path and body, count the prompt, ask the admission controller, wait in
the queue if told to, forward to the chosen upstream, and pass the answer back (SSE event by event, nothing
held back). Client disconnects cancel the handler (aiohttp's handler_cancellation), which closes the upstream
connection, which makes the engine abort the request.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import aiohttp
from aiohttp import web

from .client import UpstreamBroken, UpstreamClient, UpstreamUnavailable, iter_body, read_body
from .admission import AdmissionController, Limits, Priority, Rejection, Ticket
from .metrics import ProxyMetrics
from .tokens import TokenCounter, context_error, load_counter, requested_max_tokens
from .upstreams import Poller, UpstreamAddress
from .workers import WorkerInfo, gather_siblings, merge_metrics, merge_status

try:  # faster JSON when available; the stdlib otherwise
    import orjson as _orjson

    def _loads(data: bytes) -> Any:
        return _orjson.loads(data)

    def _dumps(obj: Any) -> bytes:
        return _orjson.dumps(obj)
except ImportError:  # pragma: no cover - depends on the environment
    def _loads(data: bytes) -> Any:
        return json.loads(data)

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

log = logging.getLogger("oomguard.proxy")
access_log = logging.getLogger("oomguard.proxy.access")

# Only these paths are ever forwarded, and only to configured upstreams: never an open proxy.
_SAFE_V1_PATH = re.compile(r"^/v1(/[A-Za-z0-9_\-.:]+)*/?$")
_GUARDED = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade",
})
_DROP_REQUEST = _HOP_BY_HOP | {"host", "authorization", "content-length", "x-priority", "x-api-key", "expect",
                               "cookie", "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto"}
_DROP_RESPONSE = _HOP_BY_HOP | {"content-length", "server", "date", "set-cookie"}
_FULL_READ_LIMIT = 4 << 20  # non-streaming answers up to this size are read whole, then sent at once


@dataclass
class ProxyConfig:
    upstreams: list[UpstreamAddress]
    limits: Limits = field(default_factory=Limits)
    api_keys: tuple[str, ...] = ()
    upstream_api_key: str | None = None
    max_body_bytes: int = 8 << 20
    max_tokens_cap: int | None = None
    connect_timeout: float = 5.0
    read_timeout: float | None = 600.0
    access_log: bool = True
    tokenizer: str | None = None  # --tokenizer; without it the served model's tokenizer.json in the HF cache


class _UpstreamGone(Exception):
    """The upstream failed before any response header came back: the request may be tried again."""


class ProxyServer:
    def __init__(self, config: ProxyConfig, counter: TokenCounter | None = None,
                 worker: WorkerInfo | None = None) -> None:
        self.config = config
        self._find_counter = counter is None  # look for the tokenizer once the served models are known
        self.counter = counter or TokenCounter(source="not loaded yet")
        self.worker = worker if worker is not None and worker.count > 1 else None
        self.addresses = {u.name: u for u in config.upstreams}
        self.controller = AdmissionController(self.addresses, config.limits, clock=time.monotonic)
        self.metrics = ProxyMetrics(self.controller)
        self.pollers: dict[str, Poller] = {}
        self._clients: dict[str, UpstreamClient] = {}
        self._tasks: list[asyncio.Task] = []
        self._poll_session: aiohttp.ClientSession | None = None
        # keys kept as SHA-256 digests: every comparison is between equal-length values, in constant time
        self._api_keys = tuple(hashlib.sha256(k.encode()).digest() for k in config.api_keys)
        self._upstream_headers = ({"Authorization": f"Bearer {config.upstream_api_key}"}
                                  if config.upstream_api_key else {})
        self.started_at = time.time()

    # ----------------------------------------------------------------- lifecycle
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_route("*", "/health", self.handle_health)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/oomguard/status", self.handle_status)
        app.router.add_route("*", "/v1", self.handle_v1)
        app.router.add_route("*", "/v1/{tail:.*}", self.handle_v1)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        await self.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.stop()

    async def start(self, first_poll_timeout: float = 5.0) -> None:
        for name, address in self.addresses.items():
            self._clients[name] = UpstreamClient(address.base, connect_timeout=self.config.connect_timeout,
                                                 read_timeout=self.config.read_timeout)
        self._poll_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0))
        for name, address in self.addresses.items():
            self.pollers[name] = Poller(address, self.controller, self._poll_session, self._wake,
                                        self._upstream_headers)
        # one round before serving, so the first requests find the upstreams' state known
        try:
            await asyncio.wait_for(asyncio.gather(*(p.poll_once() for p in self.pollers.values())),
                                   timeout=first_poll_timeout)
        except asyncio.TimeoutError:
            log.warning("first poll of the upstreams took over %.0f s; serving anyway", first_poll_timeout)
        if self._find_counter:
            models = sorted({m for up in self.controller.upstreams.values() for m in (up.models or ())})
            self.counter = await asyncio.get_running_loop().run_in_executor(
                None, load_counter, self.config.tokenizer, models)
        for poller in self.pollers.values():
            self._tasks.append(asyncio.create_task(poller.run(), name=f"poll {poller.address.name}"))
        self._tasks.append(asyncio.create_task(self._sweep(), name="queue sweeper"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await asyncio.gather(*(c.close() for c in self._clients.values()), return_exceptions=True)
        if self._poll_session is not None:
            await self._poll_session.close()

    async def _sweep(self) -> None:
        """Safety net: answer queued tickets whose deadline passed (each handler also times out itself)."""
        while True:
            await asyncio.sleep(0.25)
            for ticket, rejection in self.controller.expire():
                self._reject_waiter(ticket, rejection)

    # ----------------------------------------------------------------- waking queued requests
    def _wake(self, tickets: Iterable[Ticket]) -> None:
        for t in tickets:
            fut = t.waiter
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _reject_waiter(self, ticket: Ticket, rejection: Rejection) -> None:
        fut = ticket.waiter
        if fut is not None and not fut.done():
            fut.set_result(rejection)

    # ----------------------------------------------------------------- small endpoints
    async def handle_health(self, request: web.Request) -> web.Response:
        snap = self.controller.snapshot()
        states = {name: u["state"] for name, u in snap["upstreams"].items()}
        ok = any(s != "down" for s in states.values())
        return web.json_response({"status": "ok" if ok else "no upstream reachable", "upstreams": states},
                                 status=200 if ok else 503)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body = self.metrics.render()
        if self.worker is not None and not request.headers.get("x-oomguard-worker-local"):
            body = merge_metrics(await gather_siblings(self.worker, "/metrics", {}, body))
        return web.Response(body=body, content_type="text/plain",
                            charset="utf-8", headers={"Cache-Control": "no-store"})

    async def handle_status(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._error(401, "Invalid or missing API key.", "AuthenticationError")
        snap = self.controller.snapshot()
        snap["uptime_s"] = round(time.time() - self.started_at, 1)
        snap["rejected"] = {s.labels["reason"]: s.value for m in self.metrics.rejected.collect()
                            for s in m.samples if s.name.endswith("_total")}
        snap["admitted"] = sum(s.value for m in self.metrics.admitted.collect()
                               for s in m.samples if s.name.endswith("_total"))
        snap["token_counting"] = self.counter.describe()
        if self.worker is not None and not request.headers.get("x-oomguard-worker-local"):
            auth = {k: request.headers[k] for k in ("Authorization", "x-api-key") if k in request.headers}
            answers = await gather_siblings(self.worker, "/oomguard/status", auth, snap)
            snap = merge_status({i: a if isinstance(a, dict) else json.loads(a) for i, a in answers.items()})
        return web.json_response(snap)

    # ----------------------------------------------------------------- the proxy proper
    async def handle_v1(self, request: web.Request) -> web.StreamResponse:
        start = time.monotonic()
        info: dict[str, Any] = {"method": request.method, "path": request.path}
        status = 500
        try:
            response = await self._handle_v1(request, info)
            status = response.status
            return response
        except asyncio.CancelledError:
            status = 499  # client closed the connection
            info.setdefault("reason", "client_disconnected")
            raise
        finally:
            if self.config.access_log and access_log.isEnabledFor(logging.INFO):
                info["status"] = status
                info["ms"] = round((time.monotonic() - start) * 1000, 2)
                access_log.info("%s", json.dumps(info, separators=(",", ":")))

    async def _handle_v1(self, request: web.Request, info: dict[str, Any]) -> web.StreamResponse:
        if not self._authorized(request):
            info["reason"] = "unauthorized"
            self.metrics.on_reject("unauthorized")
            return self._error(401, "Invalid or missing API key.", "AuthenticationError")
        raw_path = request.rel_url.raw_path
        if not _SAFE_V1_PATH.match(raw_path) or "/../" in raw_path + "/" or "/./" in raw_path + "/":
            info["reason"] = "bad_path"
            return self._error(404, f"Not found: {request.path}", "NotFoundError")
        if request.method in ("GET", "HEAD") and not request.can_read_body:
            return await self._forward_unguarded(request, info)

        # ---- body: size, JSON, priority, prompt length
        declared = request.content_length
        if declared is not None and declared > self.config.max_body_bytes:
            return self._too_large(info)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._too_large(info)
        try:
            priority = Priority.parse(request.headers.get("x-priority"))
        except ValueError as exc:
            info["reason"] = "bad_priority"
            self.metrics.on_reject("bad_request")
            return self._error(400, str(exc), "BadRequestError", param="x-priority")
        info["priority"] = priority.name.lower()
        path = request.path.rstrip("/")
        guarded = path in _GUARDED
        payload: Any = None
        if guarded or (body and request.content_type == "application/json"):
            try:
                payload = _loads(body) if body else None
            except ValueError as exc:
                info["reason"] = "malformed_json"
                self.metrics.on_reject("bad_request")
                return self._error(400, f"Malformed JSON in the request body: {exc}", "BadRequestError")
            if guarded and not isinstance(payload, dict):
                info["reason"] = "malformed_json"
                self.metrics.on_reject("bad_request")
                return self._error(400, "The request body must be a JSON object.", "BadRequestError")
        prompt_tokens = 0
        model = None
        stream = False
        if isinstance(payload, dict):
            model = payload.get("model") if isinstance(payload.get("model"), str) else None
            stream = payload.get("stream") is True
            info["model"] = model
            info["stream"] = stream
            if guarded:
                rejected, body, prompt_tokens = self._check_length(path, payload, body, info)
                if rejected is not None:
                    return rejected

        # ---- admission
        ticket = Ticket(priority=priority, prompt_tokens=prompt_tokens, model=model)
        decision = self.controller.submit(ticket)
        self._wake(decision.dispatched)
        for victim, rejection in decision.evicted:
            self._reject_waiter(victim, rejection)
        if decision.rejection is not None:
            return self._rejected(decision.rejection, info)
        loop = asyncio.get_running_loop()
        try:
            while True:
                if ticket.upstream is None:
                    rejection = await self._wait(ticket, loop)
                    if rejection is not None:
                        return self._rejected(rejection, info)
                waited = time.monotonic() - ticket.enqueued_at
                self.metrics.on_admit(ticket.upstream, priority, waited)
                info["upstream"] = ticket.upstream
                info["queue_ms"] = round(waited * 1000, 2)
                try:
                    return await self._forward(request, ticket, body, stream, info)
                except _UpstreamGone as exc:
                    name = ticket.upstream
                    self.metrics.upstream_errors.labels(name, "before_response").inc()
                    self.pollers[name].kick()
                    info["retries"] = info.get("retries", 0) + 1
                    if self.controller.clock() >= ticket.deadline:
                        self.controller.release(ticket, completed=False)
                        return self._rejected(Rejection(
                            503, "upstream_failed", self.controller.limits.down_retry_after,
                            f"The upstream engine failed before answering ({exc}); retry later."), info)
                    ticket.waiter = loop.create_future()
                    self._wake(self.controller.requeue(ticket, str(exc)))
        finally:
            if ticket.upstream is not None and not ticket.released:
                self._wake(self.controller.release(ticket, completed=info.get("status_upstream", 0) < 500))
            elif ticket.upstream is None:
                self.controller.cancel(ticket)

    async def _wait(self, ticket: Ticket, loop: asyncio.AbstractEventLoop) -> Rejection | None:
        """Wait in the queue until dispatched (None) or rejected (the Rejection)."""
        if ticket.waiter is None:
            ticket.waiter = loop.create_future()
        timeout = max(0.0, ticket.deadline - self.controller.clock())
        try:
            result = await asyncio.wait_for(asyncio.shield(ticket.waiter), timeout=timeout)
        except asyncio.TimeoutError:
            if ticket.upstream is not None:  # dispatched while the timeout was firing
                return None
            rejection = self.controller.timeout_rejection(ticket)
            self.controller.cancel(ticket)
            return rejection
        if isinstance(result, Rejection):
            return result
        return None

    def _check_length(self, path: str, payload: dict, body: bytes, info: dict) -> tuple[
            web.Response | None, bytes, int]:
        counted = self.counter.count_prompt(payload, path)
        n = counted or 0
        embeddings = path.endswith("/embeddings")
        cap = self.config.max_tokens_cap
        if cap is not None and not embeddings:
            changed = False
            for key in ("max_tokens", "max_completion_tokens"):
                value = payload.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                    payload[key] = cap
                    changed = True
            if requested_max_tokens(payload) is None:
                payload["max_tokens"] = cap
                changed = True
            if changed:
                body = _dumps(payload)
                info["max_tokens_capped"] = cap
        limit = self.controller.max_model_len()
        if counted is not None and limit:
            message = context_error(n, requested_max_tokens(payload), limit, self.counter.exact, embeddings)
            if message is not None:
                info["reason"] = "context_length"
                self.metrics.on_reject("context_length")
                return self._error(400, message, "BadRequestError"), body, n
        return None, body, n

    async def _forward(self, request: web.Request, ticket: Ticket, body: bytes, stream: bool,
                       info: dict) -> web.StreamResponse:
        name = ticket.upstream
        try:
            resp = await self._clients[name].request(request.method, request.rel_url.raw_path_qs,
                                                     self._request_headers(request), body)
        except UpstreamUnavailable as exc:
            raise _UpstreamGone(str(exc)) from None
        except UpstreamBroken as exc:
            self.metrics.upstream_errors.labels(name, "malformed").inc()
            info["reason"] = "upstream_malformed"
            info["status_upstream"] = 502
            return self._error(502, str(exc), "BadGatewayError")
        finished = False
        try:
            info["status_upstream"] = resp.status
            out_headers = [(k, v) for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE]
            is_sse = resp.content_type == "text/event-stream"
            length = resp.content_length
            if not is_sse and length is not None and length <= _FULL_READ_LIMIT:
                try:
                    data = await read_body(resp)
                except UpstreamBroken as exc:
                    self.metrics.upstream_errors.labels(name, "mid_response").inc()
                    self.pollers[name].kick()
                    info["reason"] = "upstream_died"
                    return self._error(502, f"The upstream engine failed while answering: {exc}",
                                       "BadGatewayError")
                finished = True
                out = web.Response(status=resp.status, reason=resp.reason or None, body=data)
                for k, v in out_headers:
                    out.headers.add(k, v)
                return out
            out = await self._stream(request, resp, out_headers, is_sse, name, info)
            finished = info.get("reason") != "upstream_died"
            return out
        finally:
            if finished:
                resp.release()  # complete: the connection goes back to the pool
            else:
                resp.close()  # unfinished (client left, upstream failed): the engine sees the disconnect

    async def _stream(self, request: web.Request, resp: aiohttp.ClientResponse, out_headers: list,
                      is_sse: bool, name: str, info: dict) -> web.StreamResponse:
        out = web.StreamResponse(status=resp.status, reason=resp.reason or None)
        for k, v in out_headers:
            out.headers.add(k, v)
        if is_sse:
            out.headers["Cache-Control"] = "no-cache"
            out.headers["X-Accel-Buffering"] = "no"
        await out.prepare(request)
        pending = b""
        sent = 0
        try:
            async for chunk in iter_body(resp):
                if is_sse:
                    # forward whole events as soon as they are complete, so a failure never leaves half an event
                    buf = pending + chunk if pending else chunk
                    cut = _event_end(buf)
                    if cut == 0:
                        pending = buf
                        continue
                    pending = buf[cut:]
                    chunk = buf[:cut]
                await out.write(chunk)
                sent += len(chunk)
            if pending:
                await out.write(pending)
                sent += len(pending)
        except UpstreamBroken as exc:
            self.metrics.upstream_errors.labels(name, "mid_stream").inc()
            self.pollers[name].kick()
            info["reason"] = "upstream_died"
            info["status_upstream"] = 502
            if is_sse:
                event = {"error": {"message": f"The upstream engine failed mid-stream: {exc}",
                                   "type": "BadGatewayError", "param": None, "code": 502}}
                await out.write(b"data: " + _dumps(event) + b"\n\ndata: [DONE]\n\n")
            else:
                # a plain body cannot carry an error once started: end the connection abnormally
                if request.transport is not None:
                    request.transport.close()
                info["bytes"] = sent
                return out
        info["bytes"] = sent
        await out.write_eof()
        return out

    async def _forward_unguarded(self, request: web.Request, info: dict) -> web.StreamResponse:
        """GET /v1/models and the like: no admission, to the first reachable upstream."""
        now = self.controller.clock()
        ups = sorted(self.controller.upstreams.values(),
                     key=lambda u: (u.state(now, self.controller.limits)[0].value != "open", u.down))
        for up in ups:
            if up.down:
                continue
            ticket = Ticket(upstream=up.name)
            info["upstream"] = up.name
            try:
                return await self._forward(request, ticket, b"", False, info)
            except _UpstreamGone as exc:
                self.controller.mark_down(up.name, str(exc))
                self.pollers[up.name].kick()
        return self._rejected(Rejection(503, "no_upstream", self.controller.limits.down_retry_after,
                                        "No upstream engine is reachable right now; retry later."), info)

    # ----------------------------------------------------------------- helpers
    def _authorized(self, request: web.Request) -> bool:
        if not self._api_keys:
            return True
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        given = hashlib.sha256(token.encode()).digest()
        ok = False
        for key in self._api_keys:  # every key compared, in constant time each
            ok |= hmac.compare_digest(given, key)
        return ok

    def _request_headers(self, request: web.Request) -> list[tuple[str, str]]:
        connection = request.headers.get("Connection")
        drop = _DROP_REQUEST
        if connection:
            drop = drop | {t.strip().lower() for t in connection.split(",")}
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in drop]
        headers.extend(self._upstream_headers.items())
        return headers

    def _rejected(self, rejection: Rejection, info: dict) -> web.Response:
        info["reason"] = rejection.reason
        self.metrics.on_reject(rejection.reason)
        kind = "RateLimitError" if rejection.status == 429 else "ServiceUnavailableError"
        return self._error(rejection.status, rejection.message, kind,
                           headers={"Retry-After": str(rejection.retry_after)})

    def _too_large(self, info: dict) -> web.Response:
        info["reason"] = "body_too_large"
        self.metrics.on_reject("body_too_large")
        return self._error(413, f"The request body is larger than the proxy's limit of "
                                f"{self.config.max_body_bytes} bytes.", "RequestEntityTooLargeError")

    @staticmethod
    def _error(status: int, message: str, kind: str, param: str | None = None,
               headers: dict[str, str] | None = None) -> web.Response:
        body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
        return web.Response(status=status, body=_dumps(body), content_type="application/json", headers=headers)


def _event_end(buf: bytes) -> int:
    """Index just past the last complete SSE event in `buf` (0 if none)."""
    lf = buf.rfind(b"\n\n")
    crlf = buf.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
