"""`oomguard diagnose --metrics URL [--watch S]` against a real HTTP server on 127.0.0.1 serving metric pages
written with vLLM's (old and new names), llama.cpp's and SGLang's real metric names."""

import asyncio
import json
import threading

import pytest
from aiohttp import web

from oomguard.cli import main

L = '{engine="0",model_name="m"}'


def vllm_page(kv=0.97, waiting=12, preempt=5, queries=100000, hits=12000, queue_sum=40.0, ttft_sum=50.0, rss=1e9,
              old=False):
    usage = "vllm:gpu_cache_usage_perc" if old else "vllm:kv_cache_usage_perc"
    pq = "vllm:gpu_prefix_cache_queries" if old else "vllm:prefix_cache_queries"
    ph = "vllm:gpu_prefix_cache_hits" if old else "vllm:prefix_cache_hits"
    return f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{L} 48.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{L} {waiting}
# TYPE {usage} gauge
{usage}{L} {kv}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{L} {preempt}
# TYPE {pq} counter
{pq}_total{L} {queries}
# TYPE {ph} counter
{ph}_total{L} {hits}
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{L} 300000.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{L} 100000.0
# TYPE vllm:request_success counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} 100.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{L} {ttft_sum}
vllm:time_to_first_token_seconds_count{L} 100.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{L} {queue_sum}
vllm:request_queue_time_seconds_count{L} 100.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_gpu_blocks="27000"}} 1.0
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes {rss}
"""


LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 5120
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 2048
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.95
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""

SGLANG = """# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.42
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.61
"""


class Server:
    """An aiohttp server on 127.0.0.1 in a thread; `pages` maps a path to a list of texts served in turn."""

    def __init__(self, pages):
        self.pages, self.hits = pages, {}
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    async def _handle(self, request):
        path = request.path
        if path not in self.pages:
            return web.Response(status=404, text="not found")
        n = self.hits.get(path, 0)
        self.hits[path] = n + 1
        texts = self.pages[path]
        return web.Response(text=texts[min(n, len(texts) - 1)], content_type="text/plain")

    def _run(self):
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def server():
    pages = {
        "/vllm": [vllm_page()],
        "/vllm-old": [vllm_page(old=True)],
        "/healthy": [vllm_page(kv=0.3, waiting=0, preempt=0, hits=80000, queue_sum=0.5)],
        "/llamacpp": [LLAMACPP],
        "/sglang": [SGLANG],
        "/html": ["<html><body>hello</body></html>"],
        "/watch": [vllm_page(kv=0.5, waiting=w, preempt=p, queries=100000 + 10000 * i, hits=50000 + 1000 * i,
                             rss=1e9 + i * 2e8, queue_sum=40.0, ttft_sum=50.0)
                   for i, (w, p) in enumerate(zip(range(0, 40, 4), range(0, 50, 5)))],
    }
    s = Server(pages)
    yield s
    s.close()


def diagnose(args, capsys):
    code = main(["diagnose", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_vllm_new_names_kv_pressure_prefix_and_queue(server, capsys):
    code, data, _ = diagnose(["--metrics", server.url("/vllm")], capsys)
    classes = [f["class"] for f in data["findings"]]
    assert code == 1
    assert {"kv_pressure", "prefix_cache_low_hit_rate", "ttft_queue_bound", "preemptions_rising"} <= set(classes)
    kv = next(f for f in data["findings"] if f["class"] == "kv_pressure")
    # 27000 blocks x 16 tokens = 432,000 tokens; (300k prompt + 100k output) / 100 requests = 4,000 per request
    assert {"flag": "--max-num-seqs", "value": 108, "reason": kv["fixes"][0]["reason"]} == kv["fixes"][0]
    prefix = next(f for f in data["findings"] if f["class"] == "prefix_cache_low_hit_rate")
    assert prefix["fixes"][0]["flag"] == "--no-enable-prefix-caching"
    assert data["facts"]["engine"] == "vllm" and data["facts"]["kv_cache_tokens"] == 432000


def test_vllm_old_names_are_normalised(server, capsys):
    code, data, _ = diagnose(["--metrics", server.url("/vllm-old")], capsys)
    assert code == 1 and "kv_pressure" in [f["class"] for f in data["findings"]]
    assert data["facts"]["kv_usage"] == 0.97


def test_healthy_server_exits_0(server, capsys):
    code, data, _ = diagnose(["--metrics", server.url("/healthy")], capsys)
    assert code == 0 and data["findings"] == []


def test_llamacpp_and_sglang(server, capsys):
    code, data, _ = diagnose(["--metrics", server.url("/llamacpp")], capsys)
    assert code == 1 and data["findings"][0]["class"] == "kv_pressure" and data["facts"]["engine"] == "llamacpp"
    code, data, _ = diagnose(["--metrics", server.url("/sglang")], capsys)
    assert code == 0 and data["facts"]["engine"] == "sglang" and data["facts"]["prefix_cache_hit_rate"] == 0.61


def test_watch_sees_trends(server, capsys):
    code, data, _ = diagnose(["--metrics", server.url("/watch"), "--watch", "1.5", "--interval", "0.15"], capsys)
    classes = [f["class"] for f in data["findings"]]
    assert code == 1
    assert {"preemptions_rising", "queue_growing", "memory_growing"} <= set(classes)
    assert data["facts"]["samples"] >= 4


@pytest.mark.parametrize("path,needle", [("/missing", "HTTP 404"), ("/html", "not a Prometheus")])
def test_unreadable_pages_exit_2(server, capsys, path, needle):
    code, data, err = diagnose(["--metrics", server.url(path)], capsys)
    assert code == 2 and needle in err and "Traceback" not in err


# -- the vLLM simulator (`oomguard simulate`) under load: a real /metrics page, old and new names ----------------
def _load(url, n=24, prompt_words=150, max_tokens=200):
    import threading
    import urllib.request

    def post():
        body = json.dumps({"model": "sim-model", "prompt": "word " * prompt_words, "max_tokens": max_tokens}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=120).read()
        except OSError:  # the simulator stops at the end of the test
            pass

    threads = [threading.Thread(target=post, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.parametrize("version,usage_name", [("0.8.5", "vllm:gpu_cache_usage_perc"),
                                                ("0.19.0", "vllm:kv_cache_usage_perc")])
def test_simulator_under_load_old_and_new_names(vllm_simulator, capsys, version, usage_name):
    import urllib.request
    # 80 blocks x 16 = 1,280 tokens of KV cache; 24 requests of about 350 tokens each cannot all fit
    sim = vllm_simulator(num_gpu_blocks=80, max_model_len=1024, speed=1.0, vllm_version=version)
    page = urllib.request.urlopen(sim.url + "/metrics", timeout=10).read().decode()
    assert usage_name in page
    other = {"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"} - {usage_name}
    assert not any(line.startswith(tuple(other)) for line in page.splitlines())  # only one of the two names
    _load(sim.url)
    code, data, _ = diagnose(["--metrics", sim.url + "/metrics", "--watch", "2", "--interval", "0.2"], capsys)
    classes = [f["class"] for f in data["findings"]]
    assert code == 1
    assert {"kv_pressure", "preemptions_rising"} <= set(classes), classes
    kv = next(f for f in data["findings"] if f["class"] == "kv_pressure")
    seqs = next(f["value"] for f in kv["fixes"] if f.get("flag") == "--max-num-seqs")
    assert 1 <= seqs <= 1280 // 150  # requests of at least 150 prompt tokens: no more than 8 fit in 1,280 tokens
    assert data["facts"]["engine"] == "vllm" and data["facts"]["kv_cache_tokens"] == 1280


def test_idle_simulator_is_healthy(vllm_simulator, capsys):
    sim = vllm_simulator(num_gpu_blocks=1000, max_model_len=2048, speed=100.0, vllm_version="0.11.0")
    code, data, _ = diagnose(["--metrics", sim.url + "/metrics"], capsys)
    assert code == 0 and data["findings"] == [] and data["facts"]["kv_usage"] == 0


# -- rules one by one, on pages with the engines' real names -----------------------------------------------------
def gpu_page(used_mib, util=0.5):
    return vllm_page(kv=util, waiting=0, preempt=0, hits=80000, queue_sum=0.5) + (
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-1",modelName="NVIDIA H100 80GB HBM3"}} {used_mib}\n')


def test_rules_one_at_a_time():
    from oomguard.diagnose.metrics_watch import metric_findings
    from oomguard.metrics import parse_metrics

    def classes(pages, dt=1.0):
        return {f.cls for f in metric_findings([(i * dt, parse_metrics(p)) for i, p in enumerate(pages)])}

    # KV pressure needs both: nearly full AND requests waiting
    assert "kv_pressure" in classes([vllm_page(kv=0.95, waiting=3)])
    assert "kv_pressure" not in classes([vllm_page(kv=0.95, waiting=0)])
    assert "kv_pressure" not in classes([vllm_page(kv=0.85, waiting=9)])
    # preemptions rising across a window; flat counters are not
    assert "preemptions_rising" in classes([vllm_page(preempt=5), vllm_page(preempt=9)])
    assert "preemptions_rising" not in classes([vllm_page(preempt=5), vllm_page(preempt=5)])
    # queue growing: monotonic over >= 3 scrapes
    assert "queue_growing" in classes([vllm_page(waiting=w) for w in (1, 3, 6, 9)])
    assert "queue_growing" not in classes([vllm_page(waiting=w) for w in (1, 9, 3, 9)])
    # prefix cache hit rate under 30% only matters when prefix caching is on
    low = vllm_page(queries=100000, hits=12000)
    assert "prefix_cache_low_hit_rate" in classes([low])
    assert "prefix_cache_low_hit_rate" not in classes([low.replace('enable_prefix_caching="True"',
                                                                   'enable_prefix_caching="False"')])
    assert "prefix_cache_low_hit_rate" not in classes([vllm_page(queries=100000, hits=45000)])
    # GPU memory (DCGM exporter gauge on the same page) growing on every scrape is a leak; a plateau is not
    assert "memory_growing" in classes([gpu_page(40000 + 300 * i) for i in range(5)])
    assert "memory_growing" not in classes([gpu_page(40000 + 300 * (i % 2)) for i in range(5)])
    assert "memory_growing" not in classes([gpu_page(40000) for _ in range(5)])
    # TTFT dominated by queue time (means over the window), not when prefill dominates
    assert "ttft_queue_bound" in classes([vllm_page(queue_sum=40.0, ttft_sum=50.0)])
    assert "ttft_queue_bound" not in classes([vllm_page(queue_sum=5.0, ttft_sum=50.0)])


def test_sglang_kv_pressure_and_low_hit_rate_is_read():
    from oomguard.diagnose.metrics_watch import metric_findings
    from oomguard.metrics import parse_metrics
    page = SGLANG.replace("0.42", "0.96").replace('sglang:num_queue_reqs{model_name="m"} 0',
                                                  'sglang:num_queue_reqs{model_name="m"} 7')
    sample = parse_metrics(page)
    assert sample.engine == "sglang" and sample.kv_usage == 0.96 and sample.waiting == 7
    assert [f.cls for f in metric_findings([(0.0, sample)])] == ["kv_pressure"]


LLAMACPP_NEW = """# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 5120
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 9
"""


@pytest.fixture
def pages_server():
    s = Server({"/metrics": [LLAMACPP_NEW], "/idle/metrics": [vllm_page(kv=0.1, waiting=0, preempt=0, hits=80000)]})
    yield s
    s.close()


def test_llama_server_with_every_slot_busy_and_requests_deferred_is_at_capacity(pages_server, capsys):
    code, out, _ = diagnose(["--metrics", pages_server.url("/")], capsys)   # the base URL: /metrics is found
    assert code == 1
    top = out["findings"][0]
    assert top["class"] == "queue_growing" and "9 requests are deferred" in top["summary"]
    assert {"flag": "-np", "value": 8} == {k: top["fixes"][0][k] for k in ("flag", "value")}


def test_an_idle_server_is_not_called_saturated_from_lifetime_averages(pages_server, capsys):
    # queue time is 80% of TTFT since the server started, but nothing runs or waits now
    page = vllm_page(kv=0.1, waiting=0, preempt=0, hits=80000).replace("vllm:num_requests_running{" + L[1:] + " 48.0",
                                                                       "vllm:num_requests_running" + L + " 0")
    s = Server({"/metrics": [page]})
    try:
        code, out, _ = diagnose(["--metrics", s.url("/v1")], capsys)
    finally:
        s.close()
    assert code == 0 and out["findings"] == []


def test_shared_capacity_fixes_are_printed_once(server, capsys):
    _, out, _ = diagnose(["--metrics", server.url("/vllm")], capsys)
    seen = [json.dumps(f, sort_keys=True) for finding in out["findings"] for f in finding["fixes"]]
    assert len(seen) == len(set(seen)) and len(out["findings"]) >= 2


def test_a_server_that_dies_mid_watch_keeps_what_was_seen(capsys):
    s = Server({"/metrics": [vllm_page(kv=0.97, waiting=12)]})
    url = s.url("/metrics")
    import threading
    threading.Timer(0.5, s.close).start()
    code, data, err = diagnose(["--metrics", url, "--watch", "3", "--interval", "0.2"], capsys)
    classes = [f["class"] for f in data["findings"]]
    assert code == 1 and "server_stopped" in classes and "kv_pressure" in classes, (classes, err)
