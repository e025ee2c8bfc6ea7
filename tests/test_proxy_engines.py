"""`oomguard proxy` in front of a real llama-server (the shared fixture: tiny random-weight llama model)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp

from oomguard.engines.llamacpp.server import free_port
from oomguard.metrics import parse_metrics
from oomguard.proxy.admission import Limits
from oomguard.proxy.command import running_proxy
from oomguard.proxy.server import ProxyConfig
from oomguard.proxy.upstreams import parse_upstream

POLL = 0.2


@contextlib.asynccontextmanager
async def proxied(*urls: str, **limits):
    limits.setdefault("poll_interval", POLL)
    config = ProxyConfig(upstreams=[parse_upstream(u) for u in urls], limits=Limits(**limits))
    async with running_proxy(config) as (server, url), aiohttp.ClientSession() as session:
        yield server, url, session


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=120))


async def engine_sample(session: aiohttp.ClientSession, url: str):
    async with session.get(url + "/metrics") as r:
        return parse_metrics(await r.text())


def test_llama_server_pass_through_models_completion_stream_chat(llama_server) -> None:
    engine = llama_server(ctx_size=1024, parallel=2)

    async def scenario():
        async with proxied(engine.url) as (server, url, s):
            name = parse_upstream(engine.url).name
            assert server.controller.upstreams[name].max_model_len == 512  # one slot's context
            async with s.get(url + "/v1/models") as r:
                assert r.status == 200 and (await r.json())["data"][0]["id"] == "tiny-llama"
            async with s.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8}) as r:
                body = await r.json()
                assert r.status == 200 and body["usage"]["completion_tokens"] == 8
            events = []
            async with s.post(url + "/v1/completions",
                              json={"prompt": "Hello", "max_tokens": 12, "stream": True}) as r:
                assert r.headers["Content-Type"].startswith("text/event-stream")
                async for line in r.content:
                    if line.startswith(b"data: "):
                        events.append(line[6:].strip())
            assert events[-1] == b"[DONE]" and len(events) >= 12
            assert all("choices" in json.loads(e) for e in events[:-1])
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            async with s.post(url + "/v1/chat/completions", json=chat) as r:
                assert r.status == 200 and (await r.json())["object"] == "chat.completion"
            # the engine's own errors come back unchanged
            async with s.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": "many"}) as r:
                assert r.status in (400, 500) and "error" in await r.json()
    run(scenario())


def test_llama_server_context_length_rejected_before_engine(llama_server) -> None:
    engine = llama_server(ctx_size=1024, parallel=2)

    async def scenario():
        async with proxied(engine.url) as (server, url, s):
            before = (await engine_sample(s, engine.url)).prompt_tokens_total
            prompt = "hello " * 1000  # 6000 bytes: at least 750 tokens by the bytes bound, > 512
            async with s.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8}) as r:
                assert r.status == 400
                err = (await r.json())["error"]
            assert err["message"].startswith("This model's maximum context length is 512 tokens.")
            assert "at least 750 input tokens" in err["message"]
            after = (await engine_sample(s, engine.url)).prompt_tokens_total
            assert after == before  # the engine never saw it
    run(scenario())


def test_llama_server_client_disconnect_cancels_generation(llama_server) -> None:
    engine = llama_server(ctx_size=4096, parallel=1)

    async def scenario():
        async with proxied(engine.url) as (server, url, s):
            async with s.post(url + "/v1/completions",
                              json={"prompt": "Once", "max_tokens": 3500, "stream": True}) as r:
                await r.content.readline()
                sample = await engine_sample(s, engine.url)
                assert sample.running == 1
            t0 = time.monotonic()
            while (await engine_sample(s, engine.url)).running != 0:
                assert time.monotonic() - t0 < 5, "llama-server kept generating after the client left"
                await asyncio.sleep(0.05)
            predicted = (await engine_sample(s, engine.url)).generation_tokens_total
            assert predicted < 3500
            name = parse_upstream(engine.url).name
            assert server.controller.upstreams[name].in_flight == 0
    run(scenario())


def test_llama_server_killed_and_restarted_loses_no_queued_request(llama_server) -> None:
    engine = llama_server(ctx_size=1024, parallel=1, port=free_port())  # a fixed port, kept on restart

    async def scenario():
        loop = asyncio.get_running_loop()
        async with proxied(engine.url, max_in_flight=1, queue_timeout=60) as (server, url, s):
            name = parse_upstream(engine.url).name
            tasks = [asyncio.create_task(s.post(url + "/v1/completions",
                                                json={"prompt": f"req {i}", "max_tokens": 600}))
                     for i in range(6)]
            t0 = time.monotonic()
            while server.controller.queue_length() < 5:  # one in flight (about 2 s of work), five queued
                assert time.monotonic() - t0 < 10
                await asyncio.sleep(0.01)
            engine.kill()
            t0 = time.monotonic()
            while not server.controller.upstreams[name].down:
                assert time.monotonic() - t0 < 10
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            await loop.run_in_executor(None, engine.start)  # same port
            results = await asyncio.gather(*tasks)
            statuses = [r.status for r in results]
            bodies = [await r.json() for r in results]
            assert statuses == [200] * 6, bodies
            assert all(b["usage"]["completion_tokens"] == 600 for b in bodies)
            async with s.get(url + "/oomguard/status") as r:
                status = await r.json()
            assert status["upstreams"][name]["state"] == "open"
    run(scenario())


def test_llama_server_down_gives_503_then_recovers(llama_server) -> None:
    engine = llama_server(ctx_size=512, parallel=1, port=free_port())

    async def scenario():
        loop = asyncio.get_running_loop()
        async with proxied(engine.url) as (server, url, s):
            engine.kill()
            name = parse_upstream(engine.url).name
            t0 = time.monotonic()
            while not server.controller.upstreams[name].down:
                assert time.monotonic() - t0 < 10
                await asyncio.sleep(0.05)
            async with s.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as r:
                assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
            await loop.run_in_executor(None, engine.start)
            t0 = time.monotonic()
            while server.controller.upstreams[name].down:
                assert time.monotonic() - t0 < 10
                await asyncio.sleep(0.05)
            async with s.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as r:
                assert r.status == 200
    run(scenario())


def test_simulator_kv_pressure_pauses_and_resumes(vllm_simulator) -> None:
    # 64 usable blocks of 16 tokens; two requests of 440 prompt + 40 output tokens hold 56 -> 60 blocks
    # (KV 0.875 -> 0.94): the proxy pauses at 0.90, queues a new request, and sends it once KV is below 0.80.
    sim = vllm_simulator(num_gpu_blocks=65, max_model_len=512, speed=0.1)

    async def scenario():
        async with proxied(sim.url) as (server, url, s):
            name = parse_upstream(sim.url).name
            heavy = {"model": "sim-model", "prompt": "w " * 440, "max_tokens": 40}
            direct = [asyncio.create_task(s.post(sim.url + "/v1/completions", json=heavy)) for _ in range(2)]
            t0 = time.monotonic()
            while server.controller.snapshot()["upstreams"][name]["state"] != "paused":
                assert time.monotonic() - t0 < 30, server.controller.snapshot()
                await asyncio.sleep(0.02)
            assert server.controller.upstreams[name].kv_usage >= 0.90
            light = asyncio.create_task(s.post(url + "/v1/completions",
                                               json={"model": "sim-model", "prompt": "hi", "max_tokens": 5}))
            await asyncio.sleep(0.1)
            assert server.controller.queue_length() == 1 and not light.done()
            done_direct = await asyncio.gather(*direct)
            t_direct = time.monotonic()
            assert [r.status for r in done_direct] == [200, 200]
            r = await light
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 5
            assert time.monotonic() >= t_direct
            sample = await engine_sample(s, sim.url)
            assert sample.preemptions_total == 0
    run(scenario())
