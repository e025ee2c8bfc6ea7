"""The HTTP shell of `oomguard proxy`: its own HTTP/1.1 server in front (`http.py`), a keep-alive connection
pool behind (`pool.py`), both over httptools' parser in one asyncio loop; the stack was chosen by measurement
(benchmarks/proxy_overhead.py, benchmarks/proxy_stack_choice.py, README "Proxy").

Per request: check the path, take the request in (`intake.py`: the key, the body, its JSON and priority, the
prompt's tokens), ask the admission controller, wait in the queue if told to, forward to the chosen upstream, and
pass the answer back (SSE event by event, nothing held back, and no faster than the client reads: a slow reader
pauses the upstream socket). A client that disconnects cancels its handler, which closes the upstream connection,
which makes the engine abort the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import aiohttp
from .http import ClientGone, Request
from .intake import Refusal, RequestIntake, json_dumps as _dumps
from .pool import HOP_BY_HOP, UpstreamBroken, UpstreamPool, UpstreamUnavailable
from .admission import AdmissionController, Limits, Rejection, Ticket
from .metrics import ProxyMetrics
from .tokens import PromptRatio, TokenCounter, load_counter, requested_max_tokens
from .upstreams import Poller, UpstreamAddress
from .workers import WorkerInfo, gather_siblings, merge_metrics, merge_status

log = logging.getLogger("oomguard.proxy")
access_log = logging.getLogger("oomguard.proxy.access")

# Only these paths are ever forwarded, and only to configured upstreams: never an open proxy.
_SAFE_V1_PATH = re.compile(r"^/v1(/[A-Za-z0-9_\-.:]+)*/?$")
_DROP_REQUEST = HOP_BY_HOP | {b"host", b"authorization", b"content-length", b"x-priority", b"x-api-key", b"expect",
                               b"cookie", b"forwarded", b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto"}
_DROP_RESPONSE = HOP_BY_HOP | {b"server", b"set-cookie"}
_FULL_READ_LIMIT = 64 << 10  # non-streaming answers up to this size are read whole, then sent at once; larger
#                              ones are passed on as they come, at the client's pace
_MAX_EVENT = 1 << 20  # an SSE event larger than this is passed on in pieces (it is no engine's event)
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_TAIL = 4096   # the bytes of a streamed answer kept for its usage (the last events)

_SAFE_PATHS: dict[str, bool] = {}  # the answer of `_safe_path` for the paths seen (few: the API's routes)


def _safe_path(path: str) -> bool:
    """Only paths made of safe characters, with no dot segments, are forwarded."""
    known = _SAFE_PATHS.get(path)
    if known is None:
        known = bool(_SAFE_V1_PATH.match(path)) and "/../" not in path + "/" and "/./" not in path + "/"
        if len(_SAFE_PATHS) < 1024:
            _SAFE_PATHS[path] = known
    return known


# what the OpenAI-compatible routes take (vLLM, SGLang and llama-server serve GET and POST; OPTIONS for CORS)
_FORWARDED_METHODS = frozenset({"GET", "POST", "HEAD", "OPTIONS"})


@dataclass
class ProxyConfig:
    upstreams: list[UpstreamAddress]
    limits: Limits = field(default_factory=Limits)
    api_keys: tuple[str, ...] = ()
    upstream_api_key: str | None = None
    max_body_bytes: int = 8 << 20
    max_tokens_cap: int | None = None
    connect_timeout: float = 5.0
    read_timeout: float | None = 600.0   # --upstream-idle-timeout
    header_timeout: float = 10.0   # a request's head must be in within this of its first byte
    body_timeout: float = 60.0     # and its body within this of its head (else 408)
    keepalive_timeout: float = 60.0  # an idle client connection is closed after this
    send_timeout: float = 60.0     # a client that reads nothing of its answer for this long is dropped
    access_log: bool = True
    tokenizer: str | None = None  # --tokenizer; without it the served model's tokenizer.json in the HF cache


DROP_REQUEST_HEADERS = _DROP_REQUEST  # for the HTTP server: what Request.passed leaves out


class _UpstreamGone(Exception):
    """The upstream failed before any response header came back: the request may be tried again."""


class ProxyServer:
    def __init__(self, config: ProxyConfig, counter: TokenCounter | None = None,
                 worker: WorkerInfo | None = None) -> None:
        self.config = config
        self._find_counter = counter is None  # look for the tokenizer once the served models are known
        self.intake = RequestIntake(config.api_keys, max_body_bytes=config.max_body_bytes,
                                    body_timeout=config.body_timeout, max_tokens_cap=config.max_tokens_cap,
                                    counter=counter)
        self.prompt_ratio = PromptRatio()   # learnt from the engines' usage.prompt_tokens
        self._answers_seen = 0
        self.worker = worker if worker is not None and worker.count > 1 else None
        self.addresses = {u.name: u for u in config.upstreams}
        self.controller = AdmissionController(self.addresses, config.limits, clock=time.monotonic)
        self.metrics = ProxyMetrics(self.controller)
        self.pollers: dict[str, Poller] = {}
        self._pools: dict[str, UpstreamPool] = {}
        self._tasks: list[asyncio.Task] = []
        self._poll_session: aiohttp.ClientSession | None = None
        self._upstream_headers = ({"Authorization": f"Bearer {config.upstream_api_key}"}
                                  if config.upstream_api_key else {})
        self._upstream_header_lines = b"".join(f"{k}: {v}\r\n".encode("latin-1")
                                               for k, v in self._upstream_headers.items())
        self.started_at = time.time()

    @property
    def counter(self) -> TokenCounter:
        """The prompt token counter (the intake's): the model's tokenizer once found, else the bytes bound."""
        return self.intake.counter

    @counter.setter
    def counter(self, counter: TokenCounter) -> None:
        self.intake.counter = counter

    # ----------------------------------------------------------------- the entry point (http.HttpServer)
    async def handle(self, req: Request) -> None:
        path = req.path
        if path == "/v1" or path.startswith("/v1/"):
            if req.method not in _FORWARDED_METHODS:   # TRACE echoes headers back; the OpenAI API reads and posts
                self._error(405, f"{req.method} is not allowed on {path}", "MethodNotAllowed").send(req)
                return
            await self.handle_v1(req)
        elif path == "/health":
            self.handle_health().send(req)
        elif path == "/metrics" and req.method in ("GET", "HEAD"):
            (await self.handle_metrics(req.headers)).send(req)
        elif path == "/oomguard/status" and req.method in ("GET", "HEAD"):
            (await self.handle_status(req.headers)).send(req)
        else:
            self._error(404, f"Not found: {path}", "NotFoundError").send(req)

    async def start(self, first_poll_timeout: float = 5.0) -> None:
        for name, address in self.addresses.items():
            self._pools[name] = UpstreamPool(address.base, connect_timeout=self.config.connect_timeout,
                                             read_timeout=self.config.read_timeout, drop_headers=_DROP_RESPONSE)
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
        await asyncio.gather(*(p.close() for p in self._pools.values()), return_exceptions=True)
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
    def handle_health(self) -> Reply:
        snap = self.controller.snapshot()
        states = {name: u["state"] for name, u in snap["upstreams"].items()}
        ok = any(s != "down" for s in states.values())
        return Reply.json({"status": "ok" if ok else "no upstream reachable", "upstreams": states},
                          200 if ok else 503)

    async def handle_metrics(self, headers: Any) -> Reply:
        body = self.metrics.render()
        if self.worker is not None and not headers.get("x-oomguard-worker-local"):
            body = merge_metrics(await gather_siblings(self.worker, "/metrics", {}, body))
        return Reply(200, body, (("content-type", "text/plain; charset=utf-8"), ("cache-control", "no-store")))

    async def handle_status(self, headers: Any) -> Reply:
        if not self.intake.authorized(headers):
            return self._error(401, "Invalid or missing API key.", "AuthenticationError")
        snap = self.controller.snapshot()
        snap["uptime_s"] = round(time.time() - self.started_at, 1)
        snap["rejected"] = {s.labels["reason"]: s.value for m in self.metrics.rejected.collect()
                            for s in m.samples if s.name.endswith("_total")}
        self.metrics.flush()
        snap["admitted"] = sum(s.value for m in self.metrics.admitted.collect()
                               for s in m.samples if s.name.endswith("_total"))
        snap["token_counting"] = self.counter.describe()
        if self.worker is not None and not headers.get("x-oomguard-worker-local"):
            auth = {k: headers.get(k) for k in ("authorization", "x-api-key") if k in headers}
            answers = await gather_siblings(self.worker, "/oomguard/status", auth, snap)
            snap = merge_status({i: a if isinstance(a, dict) else json.loads(a) for i, a in answers.items()})
        return Reply.json(snap)

    # ----------------------------------------------------------------- the proxy proper
    async def handle_v1(self, req: Request) -> None:
        start = time.monotonic()
        info: dict[str, Any] = {"method": req.method, "path": req.path}
        status = 500
        # A client that leaves cancels this handler wherever it is (queued, waiting for the engine, streaming);
        # unwinding closes the upstream connection, so the engine aborts the request.
        try:
            status = await self._handle_v1(req, info)
        except asyncio.CancelledError:
            status = 499  # the client closed the connection
            info.setdefault("reason", "client_disconnected")
            if not req.disconnected:
                raise  # the server is stopping, not the client leaving
        except ClientGone:
            status = 499
            info.setdefault("reason", "client_disconnected")
        finally:
            if self.config.access_log and access_log.isEnabledFor(logging.INFO):
                if "queue_s" in info:
                    info["queue_ms"] = round(info.pop("queue_s") * 1000, 2)
                info["status"] = status
                info["ms"] = round((time.monotonic() - start) * 1000, 2)
                access_log.info("%s", json.dumps(info, separators=(",", ":")))

    async def _handle_v1(self, req: Request, info: dict[str, Any]) -> int:
        """Answer one /v1 request; returns the status sent."""
        headers = req.headers
        intake = self.intake
        try:
            intake.authenticate(headers)
        except Refusal as refusal:
            return self._refused(refusal, info).send(req)
        path = req.path
        if not _safe_path(path):
            info["reason"] = "bad_path"
            return self._error(404, f"Not found: {path}", "NotFoundError").send(req)
        target = (path + "?" + req.query if req.query else path).encode("latin-1")
        declared = headers.get("content-length")
        if req.method in ("GET", "HEAD") and declared in (None, "0") and "transfer-encoding" not in headers:
            return await self._forward_unguarded(req, target, info)
        try:
            body = req.body_now(intake.max_body_bytes)   # the common case: all of it came with the head
            if body is None:
                body = await intake.read_body(req)
            limit = self.controller.max_model_len()
            got = intake.parse(headers, path, body, limit, info)
        except Refusal as refusal:
            return self._refused(refusal, info).send(req)

        # ---- admission
        ticket = Ticket(priority=got.priority, prompt_tokens=got.prompt_tokens, model=got.model, stream=got.stream,
                        kv_tokens=self._kv_tokens(got.payload, got.prompt_tokens, limit) if got.guarded else 0)
        decision = self.controller.submit(ticket)
        self._wake(decision.dispatched)
        for victim, rejection in decision.evicted:
            self._reject_waiter(victim, rejection)
        if decision.rejection is not None:
            return self._rejected(decision.rejection, info).send(req)
        try:
            while True:
                if ticket.upstream is None:
                    rejection = await self._wait(ticket, asyncio.get_running_loop())
                    if rejection is not None:
                        return self._rejected(rejection, info).send(req)
                waited = time.monotonic() - ticket.enqueued_at
                self.metrics.on_admit(ticket.upstream, got.priority, waited)
                info["upstream"] = ticket.upstream
                info["queue_s"] = waited
                try:
                    return await self._forward(req, target, ticket, got.body, info)
                except _UpstreamGone as exc:
                    name = ticket.upstream
                    self.metrics.upstream_errors.labels(name, "before_response").inc()
                    self.pollers[name].kick()
                    info["retries"] = info.get("retries", 0) + 1
                    if self.controller.clock() >= ticket.deadline:
                        self.controller.release(ticket, completed=False)
                        return self._rejected(Rejection(
                            503, "upstream_failed", self.controller.limits.down_retry_after,
                            f"The upstream engine failed before answering ({exc}); retry later."), info).send(req)
                    ticket.waiter = asyncio.get_running_loop().create_future()
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

    def _kv_tokens(self, payload: Any, prompt_tokens: int, limit: int | None) -> int:
        """What the request may hold in the KV cache at its longest: its prompt (the tokenizer's count, or about 4
        bytes a token where only the 8-byte lower bound is known) and its max_tokens (the context when unset)."""
        if not isinstance(payload, dict):
            return 0
        prompt = prompt_tokens if self.counter.exact else self.prompt_ratio.estimate(prompt_tokens)
        out = requested_max_tokens(payload)
        if out is None:
            return limit or prompt
        return min(prompt + max(0, out), limit) if limit else prompt + max(0, out)

    async def _forward(self, req: Request, target: bytes, ticket: Ticket, body: bytes, info: dict) -> int:
        name = ticket.upstream
        try:
            resp = await self._pools[name].request(req.method, target, self._request_headers(req), body)
        except UpstreamUnavailable as exc:
            raise _UpstreamGone(str(exc)) from None
        except UpstreamBroken as exc:
            self.metrics.upstream_errors.labels(name, "malformed").inc()
            info["reason"] = "upstream_malformed"
            info["status_upstream"] = 502
            return self._error(502, str(exc), "BadGatewayError").send(req)
        finished = False
        try:
            info["status_upstream"] = resp.status
            out_headers = resp.passed
            is_sse = resp.content_type == b"text/event-stream"
            length = resp.content_length
            if req.method == "HEAD":   # the engine's head as it is, its length included; no body
                req.stream(resp.status, out_headers, length).end()
                finished = True
                return resp.status
            if not is_sse and (resp.complete or (length is not None and length <= _FULL_READ_LIMIT)):
                try:
                    data = await resp.read()
                except UpstreamBroken as exc:
                    self.metrics.upstream_errors.labels(name, "mid_response").inc()
                    self.pollers[name].kick()
                    info["reason"] = "upstream_died"
                    return self._error(502, f"The upstream engine failed while answering: {exc}",
                                       "BadGatewayError").send(req)
                finished = True
                if not self.counter.exact:
                    self._learn_prompt_tokens(ticket, data)
                req.respond(resp.status, out_headers, data)
                return resp.status
            tail = await self._stream(req, resp, out_headers, is_sse, name, info, ticket)
            self._learn_prompt_tokens(ticket, tail)
            finished = info.get("reason") != "upstream_died"
            return resp.status
        finally:
            if finished:
                resp.release()  # complete: the connection goes back to the pool
            else:
                resp.close()  # unfinished (client left, upstream failed): the engine sees the disconnect

    def _learn_prompt_tokens(self, ticket: Ticket, data: bytes) -> None:
        """The engine's own prompt count (`"prompt_tokens": N` in the usage of the answer's last bytes)."""
        if self.counter.exact or ticket.prompt_tokens <= 0:
            return
        self._answers_seen += 1   # a moving average: from every answer at first, then from one in eight
        if (self._answers_seen > 64 and self._answers_seen & 7) or b'"prompt_tokens"' not in data:
            return
        found = _PROMPT_TOKENS.search(data)
        if found:
            self.prompt_ratio.observe(ticket.prompt_tokens, int(found.group(1)))

    async def _stream(self, req: Request, resp: Any, out_headers: list, is_sse: bool, name: str,
                      info: dict, ticket: Ticket | None = None) -> bytes:
        """Forward the body as it comes, at the client's pace; returns its last bytes (where an SSE stream's
        usage is). Each streamed event carries at least one token: their count is the request's progress, for the
        KV peak admission projects.

        The chunks go from the engine's connection to the client's in the connection's own callback (`pipe`),
        with no task switch per chunk; while the client's socket is full the engine's is not read."""
        length = None
        if is_sse:
            out_headers = [(k, v) for k, v in out_headers if k.lower() != b"cache-control"]
            out_headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        elif not resp.chunked:
            length = resp.content_length  # passed on as is; None: the engine ends the body by closing
        stream = req.stream(resp.status, out_headers, length)
        pending = last = b""
        sent = events = 0
        counting = is_sse and ticket is not None and ticket.stream

        def on_chunk(chunk: bytes) -> bool:
            nonlocal pending, last, sent, events
            if is_sse:
                # forward whole events as soon as they are complete, so a failure never leaves half an event
                buf = pending + chunk if pending else chunk
                cut = _event_end(buf)
                if cut == 0 and len(buf) <= _MAX_EVENT:
                    pending = buf
                    return True
                if cut == 0:
                    cut = len(buf)  # no engine sends events this large: passed on, not held
                pending = buf[cut:]
                chunk = buf[:cut]
                if counting:
                    events += chunk.count(b"\n\n")
                    self._wake(self.controller.progress(ticket, events))
            sent += len(chunk)
            last = chunk[-_TAIL:] if len(chunk) >= _TAIL else (last + chunk)[-_TAIL:]
            return stream.write_nowait(chunk)

        stream.on_drain(resp.resume)
        try:
            await resp.pipe(on_chunk)
            if pending:
                stream.write_nowait(pending)
                sent += len(pending)
                last = (last + pending)[-_TAIL:]
            stream.end()
        except UpstreamBroken as exc:
            self.metrics.upstream_errors.labels(name, "mid_stream").inc()
            self.pollers[name].kick()
            info["reason"] = "upstream_died"
            info["status_upstream"] = 502
            if is_sse:
                event = {"error": {"message": f"The upstream engine failed mid-stream: {exc}",
                                   "type": "BadGatewayError", "param": None, "code": 502}}
                stream.write_nowait(b"data: " + _dumps(event) + b"\n\ndata: [DONE]\n\n")
                stream.end()
            else:
                stream.abort()  # a plain body cannot carry an error once started: the connection closes short
        finally:
            stream.on_drain(None)
        if req.disconnected:
            raise ClientGone()
        info["bytes"] = sent
        return last

    async def _forward_unguarded(self, req: Request, target: bytes, info: dict) -> int:
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
                return await self._forward(req, target, ticket, b"", info)
            except _UpstreamGone as exc:
                self.controller.mark_down(up.name, str(exc))
                self.pollers[up.name].kick()
        return self._rejected(Rejection(503, "no_upstream", self.controller.limits.down_retry_after,
                                        "No upstream engine is reachable right now; retry later."), info).send(req)

    # ----------------------------------------------------------------- helpers
    def _request_headers(self, req: Request) -> bytes:
        """The client's headers to pass on, as header lines: hop-by-hop ones, the client's credentials and the
        proxy's own (x-priority) dropped, the upstream's key added."""
        connection = req.headers.get("connection")
        if not connection:   # the server left out _DROP_REQUEST already (it was made with it)
            return req.passed + self._upstream_header_lines
        drop = _DROP_REQUEST | {t.strip().lower().encode("latin-1") for t in connection.split(",")}
        lines = [b"%s: %s\r\n" % (k, v) for k, v in req.raw_headers if k.lower() not in drop]
        lines.append(self._upstream_header_lines)
        return b"".join(lines)

    def _refused(self, refusal: Refusal, info: dict) -> Reply:
        info["reason"] = refusal.reason
        if refusal.metric is not None:
            self.metrics.on_reject(refusal.metric)
        return self._error(refusal.status, refusal.message, refusal.kind, param=refusal.param)

    def _rejected(self, rejection: Rejection, info: dict) -> Reply:
        info["reason"] = rejection.reason
        self.metrics.on_reject(rejection.reason)
        kind = "RateLimitError" if rejection.status == 429 else "ServiceUnavailableError"
        return self._error(rejection.status, rejection.message, kind, retry_after=rejection.retry_after)

    @staticmethod
    def _error(status: int, message: str, kind: str, param: str | None = None,
               retry_after: int | None = None) -> Reply:
        reply = Reply.json({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)
        if retry_after is None:
            return reply
        return Reply(status, reply.body, reply.headers + (("retry-after", str(retry_after)),))


@dataclass(frozen=True)
class Reply:
    """A whole (non-streamed) answer."""
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> Reply:
        return cls(status, _dumps(obj), (("content-type", "application/json"),))

    def send(self, req: Request) -> int:
        req.respond(self.status, [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers], self.body)
        return self.status


def _event_end(buf: bytes) -> int:
    """Index just past the last complete SSE event in `buf` (0 if none)."""
    lf = buf.rfind(b"\n\n")
    crlf = buf.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
