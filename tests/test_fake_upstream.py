"""The fake engine the proxy and load-test tests run against (testsupport/upstream.py) does what they rely on."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from oomguard.metrics import parse_metrics
from testsupport.upstream import FakeUpstream, answer_text


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=30))


def test_streams_plain_answers_and_metrics() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as engine, aiohttp.ClientSession() as s:
            async with s.get(engine.url + "/metrics") as r:
                assert "vllm:kv_cache_usage_perc" in await r.text()
            async with s.post(engine.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3,
                                                                    "stream": True}) as r:
                text = await r.text()
            assert text.endswith("data: [DONE]\n\n") and text.count("data: ") == 3 + 1
            async with s.post(engine.url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True,
                    "stream_options": {"include_usage": True}}) as r:
                events = [e[6:] for e in (await r.text()).split("\n\n") if e]
            assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]] == ["t0", "t1"]
            assert json.loads(events[2])["usage"]["completion_tokens"] == 2 and events[3] == "[DONE]"
            async with s.post(engine.url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 5}) as r:
                answer = await r.json()
            assert answer["choices"][0]["text"] == answer_text(5) and answer["usage"]["prompt_tokens"] == 3
            assert answer["echo_max_tokens"] == 5 and r.headers["x-engine"] == "fake"
            assert engine.completed == 3 and len(engine.seen) == 3 and engine.active == 0

    run(scenario())


def test_metrics_follow_the_load_unless_pinned() -> None:
    async def scenario() -> None:
        async with FakeUpstream(slots=2, itl=0.05) as engine, aiohttp.ClientSession() as s:
            async def metrics():
                async with s.get(engine.url + "/metrics") as r:
                    return parse_metrics(await r.text())

            streams = [asyncio.create_task(s.post(engine.url + "/v1/completions",
                                                  json={"prompt": "x", "max_tokens": 10, "stream": True}))
                       for _ in range(3)]
            await asyncio.sleep(0.2)
            busy = await metrics()
            assert (busy.kv_usage, busy.running, busy.waiting) == (1.0, 2, 1) and engine.preemptions == 1
            engine.kv_usage, engine.waiting = 0.42, 0
            pinned = await metrics()
            assert (pinned.kv_usage, pinned.waiting) == (0.42, 0)
            for r in await asyncio.gather(*streams):
                await r.read()

    run(scenario())


def test_head_keep_alive_and_faults() -> None:
    async def scenario() -> None:
        engine = FakeUpstream()
        async with engine, aiohttp.ClientSession() as s:
            async with s.get(engine.url + "/v1/models") as r:
                body = await r.read()
            async with s.head(engine.url + "/v1/models") as r:
                assert r.status == 200 and r.content_length == len(body)
            engine.fail_every, engine.fail_status = 2, 503
            statuses = []
            for _ in range(4):
                async with s.post(engine.url + "/v1/completions", json={"prompt": "x"}) as r:
                    statuses.append(r.status)
            assert statuses == [200, 503, 200, 503]
            async with s.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5000}) as r:
                assert r.status == 400 and "maximum context length is 4096" in (await r.json())["error"]["message"]
        # a second completion on a kept-alive connection is closed, unanswered
        engine = FakeUpstream()
        engine.drop_reused = True
        async with engine:
            reader, writer = await asyncio.open_connection(engine.host, engine.port)
            request = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}'
            writer.write(request * 2)
            data = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert data.count(b"HTTP/1.1 200 ") == 1 and engine.dropped == 1 and engine.completed == 1

    run(scenario())


def test_a_stopped_engine_settles_its_requests_and_can_come_back_on_its_port() -> None:
    async def scenario() -> None:
        engine = FakeUpstream(itl=0.05)
        async with engine, aiohttp.ClientSession() as s:
            r = await s.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100, "stream": True})
            await r.content.readline()
            await engine.stop()
            assert engine.active == 0 and engine.cancelled == 1
            r.close()
            async with FakeUpstream(port=engine.port) as again:
                async with s.get(again.url + "/health") as r:
                    assert r.status == 200

    run(scenario())
