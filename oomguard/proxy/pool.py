"""The proxy's upstream side: a keep-alive HTTP/1.1 connection pool per upstream, over httptools' parser.

Chosen by measurement (benchmarks/proxy_stack_choice.py, README "Proxy"): behind the same server, aiohttp's
client cost about three times this pool's CPU per request (104 against 37 us for a bare pass-through). This pool
is an asyncio Protocol per connection, the parsing done by httptools (llhttp, the parser of Node.js and
uvicorn), and nothing a proxy does not need.

* One pool per upstream, no cap on connections (the admission controller is the cap); idle connections are
  reused newest first and closed after `keepalive_timeout`.
* Flow control: a response buffers at most about `HIGH_WATER` bytes that its reader has not taken, or, piped
  (`pipe`), stops as soon as its sink says it is full; either way the upstream socket stops being read
  (`pause_reading`), so a slow client slows the engine's socket instead of growing the proxy.
* `read_timeout` is an idle timeout: no byte from the upstream for that long, while the proxy waits for one
  (not while it holds the socket paused for a slow client), fails the response.

Failures come in two kinds:

* `UpstreamUnavailable`: no part of the answer came back (refused, reset, closed before the status line,
  connect timeout); the request may be tried again elsewhere. A keep-alive connection that the engine closed
  while idle fails this way as it is reused, so that case is retried once on the spot, on a new connection.
* `UpstreamBroken`: the answer started (or was not HTTP), then the connection died or went silent.

Closing a response before its end closes its connection, which is how the engine learns the client left.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections import deque
from typing import Any, Callable
from urllib.parse import urlsplit

import httptools

# never passed on from one connection to the next (RFC 9110 7.6.1), nor the framing, which the proxy redoes
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection", b"te",
    b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"content-length",
})
HIGH_WATER = 256 << 10  # bytes a response holds for its reader before the upstream socket is paused
_MAX_HEAD = 64 << 10     # a response head larger than this is not HTTP we want


class UpstreamUnavailable(ConnectionError):
    """No part of the answer arrived: safe to try the request again."""


class UpstreamBroken(ConnectionError):
    """The answer started, then the connection failed (or it was not HTTP)."""


class _Closed(Exception):
    """The connection closed before the status line (internal: becomes a retry or UpstreamUnavailable)."""


class UpstreamPool:
    """HTTP/1.1 keep-alive connections to one upstream base URL (scheme://host:port[/prefix])."""

    def __init__(self, base: str, connect_timeout: float = 5.0, read_timeout: float | None = 600.0,
                 keepalive_timeout: float = 60.0, max_idle: int = 1024,
                 drop_headers: frozenset[bytes] = HOP_BY_HOP) -> None:
        parts = urlsplit(base.rstrip("/"))
        self.base = base.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.encode("ascii")
        self.ssl: _ssl.SSLContext | None = _ssl.create_default_context() if parts.scheme == "https" else None
        default = 443 if parts.scheme == "https" else 80
        host = self.host if ":" not in self.host else f"[{self.host}]"
        self._host_line = (f"host: {host}\r\n" if self.port == default else f"host: {host}:{self.port}\r\n").encode()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive_timeout = keepalive_timeout
        self.max_idle = max_idle
        self.drop_headers = drop_headers  # lower-case names left out of UpstreamResponse.passed
        self._idle: deque[_Connection] = deque()
        self._busy: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    # ----------------------------------------------------------------- requests
    async def request(self, method: str, target: bytes, headers: bytes, body: bytes) -> UpstreamResponse:
        """Send one request (`headers`: the header lines, each ending in CRLF, without Host or framing);
        returns once the status line and headers are in. Raises UpstreamUnavailable or UpstreamBroken."""
        if body or method in ("POST", "PUT", "PATCH"):
            head = b"%s %s%s HTTP/1.1\r\n%s%scontent-length: %d\r\n\r\n" % (
                method.encode(), self.prefix, target, self._host_line, headers, len(body))
            data = head + body if len(body) < 65536 else None
        else:
            head = b"%s %s%s HTTP/1.1\r\n%s%s\r\n" % (method.encode(), self.prefix, target, self._host_line, headers)
            data = head
        for attempt in (0, 1):
            conn = self._take_idle()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            self._busy.add(conn)
            try:
                return await conn.send(data, head, body, method == "HEAD")
            except _Closed as exc:
                conn.abort()
                if reused and attempt == 0:
                    continue  # most often a keep-alive connection the engine closed while idle: once more
                raise UpstreamUnavailable(f"upstream closed the connection before answering ({exc})") from None
            except BaseException:
                conn.abort()  # cancelled (the client left) or failed: the engine sees the connection close
                raise
        raise AssertionError("unreachable")

    def _take_idle(self) -> _Connection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.lost:
                return conn
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self), self.host, self.port, ssl=self.ssl),
                timeout=self.connect_timeout)
        except asyncio.TimeoutError:
            raise UpstreamUnavailable(f"cannot connect to {self.host}:{self.port} within "
                                      f"{self.connect_timeout:g} s") from None
        except OSError as exc:
            raise UpstreamUnavailable(f"cannot connect to {self.host}:{self.port}: "
                                      f"{exc.strerror or exc}") from None
        self._schedule_sweep(loop)
        return conn

    def _release(self, conn: _Connection, reusable: bool) -> None:
        self._busy.discard(conn)
        if reusable and not self._closed and not conn.lost and len(self._idle) < self.max_idle:
            conn.idle_since = conn.loop.time()
            self._idle.append(conn)
        else:
            conn.close()

    # ----------------------------------------------------------------- timeouts
    def _schedule_sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sweeper is None and not self._closed:
            timeouts = [t for t in (self.read_timeout, self.keepalive_timeout) if t]
            every = min(1.0, max(0.05, min(timeouts) / 8)) if timeouts else 1.0
            self._sweeper = loop.call_later(every, self._sweep, every)

    def _sweep(self, every: float) -> None:
        """Idle keep-alive connections past their time are closed; a response whose upstream sent nothing for
        `read_timeout` (while the proxy waited for it) fails."""
        self._sweeper = None
        if self._closed or (not self._idle and not self._busy):
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        keep = self.keepalive_timeout
        while self._idle and (self._idle[0].lost or now - self._idle[0].idle_since > keep):
            self._idle.popleft().close()
        read_timeout = self.read_timeout
        if read_timeout:
            for conn in list(self._busy):
                if conn.waiting and not conn.paused and now - conn.last_data > read_timeout:
                    conn.timed_out()
        self._sweeper = loop.call_later(every, self._sweep, every)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        while self._idle:
            self._idle.pop().close()
        for conn in list(self._busy):
            conn.abort()


class UpstreamResponse:
    """One answer: status and headers at once, the body as it arrives (`read`, `next_chunk`)."""

    __slots__ = ("status", "headers", "passed", "content_type", "content_length", "chunked", "_conn", "_chunks",
                 "_buffered", "_done", "_error", "_waiter", "_finished", "_sink", "_piped")

    def __init__(self, conn: _Connection, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers  # raw (name, value) pairs as the engine sent them
        self.passed: list[tuple[bytes, bytes]] = []  # those to pass on: all but the pool's drop_headers
        self.content_type = b""
        self.content_length: int | None = None
        self.chunked = False
        drop = conn.pool.drop_headers
        for pair in headers:
            name, value = pair
            lower = name.lower()
            if lower not in drop:
                self.passed.append(pair)
            if lower == b"content-type":
                self.content_type = value.split(b";", 1)[0].strip().lower()
            elif lower == b"content-length" and value.strip().isdigit():
                self.content_length = int(value)
            elif lower == b"transfer-encoding":
                self.chunked = True
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._finished = False
        self._sink: Callable[[bytes], bool] | None = None
        self._piped: asyncio.Future | None = None

    # fed by the connection
    def _feed(self, data: bytes) -> None:
        if self._sink is not None:
            self._to_sink(data)
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER:
            self._conn.pause()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end(self, error: BaseException | None) -> None:
        self._done = True
        self._error = error
        piped = self._piped
        if piped is not None and not piped.done():
            if error is None:
                piped.set_result(None)
            else:
                piped.set_exception(error)
                piped.exception()  # retrieved here: its awaiter may be gone (cancelled)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def complete(self) -> bool:
        """The whole body is in (and nothing failed)."""
        return self._done and self._error is None

    async def next_chunk(self) -> bytes:
        """What arrived since the last call (waiting for something if nothing has); b"" at the end.
        Raises UpstreamBroken if the connection failed or went silent."""
        while not self._chunks:
            if self._done:
                if self._error is not None:
                    raise self._error
                return b""
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        self._conn.resume()
        return data

    def pipe(self, sink: Callable[[bytes], bool]) -> asyncio.Future:
        """From now on hand the body to `sink` as it arrives, from the connection's own callback (no task switch
        per chunk). `sink` returns False when its side is full: the upstream socket is paused until `resume()`.
        The future returned ends with the body (None) or with its failure (UpstreamBroken)."""
        piped = self._piped = self._conn.loop.create_future()
        self._sink = sink
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks.clear()
            self._buffered = 0
            self._to_sink(data)
        if self._done and not piped.done():
            self._end(self._error)
        return piped

    def _to_sink(self, data: bytes) -> None:
        try:
            more = self._sink(data)  # type: ignore[misc]
        except BaseException as exc:  # noqa: BLE001 - the consumer's failure ends the pipe, not the connection's callback
            self._sink = None
            self._conn.pause()
            if self._piped is not None and not self._piped.done():
                self._piped.set_exception(exc)
                self._piped.exception()
            return
        if not more:
            self._conn.pause()

    def resume(self) -> None:
        """The sink can take more (after it returned False)."""
        self._conn.resume()

    async def read(self) -> bytes:
        """The whole body (for small answers)."""
        if not self._done:
            parts = []
            while True:
                chunk = await self.next_chunk()
                if not chunk:
                    return b"".join(parts)
                parts.append(chunk)
        if self._error is not None:
            raise self._error
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data

    def release(self) -> None:
        """Done with the answer: a complete one gives its connection back to the pool, any other closes it."""
        if self._finished:
            return
        self._finished = True
        conn = self._conn
        conn.pool._release(conn, self._done and self._error is None and conn.keep_alive)

    def close(self) -> None:
        """Give up on the answer: the connection closes, so the engine sees the client leave."""
        if self._finished:
            return
        self._finished = True
        self._conn.pool._busy.discard(self._conn)
        self._conn.abort()


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses the answers with httptools."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.paused = False
        self.waiting = False  # a request is out and its answer not yet complete
        self.keep_alive = True
        self.idle_since = 0.0
        self.last_data = 0.0
        self._head_waiter: asyncio.Future | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._response: UpstreamResponse | None = None
        self._head_only = False

    # ----------------------------------------------------------------- the request
    def send(self, data: bytes | None, head: bytes, body: bytes, head_only: bool) -> asyncio.Future:
        """Write the request; the returned future gives the UpstreamResponse once its head is in."""
        self._headers = []
        self._head_bytes = 0
        self._response = None
        self._head_only = head_only
        self.keep_alive = True
        self.waiting = True
        self.last_data = self.loop.time()
        waiter = self._head_waiter = self.loop.create_future()
        if data is not None:
            self.transport.write(data)
        else:  # a large body: no copy of it joined to the head
            self.transport.writelines((head, body))
        return waiter

    # ----------------------------------------------------------------- the protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last_data = self.loop.time()
        if not self.waiting:  # bytes nobody asked for: this connection is not HTTP we can reuse
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            resp = self._response
            if resp is not None and resp._done and resp._error is None:
                self.abort()  # the head of an answer to HEAD is in (_HeadDone), or bytes after the answer
            elif resp is None:
                self._fail(UpstreamBroken(f"malformed answer from upstream: {exc}"))
            else:
                self._fail(UpstreamBroken(f"upstream sent a malformed body ({exc})"))
            return
        if self._response is None:  # all of it was head (interim answers aside): bounded
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD:
                self._fail(UpstreamBroken(f"malformed answer from upstream: a response head over "
                                          f"{_MAX_HEAD >> 10} KiB"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            self._headers = []
            return
        if not self.waiting or self._response is not None:  # a second answer to one request
            raise _HeadDone()
        self.keep_alive = self.parser.should_keep_alive()
        resp = self._response = UpstreamResponse(self, status, self._headers)
        waiter = self._head_waiter
        self._head_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(resp)
        if self._head_only:  # an answer to HEAD has no body, whatever its content-length says
            self.keep_alive = False
            self.waiting = False
            resp._end(None)
            raise _HeadDone()

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        resp = self._response
        if resp is None:  # the end of an interim answer
            return
        self.waiting = False
        resp._end(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.transport = None
        if self.waiting:
            if self._response is None:
                self._fail(_Closed(_why(exc)))
            elif not self._response._done:
                # close-delimited bodies (no length, not chunked) end here, complete
                resp = self._response
                if resp.content_length is None and not resp.chunked and exc is None:
                    self.keep_alive = False
                    self.waiting = False
                    resp._end(None)
                else:
                    self._fail(UpstreamBroken(f"upstream closed the connection mid-answer ({_why(exc)})"))

    # ----------------------------------------------------------------- flow control and failures
    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.last_data = self.loop.time()  # the idle clock restarts when the proxy asks for more
            if self.transport is not None:
                self.transport.resume_reading()

    def timed_out(self) -> None:
        timeout = self.pool.read_timeout
        if self._response is None:
            self._fail(UpstreamUnavailable(f"no answer from upstream within its timeout ({timeout:g} s)"))
        else:
            self._fail(UpstreamBroken(f"upstream sent nothing for {timeout:g} s"))

    def _fail(self, error: BaseException) -> None:
        self.waiting = False
        self.keep_alive = False
        waiter = self._head_waiter
        if waiter is not None and not waiter.done():
            self._head_waiter = None
            waiter.set_exception(error)
        elif self._response is not None and not self._response._done:
            self._response._end(error)
        self.abort()

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.lost = True
        self.waiting = False
        if self.transport is not None:
            self.transport.abort()


class _HeadDone(Exception):
    """Stops the parser after the head of an answer to HEAD (the connection is closed afterwards)."""


def _why(exc: BaseException | None) -> str:
    if exc is None:
        return "closed"
    return str(exc) or type(exc).__name__
