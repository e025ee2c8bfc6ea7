"""oomguard loadtest against the real test engines: the vLLM simulator and a real llama-server."""

from __future__ import annotations

import json

from oomguard.cli import main
from oomguard.units import cdiv


def _run(tmp_path, *argv: str) -> tuple[int, dict]:
    out = tmp_path / "r.json"
    rc = main(["loadtest", *argv, "--json", str(out), "--progress", "off"])
    return rc, json.loads(out.read_text())


def test_capacity_search_finds_the_simulators_kv_limit(vllm_simulator, tmp_path):
    sim = vllm_simulator(num_gpu_blocks=65, max_model_len=1024, speed=1)
    rc, rep = _run(tmp_path, sim.url, "--find-capacity", "--concurrency", "1:32", "--duration", "1.5s",
                   "--prompt-tokens", "100", "--output-tokens", "60", "--kv-limit", "1.0")
    assert rep["engine"] == "vllm"
    prompt = round(max(s["tokens"]["mean_prompt"] for s in rep["stages"] if s["tokens"]["mean_prompt"]))
    known = 64 // cdiv(prompt + 60, 16)  # 64 usable blocks; each request holds cdiv(P + M, 16) at its end
    cap = rep["capacity"]["capacity"]
    assert cap is not None and abs(cap - known) <= 1, (cap, known, rep["verdict"])
    broke = next(s for s in rep["stages"] if s["index"] == rep["capacity"]["broke_stage"])
    assert broke["server"]["preemptions"] > 0 or broke["server"]["peak_kv_usage"] >= 0.95
    assert rc == 0


def test_loadtest_real_llama_server(llama_server, tmp_path):
    server = llama_server(ctx_size=2048, parallel=2)
    rc, rep = _run(tmp_path, server.url, "--concurrency", "2", "--duration", "2s", "--prompt-tokens", "64",
                   "--output-tokens", "16", "--stop-when", "errors>0")
    s = rep["stages"][0]
    assert rc == 0 and s["held"] and s["requests"]["ok"] > 0
    assert rep["engine"] == "llamacpp" and s["server"]["max_running"] >= 1
    assert s["tokens"]["mean_output"] == 16 and s["latency"]["ttft_s"]["p50"] > 0
    assert any("does not report KV-cache usage" in n for n in rep["notes"])


def test_llama_server_dies_mid_run(llama_server, tmp_path):
    import threading

    server = llama_server(ctx_size=2048, parallel=2)
    threading.Timer(1.5, server.kill).start()
    rc, rep = _run(tmp_path, server.url, "--concurrency", "2", "--duration", "20s", "--output-tokens", "64")
    s = rep["stages"][0]
    assert rc == 1 and s["ended_because"] == "server_down" and s["held_s"] < 15
