"""The proxy's HTTP/1.1 server: an asyncio Protocol per client connection over httptools' request parser.

Chosen by measurement (benchmarks/proxy_overhead.py, benchmarks/proxy_stack_choice.py, README "Proxy"): the
granian server it replaced, with its thread handoff, cost more per request than everything else in the proxy.
This one parses with httptools (llhttp, the parser of Node.js and uvicorn), runs one task a connection in the
proxy's own event loop, and does only what the proxy needs:

* keep-alive and pipelining (a pipelined request waits for the one before it; reading pauses meanwhile);
* the request body arrives into the request as it comes, up to a cap (reading pauses past it);
* time limits, so that a client that trickles its request cannot hold a connection: the head must be in within
  `header_timeout` of its first byte (or of the connection's opening), the body within `body_timeout` of the
  head; either answers 408 and closes. A kept-alive connection idle for `keepalive_timeout` is closed. Each
  client is one connection among many in the loop, so a slow one delays nobody else;
* backpressure: a response written faster than the client reads fills the connection's write buffer up to
  `WRITE_HIGH_WATER`, then `ResponseStream.write` waits until it drains below `WRITE_LOW_WATER` (the upstream
  side stops reading its socket meanwhile: oomguard.proxy.pool); a client whose socket takes nothing for
  `send_timeout` is dropped;
* a client that disconnects cancels its connection's task, wherever the request is.
"""

from __future__ import annotations

import asyncio
import http
import logging
import socket
from collections import deque
from typing import Any, Awaitable, Callable
from urllib.parse import unquote

import httptools

log = logging.getLogger("oomguard.proxy")

WRITE_HIGH_WATER = 256 << 10  # bytes queued for a client before a streaming response waits for it
WRITE_LOW_WATER = 64 << 10
MAX_HEAD_BYTES = 64 << 10     # request line and headers; 431 beyond

_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


class ClientGone(Exception):
    """The client closed the connection."""


class RequestTimeout(Exception):
    """The request body did not arrive within the body timeout."""


def _status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))


_STATUS_LINES = {code: _status_line(code) for code in _REASONS}


def _head(status: int, headers: list[tuple[bytes, bytes]] | tuple, framing: bytes, close: bool) -> bytes:
    parts = [_STATUS_LINES.get(status) or _status_line(status)]
    parts.extend(b"%s: %s\r\n" % hv for hv in headers)
    parts.append(framing)
    parts.append(b"connection: close\r\n\r\n" if close else b"\r\n")
    return b"".join(parts)


class Request:
    """One request: its head at once, its body through `body()`, its answer through `respond` or `stream`."""

    __slots__ = ("method", "path", "query", "raw_headers", "headers", "passed", "keep_alive", "http10",
                 "disconnected", "_proto", "_chunks", "_size", "_complete", "_too_large", "_waiter", "_error",
                 "_expect", "_started", "_finished", "task")

    def __init__(self, proto: _HttpProtocol, method: str, path: str, query: str,
                 raw_headers: list[tuple[bytes, bytes]], keep_alive: bool, http10: bool = False) -> None:
        self._proto = proto
        self.method = method
        self.path = path  # percent-decoded, like the servers before it
        self.query = query  # as sent
        self.raw_headers = raw_headers  # (name, value) as sent
        headers: dict[str, str] = {}
        drop = proto.server.drop_headers
        passed = []
        for pair in raw_headers:
            name, value = pair
            lower = name.lower()
            key = lower.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = text if key not in headers else headers[key] + ", " + text
            if lower not in drop:
                passed.append(b"%s: %s\r\n" % pair)
        self.headers = headers  # lower-case names; repeated headers joined with ", "
        self.passed = b"".join(passed)  # the header lines not in the server's drop_headers, as sent
        self.keep_alive = keep_alive
        self.http10 = http10  # an HTTP/1.0 client: no chunked answers, so a body of unknown length ends with a close
        self.disconnected = False  # set when the client closed the connection
        self._chunks: list[bytes] = []
        self._size = 0
        self._complete = False
        self._too_large = False
        self._waiter: asyncio.Future | None = None
        self._error: BaseException | None = None
        self._expect = headers.get("expect", "").lower() == "100-continue"
        self._started = False  # a response head was written
        self._finished = False  # the response is complete
        self.task: asyncio.Task | None = None

    # ----------------------------------------------------------------- the body
    def _feed(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._proto.server.max_body_bytes:
            self._too_large = True
            self._chunks.clear()
            self._proto.pause_reading()  # nothing more is kept; the answer (413) closes the connection
        else:
            self._chunks.append(data)
        self._wake()

    def _end(self) -> None:
        self._complete = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def body(self, limit: int) -> bytes | None:
        """The whole body, or None as soon as it is larger than `limit` bytes. Raises RequestTimeout when it
        does not arrive within the body timeout, ClientGone when the client leaves."""
        if self._expect and not self._complete and not self._started:
            self._expect = False
            self._proto.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while True:
            if self._too_large or self._size > limit:
                return None
            if self._complete:
                chunks = self._chunks
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self._error is not None:
                raise self._error
            if self.disconnected:
                raise ClientGone()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def body_now(self, limit: int) -> bytes | None:
        """The whole body if it is all in already and no larger than `limit`, else None (then `body()`)."""
        if self._complete and not self._too_large and self._size <= limit:
            chunks = self._chunks
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return None

    # ----------------------------------------------------------------- the answer
    def respond(self, status: int, headers: list[tuple[bytes, bytes]] | tuple, body: bytes) -> None:
        """A whole answer in one write."""
        if self._started:
            raise RuntimeError("the response has started")
        self._started = True
        close = self._proto.must_close(self)
        data = _head(status, headers, b"content-length: %d\r\n" % len(body), close)
        if body and self.method != "HEAD":
            data += body
        self._proto.write(data)
        self._finished = True
        self._proto.finished(self, close)

    def stream(self, status: int, headers: list[tuple[bytes, bytes]], length: int | None = None) -> ResponseStream:
        """Start an answer whose body follows: with `length`, as that many bytes; without, chunked."""
        if self._started:
            raise RuntimeError("the response has started")
        self._started = True
        close = self._proto.must_close(self)
        if length is not None:
            framing = b"content-length: %d\r\n" % length
        elif self.method == "HEAD":
            framing = b""
        elif self.http10:
            framing, close = b"", True  # the end of the body is the end of the connection
        else:
            framing = b"transfer-encoding: chunked\r\n"
        self._proto.write(_head(status, headers, framing, close))
        chunked = length is None and self.method != "HEAD" and not self.http10
        return ResponseStream(self, chunked=chunked, close=close)


class ResponseStream:
    """The body of a started answer. `write` waits while the client's socket buffer is full."""

    __slots__ = ("_req", "_proto", "_chunked", "_close")

    def __init__(self, req: Request, chunked: bool, close: bool) -> None:
        self._req = req
        self._proto = req._proto
        self._chunked = chunked
        self._close = close

    async def write(self, data: bytes) -> None:
        if not data or self._req.method == "HEAD":
            return
        proto = self._proto
        if proto.closed:
            raise ClientGone()
        self._put(proto, data)
        if proto.write_paused:
            await proto.drain()

    def _put(self, proto, data: bytes) -> None:
        """Queue `data` on the client's transport, framed as a chunk when the answer is chunked."""
        if not self._chunked:
            proto.write(data)
        elif len(data) < 16384:
            proto.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            proto.writelines((b"%x\r\n" % len(data), data, b"\r\n"))

    def write_nowait(self, data: bytes) -> bool:
        """`write` from a callback: queues `data` at once; False when the client's socket is full (then
        `on_drain`'s callback says when it has room again)."""
        proto = self._proto
        if not data or self._req.method == "HEAD" or proto.closed:
            return not proto.closed
        self._put(proto, data)
        return not proto.write_paused

    def on_drain(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` each time the client's socket has room again (after a write filled it)."""
        self._proto.on_drain = callback

    def end(self) -> None:
        """The body is complete."""
        req = self._req
        if req._finished:
            return
        if self._chunked and not self._proto.closed:
            self._proto.write(b"0\r\n\r\n")
        req._finished = True
        self._proto.finished(req, self._close)

    def abort(self) -> None:
        """The body cannot be completed (its source failed): the connection closes without the end of it, so
        the client sees a truncated answer rather than a complete-looking one."""
        req = self._req
        if req._finished:
            return
        req._finished = True
        self._proto.finished(req, close=True, abort=True)


Handler = Callable[[Request], Awaitable[None]]


class HttpServer:
    """Serves `handler` on TCP and Unix sockets in the running event loop."""

    def __init__(self, handler: Handler, header_timeout: float = 10.0, body_timeout: float = 60.0,
                 keepalive_timeout: float = 60.0, max_body_bytes: int = 8 << 20,
                 drop_headers: frozenset[bytes] = frozenset(), send_timeout: float = 60.0) -> None:
        self.handler = handler
        self.drop_headers = drop_headers  # lower-case names left out of Request.passed
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.keepalive_timeout = keepalive_timeout
        self.send_timeout = send_timeout  # a client whose socket takes nothing for this long is dropped
        self.max_body_bytes = max_body_bytes
        self.connections: set[_HttpProtocol] = set()
        self.stopping = False
        self._servers: list[asyncio.AbstractServer] = []
        self._sweeper: asyncio.TimerHandle | None = None
        self._every = min(1.0, max(0.05, min(header_timeout, body_timeout, keepalive_timeout, send_timeout) / 8))

    async def listen(self, host: str, port: int, reuse_port: bool = False, backlog: int = 1024) -> int:
        """Listen on host:port (0: a free port); returns the port. `reuse_port` lets other processes (the
        proxy's workers) listen on it too."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.listen(backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _HttpProtocol(self), sock=sock, backlog=backlog)
        self._servers.append(server)
        self._start_sweeper(loop)
        return sock.getsockname()[1]

    async def listen_unix(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_unix_server(lambda: _HttpProtocol(self), path))
        self._start_sweeper(loop)

    async def close(self, grace: float = 0.0) -> None:
        """Stop listening; close idle connections; cancel the requests in progress after `grace` seconds."""
        self.stopping = True
        for server in self._servers:
            server.close()
        for proto in list(self.connections):
            if proto.current is None:
                proto.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while any(p.current is not None for p in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        tasks = [p.current.task for p in self.connections if p.current is not None and p.current.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for proto in list(self.connections):
            proto.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    # ----------------------------------------------------------------- time limits
    def _start_sweeper(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._every, self._sweep)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        stalled = now - self.send_timeout
        for proto in list(self.connections):
            if proto.deadline and now >= proto.deadline:
                proto.expired()
            elif proto.write_paused and proto.paused_at < stalled:
                # the client has taken nothing for the send timeout: dropped, so that its request (and the
                # engine's work on it) ends instead of waiting on it forever
                proto.abort()
        self._sweeper = loop.call_later(self._every, self._sweep)


# what the connection is waiting for, and what happens if it does not come in time
_IDLE, _HEAD, _BODY = 1, 2, 3


class _HttpProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.write_paused = False
        self.paused_at = 0.0
        self.on_drain: Callable[[], None] | None = None
        self._drain: asyncio.Future | None = None
        self.current: Request | None = None    # the request being answered
        self._task: asyncio.Task | None = None  # the connection's task (_serve)
        self._next: asyncio.Future | None = None  # what it waits on between requests
        self.pending: deque[Request] = deque()  # pipelined requests behind it
        self._parsing: Request | None = None    # the request whose body the parser is reading
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._in_head = False
        self._head_bytes = 0
        self._feeding = 0
        self._reading_paused = False
        self.deadline = 0.0
        self._waiting_for = _IDLE

    # ----------------------------------------------------------------- connection events
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.server.connections.add(self)
        # the first request's head is due within the header timeout of the connection's opening
        self.deadline = self.loop.time() + self.server.header_timeout
        self._waiting_for = _IDLE

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(ClientGone())
            drain.exception()  # retrieved here: a writer may not be waiting
        for req in (self.current, *self.pending):
            if req is None:
                continue
            req.disconnected = True
            req._wake()
            if req.task is not None and not req._finished:
                req.task.cancel()  # the client left: its handler unwinds (and closes the upstream connection)
        self.pending.clear()
        if self._next is not None and self._task is not None:
            self._task.cancel()  # it was waiting for a next request

    def pause_writing(self) -> None:
        self.write_paused = True
        self.paused_at = self.loop.time()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.on_drain is not None:
            self.on_drain()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drain(self) -> None:
        if self.closed:
            raise ClientGone()
        if self.write_paused:
            self._drain = self.loop.create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    def data_received(self, data: bytes) -> None:
        self._feeding = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Upgrade (h2c, websocket) is not served: the request is answered as plain HTTP/1.1, then closed
            self.pause_reading()
            for req in (self.current, *self.pending):
                if req is not None:
                    req.keep_alive = False
            return
        except httptools.HttpParserError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._bad_request(refused.status, str(refused))
            else:
                self._bad_request(400, f"malformed request: {exc}")
            return
        if self._in_head:  # the head is not complete after all of this: it was all head
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._bad_request(431, f"request line and headers over {MAX_HEAD_BYTES >> 10} KiB")

    # ----------------------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._url = b""
        self._headers = []
        if self.current is None:
            self.deadline = self.loop.time() + self.server.header_timeout
            self._waiting_for = _HEAD

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        url = self._url
        if self._head_bytes + self._feeding > MAX_HEAD_BYTES and \
                len(url) + sum(len(n) + len(v) + 4 for n, v in self._headers) > MAX_HEAD_BYTES:
            # (measured only when the bytes read for it could hold a head that large)
            raise _Refused(431, f"request line and headers over {MAX_HEAD_BYTES >> 10} KiB")
        if not url.startswith(b"/"):  # absolute-form ("http://host/...") or "*": this is no forward proxy
            raise _Refused(400, "the request target must be a path")
        raw_path, _, query = url.partition(b"?")
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path, errors="replace")
        method = self.parser.get_method().decode("ascii")
        parser = self.parser
        req = Request(self, method, path, query.decode("latin-1"), self._headers, parser.should_keep_alive(),
                      parser.get_http_version() == "1.0")
        self._parsing = req
        if self.current is None:
            self._start(req)
        else:
            self.pending.append(req)
            self.pause_reading()  # one request ahead is enough
        if self.current is req:
            # the body (if any) is due within the body timeout; the parser ends it at once when there is none
            self.deadline = self.loop.time() + self.server.body_timeout
            self._waiting_for = _BODY

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing._feed(body)

    def on_message_complete(self) -> None:
        req = self._parsing
        self._parsing = None
        if req is not None:
            req._end()
            if req is self.current:
                self.deadline = 0.0  # the proxy's own time limits govern the rest

    # ----------------------------------------------------------------- requests
    def _start(self, req: Request) -> None:
        self.current = req
        task = self._task
        if task is None:
            task = self._task = self.loop.create_task(self._serve())
        elif self._next is not None and not self._next.done():
            self._next.set_result(None)  # the connection's task waits for it
        req.task = task

    async def _serve(self) -> None:
        """The connection's task: its requests one after the other (a task a connection, not a request: a task
        costs more to make than a wake-up)."""
        try:
            while not self.closed:
                req = self.current
                if req is None:
                    self._next = self.loop.create_future()
                    try:
                        await self._next
                    finally:
                        self._next = None
                    continue
                await self._run(req)
        except asyncio.CancelledError:
            pass  # the client left, or the server is stopping
        finally:
            self._task = None

    async def _run(self, req: Request) -> None:
        try:
            await self.server.handler(req)
        except ClientGone:
            pass
        except Exception:  # noqa: BLE001 - a handler bug must not take the connection's others down
            log.exception("error while answering %s %s", req.method, req.path)
            if not req._started and not self.closed:
                req.respond(500, ((b"content-type", b"application/json"),),
                            b'{"error":{"message":"internal error in the proxy","type":"InternalServerError",'
                            b'"param":null,"code":500}}')
        finally:
            if not req._finished and not self.closed:
                # the handler ended without finishing its answer: nothing else can follow on this connection
                req._finished = True
                self.finished(req, close=True, abort=req._started)

    def must_close(self, req: Request) -> bool:
        """Whether the connection closes after `req`'s answer."""
        return not req.keep_alive or not req._complete or self.server.stopping or self.closed

    def finished(self, req: Request, close: bool, abort: bool = False) -> None:
        """`req`'s answer is written: the next pipelined request, or wait for one, or close."""
        self.on_drain = None
        if self.current is req:
            self.current = None
        if self.closed:
            return
        if close:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()
            return
        if self.pending:
            nxt = self.pending.popleft()
            self._start(nxt)
            if not nxt._complete:
                self.deadline = self.loop.time() + self.server.body_timeout
                self._waiting_for = _BODY
            else:
                self.deadline = 0.0
        elif self._in_head:  # the next request has begun arriving
            self.deadline = self.loop.time() + self.server.header_timeout
            self._waiting_for = _HEAD
        else:
            self.deadline = self.loop.time() + self.server.keepalive_timeout
            self._waiting_for = _IDLE
        if not self.pending and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def expired(self) -> None:
        """The sweeper found this connection past its deadline."""
        self.deadline = 0.0
        if self._waiting_for == _IDLE and not self._in_head:
            self.close()  # an idle connection: closed quietly
        elif self._waiting_for == _BODY and self.current is not None and self._parsing is self.current:
            # the handler answers 408 (it is waiting for the body, or will ask for it)
            self.current._fail(RequestTimeout())
            self.current.keep_alive = False
        else:
            self._bad_request(408, "the request did not arrive in time")

    def _bad_request(self, status: int, message: str) -> None:
        """Answer an unparseable or late request with `status` and close (unless an answer is under way)."""
        if self.closed:
            return
        for req in self.pending:
            if req.task is None:
                req.disconnected = True
        self.pending.clear()
        current = self.current
        if current is not None and current._started:
            self.transport.close()  # an answer is being written: it ends, then the connection
            return
        if current is not None and current.task is not None:
            current.task.cancel()
            current._finished = True
            self.current = None
        body = ('{"error":{"message":"%s","type":"BadRequestError","param":null,"code":%d}}'
                % (message.replace("\\", "\\\\").replace('"', "'"), status)).encode()
        self.write(_head(status, ((b"content-type", b"application/json"),),
                         b"content-length: %d\r\n" % len(body), True) + body)
        self.transport.close()

    # ----------------------------------------------------------------- transport helpers
    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def writelines(self, parts: tuple) -> None:
        if not self.closed:
            self.transport.writelines(parts)

    def pause_reading(self) -> None:
        if not self._reading_paused and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.abort()


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
