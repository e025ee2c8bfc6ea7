"""`oomguard proxy` in front of real engines: llama-server (the shared fixture: tiny random-weight llama model)
and `oomguard simulate` (vLLM's scheduler and metrics), covering issue 6 item 8."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import aiohttp

from testsupport import free_port
from oomguard.metrics import parse_metrics
from oomguard.proxy.admission import Limits
from oomguard.proxy.command import running_proxy
from oomguard.proxy.server import ProxyConfig
from oomguard.proxy.upstreams import parse_upstream

POLL = 0.2


@contextlib.asynccontextmanager
async def proxied(*urls: str, config: dict | None = None, **limits):
    """A proxy in front of `urls` (Limits from `limits`, other ProxyConfig fields from `config`) and a client
    session: yields (server, url, session)."""
    limits.setdefault("poll_interval", POLL)
    proxy_config = ProxyConfig(upstreams=[parse_upstream(u) for u in urls], limits=Limits(**limits), **(config or {}))
    async with running_proxy(proxy_config) as (server, url), aiohttp.ClientSession() as session:
        yield server, url, session


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=120))


async def engine_sample(session: aiohttp.ClientSession, url: str, headers: dict | None = None):
    async with session.get(url + "/metrics", headers=headers) as r:
        assert r.status == 200, await r.text()
        return parse_metrics(await r.text())


async def wait_for(predicate, what: str, timeout: float = 20.0, interval: float = 0.02):
    """Poll `predicate` (plain or async) until it returns something truthy; returns that. Fails after `timeout`."""
    t0 = time.monotonic()
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() - t0 < timeout, f"timed out after {timeout:.0f} s waiting for {what}"
        await asyncio.sleep(interval)


async def proxy_status(session: aiohttp.ClientSession, url: str, headers: dict | None = None) -> dict:
    async with session.get(url + "/oomguard/status", headers=headers) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def start_blocker(session: aiohttp.ClientSession, url: str, headers: dict | None = None):
    """A long streaming completion through the proxy, started (first event read); the caller closes it, which
    makes llama-server drop it and frees the proxy's slot. Left unread it cannot end on its own, however fast the
    tiny model runs: with top-20 probabilities each event is ~2 KB, and 3500 of them (7 MB) are more than the
    sockets and readers buffer, so the proxy's relay waits on the reader."""
    r = await session.post(url + "/v1/completions", headers=headers,
                           json={"prompt": "Once", "max_tokens": 3500, "stream": True, "n_probs": 20})
    assert r.status == 200, await r.text()
    await r.content.readline()
    return r


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


# ---------------------------------------------------------------- issue 6 item 8, the rest against real engines
def test_llama_server_priorities_high_then_normal_then_low_fifo_within_class(llama_server) -> None:
    # one request in flight at a time: a long stream holds the slot while six requests queue in mixed order
    engine = llama_server(ctx_size=4096, parallel=1)

    async def scenario():
        async with proxied(engine.url, max_in_flight=1, queue_timeout=60) as (server, url, s):
            name = parse_upstream(engine.url).name
            blocker = await start_blocker(s, url)
            try:
                finished: list[str] = []

                async def send(tag: str, priority: str) -> None:
                    async with s.post(url + "/v1/completions", headers={"x-priority": priority},
                                      json={"prompt": tag, "max_tokens": 8}) as r:
                        assert r.status == 200, await r.text()
                        assert (await r.json())["usage"]["completion_tokens"] == 8
                    finished.append(tag)

                arrivals = [("low-1", "low"), ("normal-1", "normal"), ("low-2", "low"), ("high-1", "high"),
                            ("normal-2", "normal"), ("high-2", "high")]
                tasks = []
                for i, (tag, priority) in enumerate(arrivals, 1):  # one at a time, so the arrival order is known
                    tasks.append(asyncio.create_task(send(tag, priority)))
                    await wait_for(lambda: server.controller.queue_length() == i, f"{i} requests queued")
                status = await proxy_status(s, url)
                assert status["queue"] == {"high": 2, "normal": 2, "low": 2}
                assert status["upstreams"][name]["in_flight"] == 1 and not finished
            finally:
                blocker.close()  # the slot frees; the queue drains one request at a time
            await asyncio.gather(*tasks)
            assert finished == ["high-1", "high-2", "normal-1", "normal-2", "low-1", "low-2"]
            assert server.controller.upstreams[name].admitted_total == 7
    run(scenario())


def test_llama_server_full_queue_and_queue_timeout_get_429_with_retry_after(llama_server) -> None:
    engine = llama_server(ctx_size=4096, parallel=1)

    def check_429(r, body: dict, words: str) -> int:
        assert r.status == 429, body
        assert body["error"]["type"] == "RateLimitError" and words in body["error"]["message"]
        return int(r.headers["Retry-After"])

    async def scenario():
        name = parse_upstream(engine.url).name
        # 1. a full queue: 429 at once; a higher priority displaces the newest lower one, which gets the 429
        async with proxied(engine.url, max_in_flight=1, max_queue=2, queue_timeout=60) as (server, url, s):
            blocker = await start_blocker(s, url)
            try:
                queued = []
                for i in range(2):
                    queued.append(asyncio.create_task(s.post(url + "/v1/completions",
                                                             json={"prompt": f"n{i}", "max_tokens": 4})))
                    await wait_for(lambda: server.controller.queue_length() == i + 1, f"{i + 1} queued")
                for priority in ("normal", "low"):
                    t0 = time.monotonic()
                    async with s.post(url + "/v1/completions", headers={"x-priority": priority},
                                      json={"prompt": "one too many", "max_tokens": 4}) as r:
                        retry = check_429(r, await r.json(), "queue is full")
                    assert time.monotonic() - t0 < 5  # answered at once, not after waiting
                    assert 1 <= retry <= 60
                high = asyncio.create_task(s.post(url + "/v1/completions", headers={"x-priority": "high"},
                                                  json={"prompt": "urgent", "max_tokens": 4}))
                displaced = await asyncio.wait_for(queued[1], 20)
                assert 1 <= check_429(displaced, await displaced.json(), "displaced") <= 60
                assert server.controller.queue_length() == 2 and not queued[0].done() and not high.done()
            finally:
                blocker.close()
            for r in await asyncio.gather(high, queued[0]):
                assert r.status == 200, await r.text()
            status = await proxy_status(s, url)
            assert status["rejected"]["queue_full"] == 2 and status["rejected"]["evicted"] == 1
            assert status["upstreams"][name]["admitted_total"] == 3  # the rejected ones never reached the engine

        # 2. a request that waits past its queue timeout: 429 after the timeout, with Retry-After from the
        # observed drain rate (ten quick completions in the last seconds: the one request ahead drains in 1 s,
        # where the no-data fallback would be the queue timeout, 3 s)
        async with proxied(engine.url, max_in_flight=1, queue_timeout=3) as (server, url, s):
            for i in range(10):
                async with s.post(url + "/v1/completions", json={"prompt": f"q{i}", "max_tokens": 2}) as r:
                    assert r.status == 200
            blocker = await start_blocker(s, url)
            try:
                t0 = time.monotonic()
                async with s.post(url + "/v1/completions", json={"prompt": "patient", "max_tokens": 4}) as r:
                    waited = time.monotonic() - t0
                    retry = check_429(r, await r.json(), "past its timeout")
                assert 3 <= waited < 15
                assert retry == 1
                assert server.controller.upstreams[name].admitted_total == 11
            finally:
                blocker.close()
    run(scenario())


def test_llama_server_with_api_key_client_keys_body_limit_malformed_json(llama_server) -> None:
    # llama-server wants its own key on everything but /health (its /metrics included); clients hold other keys
    engine = llama_server(ctx_size=1024, parallel=1, extra_args=["--api-key", "engine-secret"])
    engine_auth = {"Authorization": "Bearer engine-secret"}

    async def scenario():
        name = parse_upstream(engine.url).name
        config = {"api_keys": ("client-a", "client-b"), "upstream_api_key": "engine-secret", "max_body_bytes": 4096}
        async with proxied(engine.url, config=config) as (server, url, s):
            before = (await engine_sample(s, engine.url, engine_auth)).prompt_tokens_total
            ask = {"prompt": "Hello", "max_tokens": 4}
            for headers in ({}, {"Authorization": "Bearer wrong"}, engine_auth, {"x-api-key": "engine-secret"},
                            {"Authorization": "Basic Y2xpZW50LWE6"}):
                async with s.post(url + "/v1/completions", json=ask, headers=headers) as r:
                    assert r.status == 401, headers  # the engine's own key is no client key
                    assert (await r.json())["error"]["type"] == "AuthenticationError"
            async with s.get(url + "/v1/models") as r:
                assert r.status == 401
            assert (await engine_sample(s, engine.url, engine_auth)).prompt_tokens_total == before
            assert server.controller.upstreams[name].admitted_total == 0
            # a client key is swapped for the engine's key (llama-server would refuse "client-a" itself)
            for headers in ({"Authorization": "Bearer client-a"}, {"x-api-key": "client-b"}):
                async with s.post(url + "/v1/completions", json=ask, headers=headers) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["usage"]["completion_tokens"] == 4
            async with s.get(url + "/v1/models", headers={"x-api-key": "client-a"}) as r:
                assert r.status == 200 and (await r.json())["data"][0]["id"] == "tiny-llama"
            admitted = server.controller.upstreams[name].admitted_total
            assert admitted == 2

            # body limit (declared length, and chunked with no length), malformed JSON: refused by the proxy
            key = {"Authorization": "Bearer client-a"}
            big = json.dumps({"prompt": "x" * 5000, "max_tokens": 4}).encode()
            async with s.post(url + "/v1/completions", data=big,
                              headers={**key, "Content-Type": "application/json"}) as r:
                assert r.status == 413 and "4096 bytes" in (await r.json())["error"]["message"]

            async def chunked():
                for i in range(0, len(big), 1000):
                    yield big[i:i + 1000]
            async with s.post(url + "/v1/completions", data=chunked(),
                              headers={**key, "Content-Type": "application/json"}) as r:
                assert r.status == 413
            for raw in (b'{"prompt": "Hello", "max_tokens": 4', b"[1, 2, 3]", b"\xff\xfe"):
                async with s.post(url + "/v1/completions", data=raw,
                                  headers={**key, "Content-Type": "application/json"}) as r:
                    body = await r.json()
                    assert r.status == 400 and body["error"]["type"] == "BadRequestError", body
            assert server.controller.upstreams[name].admitted_total == admitted  # none of them was forwarded
            status = await proxy_status(s, url, key)
            assert status["rejected"]["body_too_large"] == 2 and status["rejected"]["bad_request"] == 3
            assert status["rejected"]["unauthorized"] == 6
            # and the proxy still serves
            async with s.post(url + "/v1/completions", json=ask, headers=key) as r:
                assert r.status == 200

        # without the upstream key the proxy cannot reach the engine, and a client's key never stands in for it
        async with proxied(engine.url) as (server, url, s):
            status = await proxy_status(s, url)
            assert status["upstreams"][name]["state"] == "down"
            assert "401" in status["upstreams"][name]["reason"]
            async with s.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4},
                              headers=engine_auth) as r:
                assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
            assert server.controller.upstreams[name].admitted_total == 0
    run(scenario())


def test_llama_server_stopped_metrics_go_stale_proxy_fails_closed_then_resumes(llama_server) -> None:
    # SIGSTOP: the engine's socket still accepts connections but nothing answers. Its metrics go stale after
    # three poll intervals (paused, fail closed); a scrape that times out is a busy engine, not a dead one, so it
    # stays paused and requests queue (no 503 for everyone). SIGCONT: back to open, the queue drains.
    engine = llama_server(ctx_size=1024, parallel=1)
    poll = 0.1

    async def scenario():
        name = parse_upstream(engine.url).name
        async with proxied(engine.url, poll_interval=poll, queue_timeout=60) as (server, url, s):
            async with s.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4}) as r:
                assert r.status == 200
            assert (await proxy_status(s, url))["upstreams"][name]["state"] == "open"
            os.kill(engine.process.pid, signal.SIGSTOP)
            try:
                up = await wait_for(lambda: _upstream_not_open(s, url, name), "the upstream to leave 'open'",
                                    timeout=10)
                assert (up["state"], up["reason"]) == ("paused", "metrics stale"), up
                assert up["metrics_age_s"] >= round(3 * poll, 3)  # the status rounds the age to the millisecond
                # a request now is held by the proxy, not sent to the frozen engine
                held = asyncio.create_task(s.post(url + "/v1/completions",
                                                  json={"prompt": "held", "max_tokens": 4}))
                await wait_for(lambda: server.controller.queue_length() == 1, "the request to be queued")
                assert server.controller.upstreams[name].in_flight == 0
                # scrapes time out (1 s) and the upstream stays paused, not down: a new request queues too
                await asyncio.sleep(1.5)
                assert not server.controller.upstreams[name].down
                late = asyncio.create_task(s.post(url + "/v1/completions", json={"prompt": "late", "max_tokens": 4}))
                await wait_for(lambda: server.controller.queue_length() == 2, "the second request to be queued")
                assert not held.done() and server.controller.upstreams[name].admitted_total == 1
            finally:
                os.kill(engine.process.pid, signal.SIGCONT)
            for task in (held, late):
                r = await asyncio.wait_for(task, 30)
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 4
            await wait_for(lambda: _upstream_state(s, url, name, "open"), "the upstream to reopen", timeout=10)
    run(scenario())


async def _upstream_not_open(s: aiohttp.ClientSession, url: str, name: str):
    up = (await proxy_status(s, url))["upstreams"][name]
    return up if up["state"] != "open" else None


async def _upstream_state(s: aiohttp.ClientSession, url: str, name: str, state: str):
    up = (await proxy_status(s, url))["upstreams"][name]
    return up if up["state"] == state else None


def test_simulator_hysteresis_pauses_at_090_stays_paused_at_085_resumes_at_079(vllm_simulator) -> None:
    # 100 usable blocks of 128 tokens: one block is exactly 1% KV. A request of 128k+1 prompt tokens and
    # max_tokens 127 holds k+1 blocks from its prefill to its end (its last computed token is token 128(k+1)),
    # so KV usage moves only when a holder starts (a prefill) or is dropped (its client disconnects).
    # Decode steps take about 0.1 s (speed 0.05), so a holder lives about 13 s after its prefill.
    sim = vllm_simulator(num_gpu_blocks=101, block_size=128, max_model_len=12800, speed=0.05,
                         max_num_batched_tokens=16384)
    holders: dict[str, aiohttp.ClientResponse] = {}

    async def scenario():
        async with proxied(sim.url, poll_interval=0.1, queue_timeout=60) as (server, url, s):
            name = parse_upstream(sim.url).name

            async def hold(tag: str, blocks: int) -> None:  # straight to the engine: the proxy only watches
                r = await s.post(sim.url + "/v1/completions", json={
                    "model": "sim-model", "prompt": [7] * (128 * (blocks - 1) + 1), "max_tokens": 127,
                    "stream": True})
                assert r.status == 200
                holders[tag] = r
                await r.content.readline()  # first token: the prefill is done and the blocks are held

            async def seen(kv: float) -> dict:
                """The proxy's view once it has read `kv` from the engine's /metrics."""
                def check(up):
                    return up if up["kv_usage"] is not None and abs(up["kv_usage"] - kv) < 1e-9 else None
                return await wait_for(lambda: _status_where(s, url, name, check), f"the proxy to read KV {kv}")

            async def scrapes(n: int) -> None:
                """Let the proxy read the engine's metrics `n` more times."""
                for _ in range(n):
                    last = server.controller.upstreams[name].metrics_at
                    await wait_for(lambda: server.controller.upstreams[name].metrics_at != last, "a new scrape")

            # rising: open at 0.79 and 0.85, paused at 0.90
            await hold("a", 79)
            assert (await seen(0.79))["state"] == "open"
            await hold("b", 6)
            assert (await seen(0.85))["state"] == "open"
            await hold("c", 5)
            up = await seen(0.90)
            assert up["state"] == "paused" and "above the watermark" in up["reason"]
            # falling: still paused at 0.85; a request meanwhile waits in the proxy
            holders.pop("c").close()
            assert (await seen(0.85))["state"] == "paused"
            running = (await engine_sample(s, sim.url)).running
            probe = asyncio.create_task(s.post(url + "/v1/completions",
                                               json={"model": "sim-model", "prompt": "hi", "max_tokens": 3}))
            await wait_for(lambda: server.controller.queue_length() == 1, "the probe to be queued")
            await scrapes(3)
            up = (await proxy_status(s, url))["upstreams"][name]
            assert (up["state"], up["kv_usage"], up["in_flight"]) == ("paused", 0.85, 0)
            assert not probe.done() and (await engine_sample(s, sim.url)).running == running
            # resumes below 0.80: the probe goes through
            holders.pop("b").close()
            await wait_for(lambda: server.controller.queue_length() == 0, "the probe to be dispatched")
            r = await asyncio.wait_for(probe, 30)
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 3
            up = (await proxy_status(s, url))["upstreams"][name]
            assert up["state"] == "open" and up["admitted_total"] == 1
            assert (await engine_sample(s, sim.url)).preemptions_total == 0

    try:
        run(scenario())
    finally:
        for r in holders.values():
            r.close()


async def _status_where(s: aiohttp.ClientSession, url: str, name: str, check):
    return check((await proxy_status(s, url))["upstreams"][name])
