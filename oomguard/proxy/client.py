"""The proxy's upstream side: aiohttp's client, set up for a proxy's hot path, and what its failures mean.

One `ClientSession` per upstream with a keep-alive pool (`TCPConnector`, no pool cap: the admission controller
is the cap), and nothing a proxy does not need: no cookie jar, no automatic headers, no decompression (bytes
go through as the engine sent them), no redirects, no `raise_for_status`. Failures are sorted in two kinds:

* `UpstreamUnavailable`: no part of the answer came back (refused, reset, closed before the status line,
  connect timeout); the request may be tried again elsewhere. A keep-alive connection that the engine closed
  while idle fails this way as it is reused, so that case is retried once on the spot, on the next connection.
* `UpstreamBroken`: the answer started, then the connection died or stalled past the read timeout.

Closing a response before its end closes its connection, which is how the engine learns the client left.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import aiohttp
from yarl import URL

# aiohttp adds these unless told not to; a proxy sends the client's own (or none)
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
_READ_BUFSIZE = 1 << 18  # bytes aiohttp buffers per response before pausing the socket


class UpstreamUnavailable(ConnectionError):
    """No part of the answer arrived: safe to try the request again."""


class UpstreamBroken(ConnectionError):
    """The answer started, then the connection failed."""


class UpstreamClient:
    """HTTP/1.1 keep-alive client for one upstream base URL (scheme://host:port[/prefix])."""

    def __init__(self, base: str, connect_timeout: float = 5.0, read_timeout: float | None = 600.0,
                 keepalive_timeout: float = 60.0) -> None:
        self.base = base.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive_timeout = keepalive_timeout
        self._session: aiohttp.ClientSession | None = None

    def _new_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=self.keepalive_timeout,
                                         ttl_dns_cache=300, enable_cleanup_closed=False)
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO_HEADERS, raise_for_status=False, trust_env=False,
            requote_redirect_url=False, read_bufsize=_READ_BUFSIZE,
            timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_timeout, sock_read=self.read_timeout))

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._new_session()
        return self._session

    async def request(self, method: str, target: str, headers: list[tuple[str, str]],
                      body: bytes) -> aiohttp.ClientResponse:
        """Send one request; returns once the status line and headers are in (raises UpstreamUnavailable)."""
        url = URL(self.base + target, encoded=True)
        data = body if body or method in ("POST", "PUT", "PATCH") else None
        session = self.session
        for attempt in (0, 1):
            try:
                return await session.request(method, url, headers=headers, data=data, allow_redirects=False)
            except aiohttp.ClientConnectorError as exc:  # refused, unreachable, DNS: nothing was sent
                raise UpstreamUnavailable(f"cannot connect to {url.host}:{url.port}: "
                                          f"{exc.os_error.strerror or exc.os_error}") from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # closed or reset before any answer: most often a keep-alive connection the engine closed
                # while idle, so once more on the next connection
                if attempt == 0:
                    continue
                raise UpstreamUnavailable(f"upstream closed the connection before answering ({_why(exc)})") \
                    from None
            except asyncio.TimeoutError:
                raise UpstreamUnavailable(f"no answer from upstream within its timeout "
                                          f"(connect {self.connect_timeout:.0f} s, read {self.read_timeout} s)") \
                    from None
            except aiohttp.ClientResponseError as exc:  # not HTTP, or a malformed head
                raise UpstreamBroken(f"malformed answer from upstream: {exc.message}") from None
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def iter_body(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body as it arrives (no waiting for more), raising UpstreamBroken if the connection fails."""
    content = resp.content
    try:
        while True:
            chunk = await content.readany()
            if not chunk:
                return
            yield chunk
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
        raise UpstreamBroken(f"upstream closed the connection mid-answer ({_why(exc)})") from None


async def read_body(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.read()
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
        raise UpstreamBroken(f"upstream closed the connection mid-answer ({_why(exc)})") from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "read timed out"
    return str(exc) or type(exc).__name__
