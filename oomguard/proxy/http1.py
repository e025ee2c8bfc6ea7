"""A small HTTP/1.1 client for the proxy's upstream side: keep-alive pools on asyncio protocols.

Why not aiohttp's client: on the proxy's hot path it cost about as much as the whole aiohttp server side
(benchmarks/proxy_overhead.py); this one does only what an OpenAI-compatible engine needs (Content-Length or
chunked bodies, keep-alive, SSE streamed as it arrives) and gives exact control over failures:

* `UpstreamUnavailable`: nothing of the answer came back (refused, reset, closed before the status line);
  the request may be tried again elsewhere. A reused keep-alive connection that fails this way is retried
  once on a fresh connection first (the server may have closed it while idle).
* `UpstreamBroken`: the answer started and then the connection died or timed out.
Closing a response before its end closes the connection, which is how the engine learns the client left.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections import deque
from typing import AsyncIterator

_MAX_HEAD = 64 << 10
_HIGH_WATER = 1 << 20


class UpstreamUnavailable(ConnectionError):
    """No part of the answer arrived: safe to try the request again."""


class UpstreamBroken(ConnectionError):
    """The answer started, then the connection failed."""


class _Conn(asyncio.Protocol):
    def __init__(self, pool: "Pool") -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.resp: "Response | None" = None
        self.closed = False
        self.used = 0

    # -- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:  # bytes while idle: the server is confused; drop the connection
            self.abort()
            return
        resp._feed(data)

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        if self.resp is not None:
            self.resp._lost(exc)

    # -- helpers
    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self.pool._forget(self)


class Response:
    """One upstream answer. `status`, `headers` (list of (name, value) as sent), then the body by
    `read()` or `async for chunk in resp.iter_chunks()`; `release()` or `close()` when done."""

    def __init__(self, conn: _Conn, method: str, read_timeout: float | None) -> None:
        self._conn = conn
        self._head_only = method == "HEAD"
        self._read_timeout = read_timeout
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.content_type = ""
        self.content_length: int | None = None
        self._keep_alive = True
        self._mode = "head"  # head, length, chunk_size, chunk_data, chunk_crlf, trailer, eof, done
        self._remaining = 0
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._head_seen = False
        self._paused = False

    # ------------------------------------------------------------------ parsing (called from the protocol)
    def _feed(self, data: bytes) -> None:
        conn = self._conn
        if self._mode == "head":
            conn.buf += data
            end = conn.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.buf) > _MAX_HEAD:
                    self._fail(UpstreamBroken("response head too large"))
                return
            head = bytes(conn.buf[:end])
            rest = bytes(conn.buf[end + 4:])
            conn.buf.clear()
            try:
                self._parse_head(head)
            except (ValueError, IndexError):
                self._fail(UpstreamBroken("malformed response head"))
                return
            if 100 <= self.status < 200:  # interim answer (100 Continue): wait for the real one
                self.status, self.headers, self._mode = 0, [], "head"
                if rest:
                    self._feed(rest)
                return
            self._head_seen = True
            self._wake()
            if rest:
                self._body(rest)
            elif self._mode == "done":
                self._finish()
            return
        self._body(data)

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if not parts[0].startswith(b"HTTP/1."):
            raise ValueError("not HTTP/1.x")
        self.status = int(parts[1])
        self.reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        http10 = parts[0] == b"HTTP/1.0"
        chunked = False
        length = None
        connection = b""
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name_s = name.strip().decode("latin-1")
            value_s = value.strip().decode("latin-1")
            headers.append((name_s, value_s))
            low = name_s.lower()
            if low == "content-length":
                length = int(value_s)
            elif low == "transfer-encoding":
                chunked = "chunked" in value_s.lower()
            elif low == "connection":
                connection = value.strip().lower()
            elif low == "content-type":
                self.content_type = value_s.split(";", 1)[0].strip().lower()
        self.headers = headers
        self._keep_alive = (b"keep-alive" in connection) if http10 else (b"close" not in connection)
        if self._head_only or self.status in (204, 304):
            self._mode, self.content_length = "done", 0 if length is None else length
        elif chunked:
            self._mode = "chunk_size"
        elif length is not None:
            self.content_length = length
            self._mode, self._remaining = ("length", length) if length > 0 else ("done", 0)
        else:
            self._mode, self._keep_alive = "eof", False

    def _body(self, data: bytes) -> None:
        mode = self._mode
        if mode == "length":
            n = len(data)
            if n < self._remaining:
                self._remaining -= n
                self._push(data)
                return
            self._push(data[:self._remaining] if n > self._remaining else data)
            self._remaining = 0
            self._finish()
            return
        if mode == "eof":
            self._push(data)
            return
        if mode.startswith("chunk") or mode == "trailer":
            self._chunked(data)
            return
        # bytes after a complete answer: the connection cannot be trusted for another request
        self._keep_alive = False

    def _chunked(self, data: bytes) -> None:
        buf = self._conn.buf
        buf += data
        pos = 0
        out = []
        while True:
            if self._mode == "chunk_size":
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                try:
                    size = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self._fail(UpstreamBroken("malformed chunk size"))
                    return
                pos = eol + 2
                if size == 0:
                    self._mode = "trailer"
                else:
                    self._mode, self._remaining = "chunk_data", size
            elif self._mode == "chunk_data":
                take = min(self._remaining, len(buf) - pos)
                if take <= 0:
                    break
                out.append(bytes(buf[pos:pos + take]))
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._mode = "chunk_crlf"
            elif self._mode == "chunk_crlf":
                if len(buf) - pos < 2:
                    break
                pos += 2
                self._mode = "chunk_size"
            elif self._mode == "trailer":
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                line_empty = eol == pos
                pos = eol + 2
                if line_empty:
                    del buf[:pos]
                    if out:
                        self._push(b"".join(out))
                    self._finish()
                    return
            else:
                break
        del buf[:pos]
        if out:
            self._push(out[0] if len(out) == 1 else b"".join(out))

    def _push(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self._mode = "done"
        self._wake()

    def _lost(self, exc: BaseException | None) -> None:
        if self._mode == "eof":
            self._finish()
        elif self._mode != "done":
            if self._head_seen:
                self._fail(UpstreamBroken(f"upstream closed the connection mid-answer ({exc or 'EOF'})"))
            else:
                self._fail(UpstreamUnavailable(f"upstream closed the connection before answering "
                                               f"({exc or 'EOF'})"))

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._keep_alive = False
        self._wake()
        if not self._conn.closed:
            self._conn.abort()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        handle = None
        if self._read_timeout:
            handle = loop.call_later(self._read_timeout, self._timeout)
        try:
            await self._waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    def _timeout(self) -> None:
        cls = UpstreamBroken if self._head_seen else UpstreamUnavailable
        self._fail(cls(f"no data from upstream for {self._read_timeout:.0f} s"))

    # ------------------------------------------------------------------ public
    async def _read_head(self) -> None:
        while not self._head_seen:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        while True:
            if self._chunks:
                data = self._chunks.popleft()
                self._buffered -= len(data)
                if self._paused and self._buffered < _HIGH_WATER // 4 and self._conn.transport is not None:
                    self._paused = False
                    self._conn.transport.resume_reading()
                yield data
                continue
            if self._error is not None:
                raise self._error
            if self._mode == "done":
                return
            await self._wait()

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.iter_chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @property
    def complete(self) -> bool:
        return self._mode == "done" and self._error is None and not self._chunks

    def release(self) -> None:
        """Done with the answer: back to the pool if complete and reusable, else closed."""
        conn = self._conn
        if conn.resp is self:
            conn.resp = None
            if self.complete and self._keep_alive and not conn.closed:
                if self._paused and conn.transport is not None:
                    conn.transport.resume_reading()
                conn.pool._put(conn)
            else:
                conn.abort()

    def close(self) -> None:
        """Abandon the answer: the connection is closed, so the engine sees the client leave."""
        conn = self._conn
        if conn.resp is self:
            conn.resp = None
        if not conn.closed:
            conn.abort()


class Pool:
    """Keep-alive connections to one upstream (host, port, TLS or not)."""

    def __init__(self, host: str, port: int, use_tls: bool = False, connect_timeout: float = 5.0,
                 read_timeout: float | None = 600.0, max_idle: int = 512) -> None:
        self.host, self.port = host, port
        self.ssl = _ssl.create_default_context() if use_tls else None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle
        self._idle: deque[_Conn] = deque()
        self._all: set[_Conn] = set()
        self.host_header = host if port in (80, 443) else f"{host}:{port}"

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self), self.host.strip("[]"), self.port, ssl=self.ssl),
                timeout=self.connect_timeout)
        except asyncio.TimeoutError:
            raise UpstreamUnavailable(f"connect to {self.host_header} timed out") from None
        except OSError as exc:
            raise UpstreamUnavailable(f"cannot connect to {self.host_header}: {exc.strerror or exc}") from None
        self._all.add(conn)
        return conn

    def _put(self, conn: _Conn) -> None:
        if len(self._idle) >= self.max_idle:
            conn.abort()
        else:
            self._idle.append(conn)

    def _forget(self, conn: _Conn) -> None:
        self._all.discard(conn)
        try:
            self._idle.remove(conn)
        except ValueError:
            pass

    async def request(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> Response:
        """Send one request; returns once the status line and headers are in."""
        head = [f"{method} {target} HTTP/1.1\r\nHost: {self.host_header}\r\n"]
        for k, v in headers:
            head.append(f"{k}: {v}\r\n")
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body)}\r\n")
        head.append("\r\n")
        data = "".join(head).encode("latin-1") + body
        for attempt in (0, 1):
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if not candidate.closed:
                    conn = candidate
                    break
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            resp = Response(conn, method, self.read_timeout)
            conn.resp = resp
            conn.used += 1
            conn.transport.write(data)  # type: ignore[union-attr]
            try:
                await resp._read_head()
            except UpstreamUnavailable:
                resp.close()
                if reused and attempt == 0:
                    continue  # the server closed an idle connection as we used it: once more, fresh
                raise
            except BaseException:
                resp.close()
                raise
            return resp
        raise AssertionError("unreachable")

    def drop_idle(self) -> None:
        """Close the idle connections (after the upstream restarted, they lead to the dead process)."""
        while self._idle:
            self._idle.pop().abort()

    def close(self) -> None:
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()
