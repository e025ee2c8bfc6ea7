"""`oomguard proxy` over real HTTP on 127.0.0.1, in front of fake engines whose /metrics the tests drive."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import pytest

from oomguard.proxy.admission import Limits
from oomguard.proxy.command import running_proxy
from oomguard.proxy.server import ProxyConfig
from oomguard.proxy.upstreams import parse_upstream
from testsupport import wait_until
from testsupport.upstream import FakeUpstream, answer_text

POLL = 0.1


def config_for(*engines: FakeUpstream, **kw) -> ProxyConfig:
    limits = Limits(poll_interval=POLL, **kw.pop("limits", {}))
    return ProxyConfig(upstreams=[parse_upstream(e.url) for e in engines], limits=limits, **kw)


@contextlib.asynccontextmanager
async def stack(*engines: FakeUpstream, **kw):
    """Engines started, a proxy in front, a client session: yields (server, url, session)."""
    async with contextlib.AsyncExitStack() as es:
        for e in engines:
            await es.enter_async_context(e)
        server, url = await es.enter_async_context(running_proxy(config_for(*engines, **kw)))
        session = await es.enter_async_context(aiohttp.ClientSession())
        yield server, url, session


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=60))


async def polled(server, times: int = 2) -> None:
    """Let the pollers run `times` more rounds."""
    await asyncio.sleep(POLL * times + 0.05)


def completion(**extra) -> dict:
    return {"model": "fake-model", "prompt": "Hello", "max_tokens": 16, **extra}


# ----------------------------------------------------------------------------- pass-through
def test_pass_through_json_and_status_and_headers() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine) as (server, url, s):
            async with s.post(url + "/v1/completions", json=completion()) as r:
                assert r.status == 200 and r.headers["x-engine"] == "fake"
                assert (await r.json())["choices"][0]["text"] == answer_text(16)
            async with s.get(url + "/v1/models") as r:
                assert (await r.json())["data"][0]["max_model_len"] == 4096
            engine.fail_every, engine.fail_status = 1, 422
            async with s.post(url + "/v1/chat/completions",
                              json={"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}) as r:
                assert r.status == 422 and (await r.json())["error"]["message"] == "injected failure"
            async with s.get(url + "/health") as r:
                assert r.status == 200
            async with s.post(url + "/v1/embeddings", json={"model": "fake-model", "input": "x"}) as r:
                assert r.status == 200
    run(scenario())


def test_streaming_passes_chunk_by_chunk() -> None:
    async def scenario():
        engine = FakeUpstream()
        engine.tokens = 4
        engine.itl = 0.3
        async with stack(engine) as (server, url, s):
            arrivals = []
            t0 = time.monotonic()
            async with s.post(url + "/v1/completions", json=completion(stream=True)) as r:
                assert r.headers["Content-Type"].startswith("text/event-stream")
                async for line in r.content:
                    if line.startswith(b"data: "):
                        arrivals.append((time.monotonic() - t0, line))
            assert arrivals[-1][1].strip() == b"data: [DONE]"
            assert len(arrivals) == 5
            # the first event reached the client long before the engine finished (no buffering)
            assert arrivals[0][0] < 0.25 and arrivals[-1][0] > 1.0
    run(scenario())


# ----------------------------------------------------------------------------- admission over HTTP
def test_hysteresis_over_http_pauses_090_holds_085_resumes_079() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine) as (server, url, s):
            engine.kv_usage = 0.90
            await polled(server)
            task = asyncio.create_task(s.post(url + "/v1/completions", json=completion()))
            await asyncio.sleep(0.3)
            assert not task.done() and server.controller.queue_length() == 1 and not engine.seen
            engine.kv_usage = 0.85
            await polled(server, 3)
            assert not task.done() and not engine.seen
            engine.kv_usage = 0.79
            resp = await asyncio.wait_for(task, 5)
            assert resp.status == 200 and len(engine.seen) == 1
            resp.release()
    run(scenario())


def test_priorities_over_http() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine) as (server, url, s):
            engine.kv_usage = 0.95
            await polled(server)
            tasks = []
            for i, prio in enumerate(["low", "normal", "high", "low", "high"]):
                tasks.append(asyncio.create_task(s.post(url + "/v1/completions", json=completion(prompt=f"p{i}"),
                                                        headers={"x-priority": prio})))
                await asyncio.sleep(0.05)  # arrival order is the submission order
            await wait_until(lambda: server.controller.queue_length() == 5)
            engine.kv_usage = 0.5
            for r in await asyncio.gather(*tasks):
                assert r.status == 200
                r.release()
            assert [x["body"]["prompt"] for x in engine.seen] == ["p2", "p4", "p1", "p0", "p3"]
            async with s.post(url + "/v1/completions", json=completion(), headers={"x-priority": "urgent"}) as r:
                assert r.status == 400 and "x-priority" in (await r.json())["error"]["message"]
    run(scenario())


def test_429_with_retry_after_when_queue_full_and_on_timeout() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine, limits=dict(max_queue=1, queue_timeout=0.5)) as (server, url, s):
            engine.kv_usage = 0.95
            await polled(server)
            first = asyncio.create_task(s.post(url + "/v1/completions", json=completion()))
            await wait_until(lambda: server.controller.queue_length() == 1)
            async with s.post(url + "/v1/completions", json=completion()) as r:
                assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
                err = (await r.json())["error"]
                assert err["code"] == 429 and "queue is full" in err["message"]
            r1 = await first  # waited 0.5 s, then 429
            assert r1.status == 429 and int(r1.headers["Retry-After"]) >= 1
            assert "timeout" in (await r1.json())["error"]["message"]
            assert not engine.seen
            async with s.get(url + "/metrics") as r:
                text = await r.text()
            assert 'oomguard_proxy_rejected_total{reason="queue_full"} 1.0' in text
            assert 'oomguard_proxy_rejected_total{reason="queue_timeout"} 1.0' in text
    run(scenario())


def test_503_with_retry_after_when_all_upstreams_down() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine) as (server, url, s):
            await engine.stop()
            await wait_until(lambda: server.controller.upstreams[engine_name(engine)].down)
            async with s.post(url + "/v1/completions", json=completion()) as r:
                assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
            async with s.get(url + "/health") as r:
                assert r.status == 503
    run(scenario())


def engine_name(engine: FakeUpstream) -> str:
    return parse_upstream(engine.url).name


def test_two_upstreams_route_to_most_headroom() -> None:
    async def scenario():
        a, b = FakeUpstream(), FakeUpstream()
        async with stack(a, b) as (server, url, s):
            a.kv_usage, b.kv_usage = 0.6, 0.2
            await polled(server)
            for _ in range(3):
                async with s.post(url + "/v1/completions", json=completion()) as r:
                    assert r.status == 200
            assert len(b.seen) == 3 and not a.seen
            b.kv_usage = 0.93  # b pauses: a takes over
            await polled(server)
            async with s.post(url + "/v1/completions", json=completion()) as r:
                assert r.status == 200
            assert len(a.seen) == 1
    run(scenario())


def test_stale_metrics_count_as_saturated() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine) as (server, url, s):
            engine.metrics_delay = 1.0  # scrapes time out: the last good sample ages past 3 intervals
            await asyncio.sleep(0.6)
            name = engine_name(engine)
            assert server.controller.snapshot()["upstreams"][name]["state"] in ("paused", "down")
            task = asyncio.create_task(s.post(url + "/v1/completions", json=completion()))
            await asyncio.sleep(0.3)
            assert not task.done() and not engine.seen
            engine.metrics_delay = 0.0
            r = await asyncio.wait_for(task, 5)
            assert r.status == 200
            r.release()
    run(scenario())


# ----------------------------------------------------------------------------- stress correctness
def test_client_disconnect_cancels_upstream_request() -> None:
    async def scenario():
        engine = FakeUpstream()
        engine.tokens = 100
        engine.itl = 0.05
        async with stack(engine) as (server, url, s):
            async with s.post(url + "/v1/completions", json=completion(stream=True)) as r:
                await r.content.readline()
                await wait_until(lambda: engine.active == 1)
                # leave after the first event: the connection closes
            await wait_until(lambda: engine.active == 0, timeout=5)
            assert engine.cancelled == 1 and engine.completed == 0
            await wait_until(lambda: server.controller.upstreams[engine_name(engine)].in_flight == 0)
            # and a client that leaves while queued is dropped from the queue
            engine.kv_usage = 0.95
            await polled(server)
            task = asyncio.create_task(s.post(url + "/v1/completions", json=completion()))
            await wait_until(lambda: server.controller.queue_length() == 1)
            task.cancel()
            await wait_until(lambda: server.controller.queue_length() == 0)
    run(scenario())


def test_upstream_dying_mid_stream_ends_with_error_event() -> None:
    async def scenario():
        engine = FakeUpstream()
        engine.tokens = 5
        engine.die_after_tokens = 2
        async with stack(engine) as (server, url, s):
            async with s.post(url + "/v1/completions", json=completion(stream=True)) as r:
                body = await r.read()
            events = [e for e in body.decode().split("\n\n") if e]
            assert all(e.startswith("data: ") for e in events)
            payloads = [e[6:] for e in events]
            assert payloads[-1] == "[DONE]"
            err = json.loads(payloads[-2])["error"]
            assert err["code"] == 502 and "mid-stream" in err["message"]
            assert [json.loads(p)["choices"][0]["text"] for p in payloads[:-2]] == ["t0", "t1"]
    run(scenario())


def test_queued_requests_survive_upstream_restart() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine, limits=dict(queue_timeout=20)) as (server, url, s):
            async with s.post(url + "/v1/completions", json=completion()) as r:
                assert r.status == 200  # a pooled keep-alive connection to the old process now exists
            engine.kv_usage = 0.95
            await polled(server)
            tasks = [asyncio.create_task(s.post(url + "/v1/completions", json=completion(prompt=f"q{i}")))
                     for i in range(8)]
            await wait_until(lambda: server.controller.queue_length() == 8)
            await engine.stop()  # killed
            await wait_until(lambda: server.controller.upstreams[engine_name(engine)].down)
            await asyncio.sleep(0.5)
            restarted = FakeUpstream(port=engine.port)
            restarted.kv_usage = 0.1
            async with restarted:
                results = await asyncio.gather(*tasks)
                assert [r.status for r in results] == [200] * 8
                for r in results:
                    r.release()
                assert sorted(x["body"]["prompt"] for x in restarted.seen) == [f"q{i}" for i in range(8)]
    run(scenario())


def test_request_on_dead_pooled_connection_is_requeued_not_lost() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine, limits=dict(queue_timeout=10)) as (server, url, s):
            async with s.post(url + "/v1/completions", json=completion()) as r:
                assert r.status == 200
            await engine.stop()
            restarted = FakeUpstream(port=engine.port)
            async with restarted:  # back before the poller noticed: the pooled connection is stale
                async with s.post(url + "/v1/completions", json=completion()) as r:
                    assert r.status == 200
    run(scenario())



def test_keep_alive_closed_by_the_engine_is_retried_at_once() -> None:
    async def scenario():
        engine = FakeUpstream()
        engine.drop_reused = True   # a second completion on a keep-alive connection finds it closed
        async with engine, running_proxy(config_for(engine)) as (server, url), aiohttp.ClientSession() as s:
            for _ in range(3):  # each reuse of a pooled connection meets a close: retried on a fresh one
                async with s.post(url + "/v1/completions", json=completion()) as r:
                    assert r.status == 200 and (await r.json())["choices"][0]["text"] == answer_text(16)
            assert engine.completed == 3 and engine.dropped >= 1
            name = engine_name(engine)
            assert not server.controller.upstreams[name].down  # not taken for a dead engine
            async with s.get(url + "/metrics") as r:
                assert "before_response" not in await r.text()
    run(scenario())


# ----------------------------------------------------------------------------- protecting the engine
def test_context_length_rejected_before_the_engine_sees_it() -> None:
    async def scenario():
        engine = FakeUpstream(max_model_len=512)
        async with stack(engine) as (server, url, s):
            long_prompt = "word " * 2000  # 10000 bytes: at least 1250 tokens by the bytes bound
            async with s.post(url + "/v1/completions", json=completion(prompt=long_prompt, max_tokens=10)) as r:
                assert r.status == 400
                err = (await r.json())["error"]
            assert err["type"] == "BadRequestError" and err["code"] == 400
            assert err["message"].startswith("This model's maximum context length is 512 tokens. However, you "
                                             "requested 10 output tokens and your prompt contains at least 1250")
            chat = {"model": "fake-model", "max_tokens": 400,
                    "messages": [{"role": "user", "content": "x" * 1000}]}  # >= 125 + 400 > 512
            async with s.post(url + "/v1/chat/completions", json=chat) as r:
                assert r.status == 400
            async with s.post(url + "/v1/completions", json=completion(prompt="short", max_tokens=10)) as r:
                assert r.status == 200
            assert len(engine.seen) == 1
    run(scenario())


def test_max_tokens_cap_body_limit_and_malformed_json() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine, max_tokens_cap=64, max_body_bytes=4096) as (server, url, s):
            async with s.post(url + "/v1/completions", json=completion(max_tokens=1000)) as r:
                assert (await r.json())["echo_max_tokens"] == 64
            async with s.post(url + "/v1/completions", json={"model": "fake-model", "prompt": "x"}) as r:
                assert (await r.json())["echo_max_tokens"] == 64
            async with s.post(url + "/v1/completions", json=completion(prompt="x" * 5000)) as r:
                assert r.status == 413 and (await r.json())["error"]["code"] == 413
            async with s.post(url + "/v1/completions", data=b'{"prompt": "x",',
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400 and "Malformed JSON" in (await r.json())["error"]["message"]
            async with s.post(url + "/v1/completions", data=b"[1, 2]",
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400
            assert len(engine.seen) == 2
    run(scenario())


# ----------------------------------------------------------------------------- security
def test_client_keys_and_upstream_key_are_separate() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine, api_keys=("k-one", "k-two"), upstream_api_key="up-secret") as (server, url, s):
            async with s.post(url + "/v1/completions", json=completion()) as r:
                assert r.status == 401
            async with s.post(url + "/v1/completions", json=completion(),
                              headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with s.post(url + "/v1/completions", json=completion(),
                              headers={"Authorization": "Bearer k-two"}) as r:
                assert r.status == 200
            assert engine.seen[-1]["headers"]["Authorization"] == "Bearer up-secret"
            async with s.get(url + "/oomguard/status") as r:
                assert r.status == 401
            assert len(engine.seen) == 1
    run(scenario())


async def raw_get(url: str, target: str, host: str = "127.0.0.1") -> tuple[int, bytes]:
    """Send `GET target` as written (no client-side normalisation); returns (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_never_an_open_proxy() -> None:
    async def scenario():
        engine = FakeUpstream()
        engine.fail_every, engine.fail_status = 1, 200  # anything the engine answered would show
        async with stack(engine) as (server, url, s):
            for target in ("/v1/../v1/models/../../admin", "/v1/%2e%2e/admin", "/admin", "/v1//x",
                           "/v1/models/..%2f..%2fmetrics"):
                status, _ = await raw_get(url, target)
                assert status == 404, target
            # an absolute-form request target naming another host is never fetched from there
            status, body = await raw_get(url, "http://example.invalid/v1/models", host="example.invalid")
            assert b"example.invalid" not in body
            assert not engine.seen
    run(scenario())


# ----------------------------------------------------------------------------- observability
def test_metrics_status_and_access_log(caplog) -> None:
    async def scenario():
        engine = FakeUpstream()
        engine.kv_usage = 0.42
        async with stack(engine) as (server, url, s):
            await polled(server)
            async with s.post(url + "/v1/completions", json=completion(), headers={"x-priority": "high"}) as r:
                assert r.status == 200
            async with s.get(url + "/metrics") as r:
                text = await r.text()
            name = engine_name(engine)
            assert f'oomguard_proxy_upstream_kv_usage{{upstream="{name}"}} 0.42' in text
            assert f'oomguard_proxy_upstream_state{{state="open",upstream="{name}"}} 1.0' in text
            assert 'oomguard_proxy_queue_length{priority="high"} 0.0' in text
            assert 'oomguard_proxy_queue_time_seconds_count{priority="high"} 1.0' in text
            assert f'oomguard_proxy_admitted_total{{priority="high",upstream="{name}"}} 1.0' in text
            async with s.get(url + "/oomguard/status") as r:
                status = await r.json()
            assert status["upstreams"][name]["state"] == "open"

            from oomguard.proxy.status import render_status
            from rich.console import Console
            console = Console(width=160, record=True)
            console.print(render_status(status))
            table = console.export_text()
            assert name in table and "open" in table and "42%" in table

    import logging
    with caplog.at_level(logging.INFO, logger="oomguard.proxy.access"):
        run(scenario())
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "oomguard.proxy.access"]
    line = [x for x in lines if x["path"] == "/v1/completions"][0]
    assert line["status"] == 200 and line["priority"] == "high" and "upstream" in line and "queue_ms" in line
    assert "Hello" not in json.dumps(lines)  # no bodies in the log


def test_status_command_prints_table(capsys) -> None:
    from oomguard.cli import main

    async def scenario():
        engine = FakeUpstream()
        async with stack(engine) as (server, url, s):
            code = await asyncio.get_running_loop().run_in_executor(None, main, ["proxy", "--status", url])
            assert code == 0
    run(scenario())
    out = capsys.readouterr().out
    assert "upstreams" in out and "open" in out and "watermarks" in out


def test_cli_config_refuses_remote_listen_without_keys() -> None:
    from oomguard.cli import main

    assert main(["proxy", "--upstream", "http://127.0.0.1:9", "--listen", "0.0.0.0:8001"]) == 2
    assert main(["proxy"]) == 2
    assert main(["proxy", "--upstream", "http://127.0.0.1:9", "--high-watermark", "0.7"]) == 2


def test_trace_and_delete_are_refused_not_forwarded() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine) as (server, url, s):
            for method in ("TRACE", "DELETE", "PUT"):
                async with s.request(method, url + "/v1/models") as r:
                    assert r.status == 405, method
            async with s.get(url + "/v1/models") as r:
                assert r.status == 200
    run(scenario())


@pytest.mark.parametrize("args, words", [
    (["--queue-timeout", "nan"], "--queue-timeout must be a number"),
    (["--poll-interval", "inf"], "--poll-interval a number > 0"),
    (["--max-tokens-cap", "-5"], "--max-tokens-cap must be at least 1"),
    (["--max-retry-after", "-1"], "--max-retry-after must be at least 1"),
    (["--high-watermark", "nan"], "watermarks need"),
])
def test_settings_that_would_break_every_request_are_refused(args, words):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "oomguard", "proxy", "--upstream", "http://127.0.0.1:9", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr


def test_upstream_urls_are_checked_and_a_password_is_never_echoed(tmp_path):
    import subprocess
    import sys

    def proxy(*args):
        return subprocess.run([sys.executable, "-m", "oomguard", "proxy", *args], capture_output=True, text=True,
                              timeout=60)

    for bad in ("not a url", "http://h:99999", "ftp://h:21"):
        r = proxy("--upstream", bad)
        assert r.returncode == 2 and "--upstream" in r.stderr
    r = proxy("--upstream", "http://admin:hunter2@127.0.0.1:8000")
    assert r.returncode == 2 and "hunter2" not in r.stderr + r.stdout
    empty = tmp_path / "keys"
    empty.write_text("# no keys yet\n")
    r = proxy("--upstream", "http://127.0.0.1:8000", "--api-key-file", str(empty))
    assert r.returncode == 2 and "holds no key" in r.stderr   # an empty file never turns authentication off


def test_a_json_body_nested_100000_deep_is_a_400_not_a_crash() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine) as (server, url, s):
            body = b"[" * 100_000 + b"]" * 100_000
            async with s.post(url + "/v1/completions", data=body, headers={"content-type": "application/json"}) as r:
                assert r.status == 400 and "nested too deeply" in (await r.json())["error"]["message"]
            async with s.post(url + "/v1/completions", json=completion()) as r:
                assert r.status == 200
    run(scenario())


def test_engine_with_its_own_waiting_queue_gets_nothing_more_and_a_huge_metrics_page_is_not_read() -> None:
    async def scenario():
        engine = FakeUpstream()
        async with stack(engine) as (server, url, s):
            name = next(iter(server.controller.upstreams))
            engine.waiting = 3   # the engine queues: the proxy holds new requests until it drains
            await polled(server)
            t = asyncio.create_task(s.post(url + "/v1/completions", json=completion()))
            await wait_until(lambda: server.controller.queue_length() == 1)
            engine.waiting = 0
            r = await asyncio.wait_for(t, 10)
            assert r.status == 200
            engine.metrics_padding = 20 << 20   # 20 MiB: refused after 16, not held in memory
            await polled(server, 3)
            assert "larger than 16 MiB" in server.controller.upstreams[name].down_reason
    run(scenario())


def test_a_silent_upstream_stream_is_closed_after_the_idle_timeout() -> None:
    async def scenario():
        engine = FakeUpstream()
        engine.itl = 30.0   # one event, then silence
        async with stack(engine, read_timeout=1.0) as (server, url, s):
            start = time.monotonic()
            async with s.post(url + "/v1/completions", json=completion(stream=True)) as r:
                body = await asyncio.wait_for(r.read(), 10)
            assert time.monotonic() - start < 8
            assert b"failed mid-stream" in body and body.rstrip().endswith(b"data: [DONE]")
            assert server.controller.upstreams[next(iter(server.controller.upstreams))].in_flight == 0
    run(scenario())
