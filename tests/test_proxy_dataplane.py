"""The proxy's data plane under abuse and at the HTTP edges: backpressure from slow readers (a proxy in a
process of its own, its memory read from /proc), requests trickled to hold connections (raw sockets), and the
HTTP/1.1 server and upstream pool at their edges (pipelining, HTTP/1.0, chunked bodies, HEAD, bad requests)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from oomguard.proxy.admission import Limits
from oomguard.proxy.command import running_proxy
from oomguard.proxy.server import ProxyConfig
from oomguard.proxy.upstreams import parse_upstream
from testsupport import free_port, wait_until
from testsupport.upstream import FakeUpstream

REPO = Path(__file__).resolve().parents[1]


def run(coro, timeout: float = 120) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=timeout))


def config_for(engine: FakeUpstream, **kw) -> ProxyConfig:
    return ProxyConfig(upstreams=[parse_upstream(engine.url)], limits=Limits(poll_interval=0.1), **kw)


def completion(**extra) -> dict:
    return {"model": "fake-model", "prompt": "Hello", "max_tokens": 16, **extra}


# ----------------------------------------------------------------------------- backpressure
def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@contextlib.contextmanager
def proxy_process(engine: FakeUpstream, *args: str):
    """`oomguard proxy` in a process of its own (so that its memory is its own); yields (pid, url)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "oomguard", "proxy", "--upstream", engine.url,
                             "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *args],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc.pid, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_healthy(s: aiohttp.ClientSession, url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with s.get(url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("the proxy did not come up")
        await asyncio.sleep(0.1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the proxy's memory from /proc")
def test_slow_readers_of_a_large_answer_do_not_grow_the_proxy() -> None:
    """An engine answers 200 MiB to each of four clients that stop reading for two seconds, then read it all:
    the proxy stops reading the engine while a client's socket is full, so it holds a few hundred KiB per
    stream, not the answer (an unbounded proxy would hold up to 800 MiB here)."""
    size = 200 << 20

    async def scenario():
        engine = FakeUpstream()
        engine.answer_bytes = size
        async with engine, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
            with proxy_process(engine) as (pid, url):
                await wait_healthy(s, url)
                before = rss_bytes(pid)
                peak = before
                sampling = True

                async def sample():
                    nonlocal peak
                    while sampling:
                        peak = max(peak, rss_bytes(pid))
                        await asyncio.sleep(0.02)

                async def reader(sse: bool) -> int:
                    async with s.post(url + "/v1/completions", json=completion(stream=sse)) as r:
                        assert r.status == 200
                        got = len(await r.content.readexactly(1 << 20))
                        await asyncio.sleep(2.0)   # a slow client: nothing read meanwhile
                        async for chunk in r.content.iter_chunked(1 << 20):
                            got += len(chunk)
                        return got

                sampler = asyncio.create_task(sample())
                got = await asyncio.gather(reader(True), reader(True), reader(False), reader(False))
                sampling = False
                await sampler
        assert got == [size + len(b"data: [DONE]\n\n")] * 2 + [size] * 2   # every byte came through
        growth = peak - before
        print(f"proxy RSS {before >> 20} MiB before, {peak >> 20} MiB at its peak")
        assert growth < 64 << 20, f"the proxy grew by {growth >> 20} MiB while streaming to slow readers"

    run(scenario())


# ----------------------------------------------------------------------------- header and body timeouts
async def trickle(port: int, head: bytes, then: bytes, every: float) -> tuple[bytes, float]:
    """Send `head` at once, then `then` one byte every `every` seconds until the proxy answers or closes.
    Returns what the proxy sent and when the connection ended (seconds after the first byte)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    writer.write(head)
    answer = b""

    async def drip():
        for i in range(len(then)):
            await asyncio.sleep(every)
            try:
                writer.write(then[i:i + 1])
                await writer.drain()
            except ConnectionError:
                return

    dripping = asyncio.create_task(drip())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            answer += data
    except ConnectionError:
        pass
    ended = time.monotonic() - start
    dripping.cancel()
    writer.close()
    return answer, ended


def test_trickled_heads_and_bodies_get_408_and_delay_no_one_else() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with engine, running_proxy(config_for(engine, header_timeout=1.0, body_timeout=1.0)) as (server, url):
            port = int(url.rsplit(":", 1)[1])
            body = json.dumps(completion()).encode()
            head_tricklers = [trickle(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                                      b"Content-Type: application/json\r\n" * 20, every=0.1) for _ in range(30)]
            body_tricklers = [trickle(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                            b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body),
                                      body, every=0.1) for _ in range(30)]
            slow = asyncio.gather(*head_tricklers, *body_tricklers)

            latencies = []
            async with aiohttp.ClientSession() as s:
                for _ in range(20):   # everyone else is answered at once meanwhile
                    t0 = time.monotonic()
                    async with s.post(url + "/v1/completions", json=completion()) as r:
                        assert r.status == 200
                    latencies.append(time.monotonic() - t0)
                    await asyncio.sleep(0.05)
                results = await slow
                async with s.get(url + "/metrics") as r:
                    metrics = await r.text()
            assert max(latencies) < 0.5, latencies
            for answer, ended in results:
                assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
                assert b"connection: close" in answer.lower()
                assert 0.9 < ended < 2.5, ended   # cut off after the timeout (checked every 1/8 of it)
            assert len(engine.seen) == 20   # the trickled requests never reached the engine
            assert 'oomguard_proxy_rejected_total{reason="body_timeout"} 30.0' in metrics

    run(scenario())


def test_a_connection_that_sends_nothing_or_idles_is_closed() -> None:
    async def scenario():
        engine = FakeUpstream()
        config = config_for(engine, header_timeout=0.5, keepalive_timeout=0.8)
        async with engine, running_proxy(config) as (server, url):
            port = int(url.rsplit(":", 1)[1])
            # opened, nothing sent: closed quietly after the header timeout
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            t0 = time.monotonic()
            assert await asyncio.wait_for(reader.read(), 5) == b""
            assert 0.4 < time.monotonic() - t0 < 2.0
            writer.close()
            # one request answered, then idle: closed after the keep-alive timeout
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            t0 = time.monotonic()
            assert await asyncio.wait_for(reader.read(), 5) == b""
            assert 0.6 < time.monotonic() - t0 < 2.5
            writer.close()

    run(scenario())


def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout() -> None:
    """Backpressure holds the engine's answer back for a stalled client; past --send-timeout the client is dropped,
    so the engine stops working for it instead of waiting on it forever."""
    async def scenario():
        engine = FakeUpstream()
        engine.answer_bytes = 64 << 20
        async with engine, running_proxy(config_for(engine, send_timeout=1.0)) as (server, url):
            port = int(url.rsplit(":", 1)[1])
            body = json.dumps(completion(stream=True)).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            got = len(await reader.readexactly(1 << 20))
            await asyncio.sleep(3.0)   # stalled: the proxy's socket to us fills, then the send timeout passes
            try:
                while True:
                    data = await reader.read(1 << 20)
                    if not data:
                        break
                    got += len(data)
            except ConnectionError:
                pass
            writer.close()
            assert got < 32 << 20   # cut off, not the whole answer
            await wait_until(lambda: engine.cancelled == 1 and engine.active == 0, timeout=5)

    run(scenario())


def test_timeout_settings_are_validated() -> None:
    for flag in ("--header-timeout", "--body-timeout", "--keepalive-timeout", "--send-timeout"):
        for bad in ("0", "-1", "nan", "inf"):
            r = subprocess.run([sys.executable, "-m", "oomguard", "proxy", "--upstream", "http://127.0.0.1:9",
                                flag, bad], capture_output=True, text=True, timeout=60, cwd=REPO)
            assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr, (flag, bad, r.stderr)


# ----------------------------------------------------------------------------- the HTTP edges
async def raw(port: int, data: bytes, until_close: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        out = await asyncio.wait_for(reader.read(-1) if until_close else reader.read(65536), 10)
    finally:
        writer.close()
    return out


def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with engine, running_proxy(config_for(engine)) as (server, url):
            port = int(url.rsplit(":", 1)[1])
            reqs = b""
            for i in range(3):
                body = json.dumps(completion(prompt=f"p{i}")).encode()
                reqs += (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            reqs += b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            out = await raw(port, reqs)
            assert out.count(b"HTTP/1.1 200 ") == 4
            assert [x["body"]["prompt"] for x in engine.seen] == ["p0", "p1", "p2"]

    run(scenario())


def test_chunked_request_bodies_http10_clients_and_head() -> None:
    async def scenario():
        engine = FakeUpstream()
        engine.tokens = 2
        async with engine, running_proxy(config_for(engine)) as (server, url):
            port = int(url.rsplit(":", 1)[1])
            body = json.dumps(completion(prompt="chunked")).encode()
            chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n"
            out = await raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                  b"Content-Type: application/json\r\nConnection: close\r\n\r\n" + chunked)
            assert out.startswith(b"HTTP/1.1 200 ") and engine.seen[-1]["body"]["prompt"] == "chunked"
            # an HTTP/1.0 client gets a stream without chunked framing, ended by the close
            body = json.dumps(completion(stream=True)).encode()
            out = await raw(port, b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            head, _, rest = out.partition(b"\r\n\r\n")
            assert b"transfer-encoding" not in head.lower() and rest.endswith(b"data: [DONE]\n\n")
            # HEAD: the engine's head, no body, and the next request on the connection still works
            out = await raw(port, b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n"
                                  b"Connection: close\r\n\r\n")
            first, _, rest = out.partition(b"\r\n\r\n")
            assert first.startswith(b"HTTP/1.1 200 ") and rest.startswith(b"HTTP/1.1 200 ")
            models = await raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            length = len(models.partition(b"\r\n\r\n")[2])
            assert f"content-length: {length}".encode() in first.lower()   # the length of what GET would send

    run(scenario())


def test_malformed_requests_and_oversized_heads_are_refused_and_closed() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with engine, running_proxy(config_for(engine)) as (server, url):
            port = int(url.rsplit(":", 1)[1])
            out = await raw(port, b"NOT HTTP AT ALL\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 400 ")
            out = await raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 << 10) + b"\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 431 ")
            # both a length and chunked framing: refused (request smuggling)
            out = await raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 400 ")
            # 100-continue: the proxy asks for the body, then answers
            body = json.dumps(completion()).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
            assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 100 ")
            writer.write(body)
            assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200 ")
            writer.close()
            async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
                assert r.status == 200   # the server is fine after all that

    run(scenario())


def test_a_plain_answer_cut_short_by_the_engine_closes_the_clients_connection() -> None:
    """A body with a length that the engine does not finish is not passed on as if complete: the client's
    connection closes short of the length, so its HTTP library reports the error."""
    async def scenario():
        engine = FakeUpstream()
        engine.answer_bytes = 8 << 20
        async with engine, running_proxy(config_for(engine)) as (server, url):
            async with aiohttp.ClientSession() as s:
                async with s.post(url + "/v1/completions", json=completion()) as r:
                    assert r.status == 200 and r.content_length == 8 << 20
                    await r.content.readexactly(1 << 20)
                    await engine.stop()   # the engine dies mid-answer
                    with pytest.raises(aiohttp.ClientPayloadError):
                        await r.read()

    run(scenario())
