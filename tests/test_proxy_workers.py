"""`oomguard proxy --workers N`: caps split exactly, views merged, and the watermark rule held by every worker
(a real multi-process proxy on 127.0.0.1 in front of a fake engine)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from oomguard.proxy.admission import Limits
from oomguard.proxy.workers import merge_metrics, merge_status, share, worker_limits
from testsupport import free_port, wait_until
from testsupport.upstream import FakeUpstream

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("total,count", [(256, 2), (7, 2), (1024, 3), (5, 5), (0, 4)])
def test_shares_add_up_to_the_cap(total, count) -> None:
    shares = [share(total, i, count) for i in range(count)]
    assert sum(shares) == total and max(shares) - min(shares) <= 1
    assert share(None, 0, count) is None


def test_worker_limits_split_caps_and_keep_the_rule() -> None:
    limits = Limits(max_in_flight=9, max_prompt_tokens_in_flight=1000, max_queue=10)
    parts = [worker_limits(limits, i, 2) for i in range(2)]
    assert [p.max_in_flight for p in parts] == [5, 4]
    assert [p.max_prompt_tokens_in_flight for p in parts] == [500, 500]
    assert [p.max_queue for p in parts] == [5, 5]
    assert all(p.high_watermark == 0.90 and p.low_watermark == 0.80 for p in parts)
    assert all(p.queue_timeout == limits.queue_timeout for p in parts)


def test_merge_status_sums_counts_and_shows_the_worst_state() -> None:
    def snap(queue, in_flight, state, admitted, rejected):
        return {"queue": {"high": 0, "normal": queue, "low": 0}, "drain_rate_per_s": 1.5, "admitted": admitted,
                "rejected": rejected, "limits": {"max_in_flight": 4, "max_queue": 8,
                                                  "max_prompt_tokens_in_flight": None},
                "upstreams": {"u": {"state": state, "reason": "", "in_flight": in_flight,
                                    "prompt_tokens_in_flight": 0, "admitted_total": admitted}}}

    merged = merge_status({0: snap(2, 3, "open", 10, {"queue_full": 1.0}),
                           1: snap(1, 4, "paused", 5, {"queue_full": 2.0, "queue_timeout": 1.0})})
    assert merged["workers"] == 2 and merged["queue"]["normal"] == 3 and merged["admitted"] == 15
    assert merged["rejected"] == {"queue_full": 3.0, "queue_timeout": 1.0}
    assert merged["limits"]["max_in_flight"] == 8 and merged["limits"]["max_queue"] == 16
    up = merged["upstreams"]["u"]
    assert up["in_flight"] == 7 and up["admitted_total"] == 15 and up["state"] == "paused"
    assert "open" in up["reason"] and "paused" in up["reason"]


def test_merge_metrics_labels_each_worker() -> None:
    text = (b"# HELP x_total things\n# TYPE x_total counter\nx_total{reason=\"a\"} 2.0\n"
            b"# HELP q queue\n# TYPE q gauge\nq 1.0\n")
    out = merge_metrics({0: text, 1: text.replace(b"2.0", b"5.0")}).decode()
    assert 'x_total{reason="a",worker="0"} 2.0' in out and 'x_total{reason="a",worker="1"} 5.0' in out
    assert 'q{worker="1"} 1.0' in out and out.count("# TYPE q gauge") == 1


def test_two_workers_share_the_port_split_caps_and_all_pause_at_the_watermark() -> None:
    async def scenario():
        engine = FakeUpstream()
        port = free_port()
        async with engine:
            proc = subprocess.Popen(
                [sys.executable, "-m", "oomguard", "proxy", "--upstream", engine.url, "--listen",
                 f"127.0.0.1:{port}", "--workers", "2", "--poll-interval", "0.1", "--max-in-flight", "9",
                 "--max-queue", "20", "--log-level", "warning"],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            url = f"http://127.0.0.1:{port}"
            try:
                # a new connection per request, so the kernel spreads them over both workers
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                    async def up() -> bool:
                        try:
                            async with s.get(url + "/health") as r:
                                return r.status == 200
                        except aiohttp.ClientError:
                            return False

                    for _ in range(200):
                        if await up():
                            break
                        await asyncio.sleep(0.05)
                    else:
                        raise AssertionError(proc.stderr.read().decode() if proc.poll() is not None else "no /health")
                    await asyncio.sleep(0.3)  # the sibling is up too (its private port written)
                    body = {"model": "fake-model", "prompt": "Hello", "max_tokens": 4}
                    for _ in range(20):
                        async with s.post(url + "/v1/completions", json=body) as r:
                            assert r.status == 200
                    async with s.get(url + "/oomguard/status") as r:
                        status = await r.json()
                    assert status["workers"] == 2 and status["admitted"] == 20
                    assert status["limits"]["max_in_flight"] == 9 and status["limits"]["max_queue"] == 20
                    async with s.get(url + "/metrics") as r:
                        metrics = await r.text()
                    per_worker = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                                  if line.startswith("oomguard_proxy_admitted_total{")]
                    assert len(per_worker) == 2 and sum(per_worker) == 20 and min(per_worker) > 0

                    # the watermark holds in every worker: nothing reaches the engine while it is over 0.90
                    engine.kv_usage = 0.95
                    await asyncio.sleep(0.5)
                    seen = len(engine.seen)
                    tasks = [asyncio.create_task(s.post(url + "/v1/completions", json=body)) for _ in range(8)]
                    await asyncio.sleep(0.6)
                    assert not any(t.done() for t in tasks) and len(engine.seen) == seen
                    async with s.get(url + "/oomguard/status") as r:
                        status = await r.json()
                    assert status["queue"]["normal"] == 8
                    assert all(u["state"] == "paused" for u in status["upstreams"].values())
                    engine.kv_usage = 0.5
                    results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
                    assert [r.status for r in results] == [200] * 8
                    for r in results:
                        r.release()
                    await wait_until(lambda: len(engine.seen) == seen + 8)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    raise
            assert code == 0

    asyncio.run(asyncio.wait_for(scenario(), 90))


def test_workers_need_a_fixed_port_and_enough_in_flight() -> None:
    from oomguard.cli import main

    assert main(["proxy", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--workers", "2"]) == 2
    assert main(["proxy", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:8999", "--workers", "4",
                 "--max-in-flight", "3"]) == 2
    assert main(["proxy", "--upstream", "http://127.0.0.1:9", "--workers", "0"]) == 2
