"""`oomguard simulate` over loopback: the OpenAI API as vLLM serves it, /metrics, KV exhaustion, crash mode, CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from oomguard.engines.vllm.versions import parse_version
from oomguard.metrics import parse_metrics
from oomguard.simulate.server import count_tokens

LLAMA_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False,
}


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


def _post(url: str, body: dict, timeout: float = 60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read().decode())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read().decode())


def _stream(url: str, body: dict) -> list[str]:
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return [line.decode().strip()[6:] for line in resp if line.startswith(b"data: ")]


@pytest.fixture(scope="module")
def sim(vllm_simulator_module):
    return vllm_simulator_module(num_gpu_blocks=500, max_model_len=2048, speed=1000, vllm_version="0.19.0")


def test_models_health_version(sim):
    assert _get(sim.url + "/health")[0] == 200
    assert json.loads(_get(sim.url + "/version")[1]) == {"version": "0.19.0"}
    models = json.loads(_get(sim.url + "/v1/models")[1])
    card = models["data"][0]
    assert card["id"] == "sim-model" and card["owned_by"] == "vllm" and card["max_model_len"] == 2048


def test_completion_shape_and_token_counts(sim):
    status, body = _post(sim.url + "/v1/completions",
                         {"model": "sim-model", "prompt": "Hello, world: how are you?", "max_tokens": 12})
    assert status == 200
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and count_tokens(choice["text"]) == 12
    assert body["usage"] == {"prompt_tokens": 8, "total_tokens": 20, "completion_tokens": 12,
                             "prompt_tokens_details": None}
    status, body = _post(sim.url + "/v1/completions", {"prompt": list(range(50)), "max_tokens": 3})
    assert status == 200 and body["usage"]["prompt_tokens"] == 50


def test_streaming_completion_and_chat(sim):
    events = _stream(sim.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 7,
                                                   "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert len(texts) == 7 and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 7

    events = _stream(sim.url + "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "hi there"}], "max_completion_tokens": 4})
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:]] == [None, None, None, "length"]

    status, body = _post(sim.url + "/v1/chat/completions",
                         {"messages": [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "hi"}], "max_tokens": 5})
    assert status == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] == 1 + 4 + 5 * 2 + 3  # template + "be brief" + "hi"


def test_tokenize_counts_what_the_engine_will_count(sim):
    text = "Hello, world: how are you?"
    status, body = _post(sim.url + "/tokenize", {"model": "sim-model", "prompt": text})
    assert status == 200 and body["count"] == 8 == len(body["tokens"]) and body["max_model_len"] == 2048
    done = _post(sim.url + "/v1/completions", {"prompt": text, "max_tokens": 1})[1]
    assert done["usage"]["prompt_tokens"] == body["count"]
    messages = [{"role": "user", "content": "hi there"}]
    chat = _post(sim.url + "/tokenize", {"messages": messages})[1]["count"]
    assert chat == _post(sim.url + "/v1/chat/completions", {"messages": messages, "max_tokens": 1})[1]["usage"][
        "prompt_tokens"]


def test_context_length_400_in_vllm_words(sim):
    status, body = _post(sim.url + "/v1/completions", {"prompt": "word " * 2000, "max_tokens": 100})
    assert status == 400
    assert body["error"]["message"] == (
        "This model's maximum context length is 2048 tokens. However, you requested 100 output tokens and your "
        "prompt contains 2000 input tokens, for a total of 2100 tokens. Please reduce the length of the input "
        "prompt or the number of requested output tokens.")
    assert body["error"]["code"] == 400 and body["error"]["type"] == "BadRequestError"


def test_bad_requests(sim):
    assert _post(sim.url + "/v1/completions", {"model": "other", "prompt": "x"})[0] == 404
    assert _post(sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 0})[0] == 400
    req = urllib.request.Request(sim.url + "/v1/completions", data=b"{not json", headers={"Content-Type": "x"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)
    assert info.value.code == 400


def test_metrics_names_of_the_chosen_version(sim):
    _post(sim.url + "/v1/completions", {"prompt": "x y", "max_tokens": 5})
    status, text = _get(sim.url + "/metrics")
    sample = parse_metrics(text)
    assert sample.engine == "vllm"
    assert sample.cache_config["num_gpu_blocks"] == "500" and sample.cache_config["block_size"] == "16"
    assert sample.kv_usage == 0.0 and sample.running == 0 and sample.waiting == 0
    assert sample.generation_tokens_total >= 5 and sample.ttft_seconds_count >= 1
    assert "vllm:kv_cache_usage_perc" in sample.raw and "vllm:gpu_cache_usage_perc" not in sample.raw
    assert "vllm:inter_token_latency_seconds_count" in sample.raw


@pytest.mark.parametrize("version, old, new", [("0.8.5", True, False), ("0.10.1", True, True),
                                               ("0.12.0", False, True)])
def test_kv_usage_metric_name_follows_version(vllm_simulator, version, old, new):
    sim = vllm_simulator(num_gpu_blocks=300, max_model_len=1024, vllm_version=version)
    raw = parse_metrics(_get(sim.url + "/metrics")[1]).raw
    assert ("vllm:gpu_cache_usage_perc" in raw) == old
    assert ("vllm:kv_cache_usage_perc" in raw) == new
    body = _post(sim.url + "/v1/completions", {"prompt": "x " * 1200, "max_tokens": 10})[1]
    assert ("object" in body) == (parse_version(version) < (0, 10, 0))  # the error body shape changed in 0.10


async def _load(url: str, n: int, prompt_words: int, max_tokens: int, sample_every: float = 0.005):
    """n concurrent streamed requests; samples /metrics meanwhile; returns (token counts, KV usages seen)."""
    usages: list[float] = []
    done = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        async def one(i: int) -> int:
            body = {"prompt": "w " * prompt_words, "max_tokens": max_tokens, "stream": True}
            count = 0
            async with session.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        count += 1
            return count

        async def sampler():
            while not done.is_set():
                async with session.get(url + "/metrics") as resp:
                    usages.append(parse_metrics(await resp.text()).kv_usage)
                await asyncio.sleep(sample_every)

        task = asyncio.create_task(sampler())
        counts = await asyncio.gather(*(one(i) for i in range(n)))
        done.set()
        await task
    return counts, usages


def test_kv_exhaustion_preempts_and_every_request_still_completes(vllm_simulator):
    # 64 usable blocks = 1024 tokens; 8 requests that grow to 400 tokens each cannot all stay resident
    sim = vllm_simulator(num_gpu_blocks=65, max_model_len=512, speed=20, vllm_version="0.19.0")
    counts, usages = asyncio.run(_load(sim.url, n=8, prompt_words=100, max_tokens=300))
    assert counts == [300] * 8
    sample = parse_metrics(_get(sim.url + "/metrics")[1])
    assert sample.preemptions_total > 0
    assert max(usages) >= 0.9
    assert sample.kv_usage == 0.0 and sample.requests_success_total == 8


def test_max_num_seqs_bounds_running(vllm_simulator):
    sim = vllm_simulator(num_gpu_blocks=2000, max_model_len=1024, max_num_seqs=3, speed=20)

    async def go():
        running_seen = []
        async with aiohttp.ClientSession() as session:
            async def one():
                async with session.post(sim.url + "/v1/completions", json={"prompt": "a", "max_tokens": 200}) as r:
                    return (await r.json())["usage"]["completion_tokens"]

            tasks = [asyncio.create_task(one()) for _ in range(7)]
            while not all(t.done() for t in tasks):
                async with session.get(sim.url + "/metrics") as resp:
                    s = parse_metrics(await resp.text())
                    running_seen.append((s.running, s.waiting))
                await asyncio.sleep(0.01)
            return [t.result() for t in tasks], running_seen

    results, seen = asyncio.run(go())
    assert results == [200] * 7
    assert max(r for r, _ in seen) == 3 and max(w for _, w in seen) >= 1


def test_step_time_follows_the_roofline(vllm_simulator):
    # generic 8B bf16 on H100: a decode step reads 16 GB of weights at 3.35 TB/s ~ 4.8 ms of GPU time
    sim = vllm_simulator(num_gpu_blocks=1000, max_model_len=1024, speed=2)
    start = time.monotonic()
    status, body = _post(sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 200})
    elapsed = time.monotonic() - start
    expected = 200 * 16_060_522_496 / 3.35e12 / 2
    assert status == 200
    assert expected * 0.9 <= elapsed <= expected * 3 + 0.5


def test_crash_on_kv_exhaustion_exits_like_a_cuda_oom(vllm_simulator):
    sim = vllm_simulator(num_gpu_blocks=65, max_model_len=512, speed=50, crash_on_kv_exhaustion=True)

    async def go():
        async with aiohttp.ClientSession() as session:
            async def one():
                try:
                    async with session.post(sim.url + "/v1/completions",
                                            json={"prompt": "w " * 100, "max_tokens": 300}) as resp:
                        await resp.read()
                except aiohttp.ClientError:
                    pass
            await asyncio.gather(*(one() for _ in range(8)))

    asyncio.run(go())
    assert sim.wait(timeout=20) == 1
    out = sim.output()
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in out
    assert "EngineCore encountered a fatal error." in out
    assert "GPU KV cache size: 1,040 tokens" in out  # the startup lines came first


def test_startup_lines_carry_the_kv_facts(vllm_simulator):
    sim = vllm_simulator(num_gpu_blocks=400, max_model_len=2048, vllm_version="0.10.1")
    out = sim.output()
    assert "Available KV cache memory: " in out
    assert "GPU KV cache size: 6,400 tokens" in out
    assert "Maximum concurrency for 2,048 tokens per request: 3.12x" in out
    assert "Application startup complete." in out
    sim_v0 = vllm_simulator(num_gpu_blocks=400, max_model_len=2048, vllm_version="0.6.6")
    assert "# GPU blocks: 400, # CPU blocks: 2048" in sim_v0.output()


def test_oomguard_diagnose_reads_the_simulators_logs(vllm_simulator, tmp_path):
    """Startup lines give diagnose the KV facts; the crash-mode traceback is a runtime CUDA OOM to it."""
    sim = vllm_simulator(num_gpu_blocks=65, max_model_len=512, speed=50, vllm_version="0.10.1",
                         crash_on_kv_exhaustion=True)

    async def go():
        async with aiohttp.ClientSession() as session:
            async def one():
                try:
                    async with session.post(sim.url + "/v1/completions",
                                            json={"prompt": "w " * 100, "max_tokens": 300}) as resp:
                        await resp.read()
                except aiohttp.ClientError:
                    pass
            await asyncio.gather(*(one() for _ in range(8)))

    asyncio.run(go())
    assert sim.wait(timeout=30) == 1
    log = tmp_path / "sim.log"
    log.write_text(sim.output())
    done = subprocess.run([sys.executable, "-m", "oomguard", "diagnose", str(log), "--json", "--no-planner"],
                          capture_output=True, text=True, timeout=60)
    report = json.loads(done.stdout)
    facts = report["facts"]
    assert facts["engine"] == "vllm" and facts["vllm_version"] == "0.10.1" and facts["max_model_len"] == 512
    assert facts["kv_cache_tokens"] == 65 * 16 and facts["block_size"] == 16
    assert "speed" not in facts.get("non_default_args", {})  # only vLLM's own flags in the args line
    assert done.returncode == 1 and report["findings"][0]["class"] == "oom_runtime"


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oomguard", "simulate", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_cli_refuses_what_vllm_refuses():
    unknown = _cli("no/such-model", "--port", "0")
    assert unknown.returncode == 2 and "--num-gpu-blocks" in unknown.stderr
    small = _cli("m", "--num-gpu-blocks", "100", "--max-model-len", "4096", "--port", "0")
    assert small.returncode == 1
    assert "To serve at least one request with the model's max seq len (4096)" in small.stderr
    assert _cli("m", "--num-gpu-blocks", "100", "--speed", "0").returncode == 2
    for bad in (["--speed", "nan"], ["--speed", "inf"], ["--num-gpu-blocks", "10000000000000"]):
        r = _cli("m", "--num-gpu-blocks", "100", *bad, "--port", "0") if bad[0] == "--speed" else _cli("m", *bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr, bad   # refused at once, not run out of memory


def test_block_count_comes_from_the_planner(vllm_simulator, tmp_path):
    from oomguard.plan.api import predict

    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_8B_CONFIG))
    expected = predict("meta-llama/Llama-3.1-8B-Instruct", "h100", vllm_version="0.19.0",
                       flags={"max_model_len": 8192}, model_config=str(config))
    sim = vllm_simulator("meta-llama/Llama-3.1-8B-Instruct", num_gpu_blocks=None, max_model_len=8192,
                         gpu="h100", vllm_version="0.19.0", extra_args=["--model-config", str(config)])
    sample = parse_metrics(_get(sim.url + "/metrics")[1])
    assert int(sample.cache_config["num_gpu_blocks"]) == expected.num_gpu_blocks
    assert f"GPU KV cache size: {expected.kv_cache_tokens:,} tokens" in sim.output()
    assert json.loads(_get(sim.url + "/v1/models")[1])["data"][0]["max_model_len"] == 8192
