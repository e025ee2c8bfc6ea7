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


def test_capacity_search_finds_the_kv_limit_the_planner_predicts(vllm_simulator, tmp_path):
    """No --num-gpu-blocks: the simulator's KV cache is what the planner predicts for Llama-3.1-8B on an L4 at
    --gpu-memory-utilization 0.8 (about 540 blocks), and the search must land within one step of what fits."""
    from oomguard.plan.api import predict

    model, flags = "meta-llama/Llama-3.1-8B-Instruct", {"max_model_len": 2048, "gpu_memory_utilization": 0.8}
    planned = predict(model, "l4", flags=flags)
    assert planned.starts and 200 < planned.num_gpu_blocks < 2000, planned.num_gpu_blocks
    sim = vllm_simulator(model, num_gpu_blocks=None, max_model_len=2048, gpu="l4", speed=20,
                         extra_args=["--gpu-memory-utilization", "0.8"])
    output_tokens = 100
    rc, rep = _run(tmp_path, sim.url, "--find-capacity", "--concurrency", "4:32", "--duration", "2s",
                   "--prompt-tokens", "620", "--output-tokens", str(output_tokens), "--kv-limit", "1.0")
    first = rep["stages"][0]
    assert rep["engine"] == "vllm" and first["requests"]["ok"] > 0
    prompt = round(first["tokens"]["mean_prompt"])  # the server's own count (the simulator has /tokenize)
    assert abs(prompt - 620) <= 2
    per_request = cdiv(prompt + output_tokens, planned.block_size)  # blocks one request holds at its end
    known = (planned.num_gpu_blocks - 1) // per_request  # block 0 is vLLM's null block
    cap = rep["capacity"]["capacity"]
    assert cap is not None and abs(cap - known) <= 1, (cap, known, rep["verdict"])
    best = next(s for s in rep["stages"] if s["index"] == rep["capacity"]["capacity_stage"])
    broke = next(s for s in rep["stages"] if s["index"] == rep["capacity"]["broke_stage"])
    assert best["held"] and best["server"]["preemptions"] == 0 and best["server"]["peak_kv_usage"] > 0.8
    assert broke["server"]["preemptions"] > 0 and broke["stopped_by"][0]["metric"] == "preemptions"
    assert rep["verdict"].startswith(f"capacity {cap} concurrent") and rc == 0


def test_api_key_comes_from_the_environment(vllm_simulator, tmp_path, monkeypatch, capsys):
    sim = vllm_simulator(num_gpu_blocks=400, max_model_len=1024, speed=50, extra_args=["--api-key", "s3cret"])
    monkeypatch.delenv("SIM_KEY", raising=False)
    assert main(["loadtest", sim.url, "--api-key-env", "SIM_KEY", "--progress", "off"]) == 2
    assert "set the API key" in capsys.readouterr().err
    monkeypatch.setenv("SIM_KEY", "s3cret")
    rc, rep = _run(tmp_path, sim.url, "--api-key-env", "SIM_KEY", "--concurrency", "2", "--duration", "1s",
                   "--output-tokens", "8", "--endpoint", "chat")
    assert rc == 0 and rep["stages"][0]["requests"]["ok"] > 0 and rep["stages"][0]["requests"]["errors"] == 0


def test_simulator_that_dies_of_kv_exhaustion_mid_run(vllm_simulator, tmp_path, capsys):
    sim = vllm_simulator(num_gpu_blocks=65, max_model_len=512, speed=20, crash_on_kv_exhaustion=True)
    rc, rep = _run(tmp_path, sim.url, "--concurrency", "8", "--duration", "30s", "--prompt-tokens", "100",
                   "--output-tokens", "300")
    s = rep["stages"][0]
    assert sim.wait(timeout=30) == 1  # it died like a CUDA OOM ...
    assert rc == 1 and s["ended_because"] == "server_down" and s["held_s"] < 25  # ... and the tester said so
    assert s["requests"]["errors"] > 0 and "stopped answering" in rep["verdict"]
    assert "Traceback" not in capsys.readouterr().err


def test_capacity_of_a_llama_server_is_its_slots(llama_server, tmp_path):
    """llama-server has no KV gauge: its capacity shows in its busy slots and deferred requests. With 3 slots the
    search must land on 3 concurrent (the waiting queue it keeps above that is not "held")."""
    server = llama_server(ctx_size=3 * 512, parallel=3)
    rc, rep = _run(tmp_path, server.url, "--find-capacity", "--concurrency", "1:8", "--duration", "3s",
                   "--prompt-tokens", "32", "--output-tokens", "48", "--stop-when", "errors>0")
    cap = rep["capacity"]["capacity"]
    assert rep["engine"] == "llamacpp" and cap is not None and abs(cap - 3) <= 1, rep["verdict"]
    broke = next(s for s in rep["stages"] if s["index"] == rep["capacity"]["broke_stage"])
    assert not broke["held"] and any("waiting" in why or "ran at most" in why for why in broke["not_held_because"])
