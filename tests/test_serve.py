"""oomguard serve: the pure core (engine command, policy, alerts, state directory) and the supervisor with real
processes over loopback (`oomguard simulate --crash-on-kv-exhaustion` as the engine, `oomguard proxy` in front)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from oomguard.errors import UsageError
from oomguard.proxy import metric_names
from oomguard.serve.engine import parse_engine_command
from oomguard.serve.policy import Outcome, next_configuration
from oomguard.serve.state import Restart, StateDir
from oomguard.serve.supervisor import gpu_alerts

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the engine command
def test_vllm_serve_command_is_read_and_rewritten_to_a_loopback_port():
    cmd = parse_engine_command(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64",
                                "--port", "8000", "--host=0.0.0.0", "--trust-remote-code"])
    assert cmd.kind == "vllm" and cmd.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert cmd.flags["max_num_seqs"] == 64
    argv = cmd.with_flags({"max_num_seqs": 32}).argv("127.0.0.1", 41000)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert "--trust-remote-code" in argv and "0.0.0.0" not in argv and "8000" not in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "32" and argv[-4:] == ["--host", "127.0.0.1", "--port", "41000"]


def test_api_server_module_keeps_model_as_a_flag():
    cmd = parse_engine_command(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m/x",
                                "--max-model-len", "4096"])
    argv = cmd.argv("127.0.0.1", 1)
    assert argv[:5] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m/x"]
    assert cmd.flags["max_model_len"] == 4096


def test_llama_server_memory_flags_are_read_in_any_spelling():
    cmd = parse_engine_command(["llama-server", "-m", "x.gguf", "--ctx-size=8192", "-ngl", "99", "--port", "9"])
    assert cmd.kind == "llamacpp" and cmd.model == "x.gguf"
    assert cmd.flags == {"ctx_size": 8192, "n_gpu_layers": 99}
    argv = cmd.with_flags({"ctx_size": 4096}).argv("127.0.0.1", 5)
    assert argv[argv.index("-c") + 1] == "4096" and "--ctx-size=8192" not in argv and argv[-1] == "5"


@pytest.mark.parametrize("words, says", [
    ([], "engine command"), (["bash", "-c", "x"], "not an engine command"), (["vllm", "serve"], "no model"),
    (["vllm", "run", "m"], "vllm serve MODEL"), (["oomguard", "plan", "m"], "only oomguard command"),
    (["llama-server", "-c", "1024"], "no model"), (["llama-server", "-m", "x", "-c", "big"], "whole number"),
    (["python", "-m", "http.server"], "must run"),
])
def test_bad_engine_commands_are_one_line(words, says):
    with pytest.raises(UsageError, match=says):
        parse_engine_command(words)


# ---------------------------------------------------------------- the policy
def _vllm(**flags):
    return parse_engine_command(["vllm", "serve", "m/x"]).with_flags(flags)


def test_runtime_oom_takes_the_diagnosis_fixes_and_halves_the_batch():
    out = Outcome(cause="exit", ready=True, exit_code=1, finding_class="oom_runtime",
                  fixes=(("--gpu-memory-utilization", 0.88), ("--max-num-seqs", 32), ("--max-num-batched-tokens", 4096)),
                  facts={"max_num_seqs": 64})
    adj = next_configuration(_vllm(max_num_seqs=64), out)
    assert adj.changes == {"gpu_memory_utilization": 0.88, "max_num_seqs": 32, "max_num_batched_tokens": 4096}


def test_kv_exhaustion_caps_sequences_at_what_the_kv_cache_holds():
    out = Outcome(cause="exit", ready=True, exit_code=1, finding_class="oom_runtime", kv_exhausted=True,
                  facts={"max_num_seqs": 64, "max_concurrency": 1.88})
    assert next_configuration(_vllm(max_num_seqs=64), out).changes["max_num_seqs"] == 1


def test_kv_too_small_lowers_max_model_len_to_the_estimate():
    out = Outcome(cause="exit", ready=False, exit_code=1, finding_class="kv_cache_too_small",
                  facts={"estimated_max_model_len": 20000, "max_model_len": 32768})
    # the model's default context: cut to what vLLM estimates the KV cache holds
    assert next_configuration(_vllm(), out).changes == {"max_model_len": 20000}
    # already FP8, or more than half the asked-for context missing: cut as well
    assert next_configuration(_vllm(max_model_len=32768, kv_cache_dtype="fp8"), out).changes == {"max_model_len": 20000}
    short = Outcome(cause="exit", ready=False, exit_code=1, finding_class="kv_cache_too_small",
                    facts={"estimated_max_model_len": 12000, "max_model_len": 32768})
    assert next_configuration(_vllm(max_model_len=32768), short).changes == {"max_model_len": 12000}


def test_kv_too_small_keeps_an_asked_for_context_that_an_fp8_kv_cache_holds():
    out = Outcome(cause="exit", ready=False, exit_code=1, finding_class="kv_cache_too_small",
                  facts={"estimated_max_model_len": 20000, "max_model_len": 32768})
    adjusted = next_configuration(_vllm(max_model_len=32768), out)
    assert adjusted.changes == {"kv_cache_dtype": "fp8"}
    assert "--kv-cache-dtype" in _vllm(max_model_len=32768).with_flags(adjusted.changes).argv()


def test_graph_oom_turns_graphs_off_then_halves_the_batch():
    out = Outcome(cause="exit", ready=False, exit_code=1, finding_class="oom_profiling_or_graph")
    assert next_configuration(_vllm(), out).changes == {"enforce_eager": True}
    assert next_configuration(_vllm(enforce_eager=True, max_num_batched_tokens=8192), out).changes == \
        {"max_num_batched_tokens": 4096}


def test_nothing_left_to_lower_gives_none_and_other_failures_restart_the_same():
    out = Outcome(cause="exit", ready=True, exit_code=1, finding_class="oom_runtime", facts={"max_num_seqs": 1})
    assert next_configuration(_vllm(max_num_seqs=1), out) is None
    killed = next_configuration(_vllm(), Outcome(cause="signal", ready=True, exit_code=-9))
    assert killed.same and "killed" in killed.reason


def test_llama_cpp_lowers_the_context_then_layers_then_quantizes_kv():
    oom = Outcome(cause="exit", ready=False, exit_code=1, finding_class="kv_cache_too_small")
    cmd = parse_engine_command(["llama-server", "-m", "x.gguf", "-c", "8192", "-ngl", "99"])
    assert next_configuration(cmd, oom).changes == {"ctx_size": 4096}
    small = cmd.with_flags({"ctx_size": 256})
    assert next_configuration(small, oom).changes == {"n_gpu_layers": 49}
    cpu = cmd.with_flags({"ctx_size": 256, "n_gpu_layers": 0})
    assert next_configuration(cpu, oom).changes == {"cache_type_k": "q8_0"}


def test_gpu_alert_fires_once_per_crossing():
    high = [{"index": 0, "name": "g", "used_bytes": 90, "total_bytes": 100}]
    low = [{"index": 0, "name": "g", "used_bytes": 10, "total_bytes": 100}]
    alerting, fired = gpu_alerts(high, 0.85, set())
    assert alerting == {0} and len(fired) == 1
    assert gpu_alerts(high, 0.85, alerting)[1] == []
    alerting, fired = gpu_alerts(low, 0.85, alerting)
    assert alerting == set() and fired == []


def test_state_dir_remembers_the_last_configuration_that_started(tmp_path):
    store = StateDir(tmp_path / "s")
    r = Restart(cause="exit", finding_class="oom_runtime", summary="", exit_code=1, flags_before={"a": 1},
                flags_after={"a": 2}, reason="x")
    store.save("k", {"max_num_seqs": 8}, [r])
    assert store.last_good("k") == {"max_num_seqs": 8} and store.last_good("other") is None
    assert store.load()["restarts"][0]["flags_after"] == {"a": 2}


# ---------------------------------------------------------------- real processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")


class Serve:
    def __init__(self, tmp_path: Path, engine: list[str], *options: str, preexec_fn=None):
        self.port = _free_port()
        self.status_port = _free_port()
        self.err = tmp_path / "serve.err"
        self.out = tmp_path / "serve.out"
        argv = [sys.executable, "-m", "oomguard", "serve", "--listen", f"127.0.0.1:{self.port}",
                "--status-listen", f"127.0.0.1:{self.status_port}", "--restart-backoff", "0.1",
                "--health-interval", "0.2", *options, "--", *engine]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=_env(), start_new_session=True,
                                         preexec_fn=preexec_fn)
        self.url = f"http://127.0.0.1:{self.port}"
        self.status_url = f"http://127.0.0.1:{self.status_port}"

    def status(self) -> dict:
        with urllib.request.urlopen(self.status_url + "/status", timeout=5) as resp:
            return json.loads(resp.read())

    def events(self) -> list[dict]:
        out = []
        for line in self.err.read_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def wait_for(self, predicate, timeout: float = 40.0, what: str = "") -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}:\n{self.err.read_text()[-3000:]}")
            try:
                last = self.status()
                if predicate(last):
                    return last
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: {last}\n{self.err.read_text()[-3000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def serve(tmp_path):
    started: list[Serve] = []

    def start(engine, *options, preexec_fn=None):
        s = Serve(tmp_path, engine, *options, preexec_fn=preexec_fn)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


SIM = ["oomguard", "simulate", "sim-model", "--num-gpu-blocks", "60", "--max-model-len", "512", "--speed", "50"]


def _complete(url: str, tokens: int = 64, timeout: float = 90) -> tuple[int, dict]:
    body = json.dumps({"model": "sim-model", "prompt": "hello " * 100, "max_tokens": tokens}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())    # a well-formed OpenAI error, or this raises


def _client_until_ok(url: str, results: list, deadline_s: float = 60) -> None:
    """A client as the proxy asks: on 429/503 wait Retry-After (capped) and try again."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            status, body = _complete(url)
        except Exception as exc:   # a client left without a well-formed answer
            results.append(("no answer", repr(exc)))
            return
        if status == 200 or time.monotonic() > end:
            results.append((status, body))
            return
        assert "error" in body, body
        time.sleep(0.3)


def _crash_load(engine_url: str, n: int = 8) -> None:
    """Requests straight to the engine, more than its KV cache holds at once: it dies like a CUDA OOM. (Through
    the proxy they would be admitted one KV-budget at a time, which is what the proxy is for.)"""
    def one():
        try:
            _complete(engine_url, tokens=200, timeout=30)
        except Exception:
            pass
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_kv_exhaustion_crash_is_restarted_with_fewer_sequences_and_every_client_answered(serve):
    s = serve([*SIM, "--max-num-seqs", "64", "--crash-on-kv-exhaustion"], "--max-restarts", "3")
    first = s.wait_for(lambda st: st["state"] == "ready", what="ready")
    results: list = []
    clients = [threading.Thread(target=_client_until_ok, args=(s.url, results)) for _ in range(6)]
    for c in clients:
        c.start()
    _crash_load(first["engine_url"])
    st = s.wait_for(lambda st: st["restarts"] and st["state"] == "ready" and
                    st["restarts"][0]["seconds_to_ready"] is not None, what="restart")
    for c in clients:
        c.join(120)
    r = st["restarts"][0]
    assert r["cause"] == "exit" and r["finding_class"] == "oom_runtime"
    assert r["flags_before"]["max_num_seqs"] == 64 and r["flags_after"]["max_num_seqs"] < 64
    assert "--max-num-seqs" in st["engine_command"]
    assert len(results) == 6 and all(status == 200 for status, _ in results), results
    # the safer configuration holds under the same load
    _crash_load(st["engine_url"])
    after: list = []
    _client_until_ok(s.url, after)
    assert after[0][0] == 200, after
    assert len(s.status()["restarts"]) == 1
    assert s.status()["requests"]["ok"] >= 7
    with urllib.request.urlopen(s.status_url + "/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert 'oomguard_serve_restarts_total{cause="exit",finding_class="oom_runtime"} 1.0' in metrics
    assert 'oomguard_serve_state{state="ready"} 1.0' in metrics
    assert s.stop() == 0
    kinds = [e["event"] for e in s.events()]
    assert kinds.index("engine_ready") < kinds.index("restart") < kinds.index("stopped")


def test_sigkilled_engine_is_restarted_and_queued_requests_are_served(serve):
    s = serve([*SIM, "--max-num-seqs", "4"])
    st = s.wait_for(lambda st: st["state"] == "ready" and st["engine_pid"], what="ready")
    results: list = []
    clients = [threading.Thread(target=_client_until_ok, args=(s.url, results)) for _ in range(4)]
    for c in clients:
        c.start()
    time.sleep(0.05)
    os.kill(st["engine_pid"], signal.SIGKILL)
    st = s.wait_for(lambda st: st["restarts"] and st["state"] == "ready", what="restart after SIGKILL")
    for c in clients:
        c.join(120)
    assert st["restarts"][0]["cause"] == "signal" and st["restarts"][0]["exit_code"] == -9
    assert st["restarts"][0]["flags_after"] == st["restarts"][0]["flags_before"]
    assert all(status == 200 for status, _ in results), results


def test_sigstopped_engine_is_detected_killed_and_restarted(serve):
    s = serve([*SIM], "--hang-timeout", "2")
    st = s.wait_for(lambda st: st["state"] == "ready" and st["engine_pid"], what="ready")
    os.kill(st["engine_pid"], signal.SIGSTOP)
    st = s.wait_for(lambda st: st["restarts"] and st["state"] == "ready", what="restart after SIGSTOP")
    assert st["restarts"][0]["cause"] == "hang"
    results: list = []
    _client_until_ok(s.url, results)   # the proxy sees the relaunched engine at its next poll: 503 until then
    assert results[0][0] == 200, results
    assert s.stop() == 0


def test_a_start_is_learnt_and_the_next_plan_and_serve_of_the_setup_use_its_figures(serve, tmp_path):
    state = tmp_path / "state"
    engine = ["oomguard", "simulate", "Qwen/Qwen2.5-0.5B-Instruct", "--gpu", "l4", "--max-model-len", "4096",
              "--gpu-memory-utilization", "0.8", "--speed", "50"]
    s = serve(engine, "--state-dir", str(state))
    s.wait_for(lambda st: st["state"] == "ready", what="ready")
    deadline = time.monotonic() + 20
    while not any(e["event"] == "figures_kept" for e in s.events()) and time.monotonic() < deadline:
        time.sleep(0.2)
    kept = next(e for e in s.events() if e["event"] == "figures_kept")
    assert kept["model"] == "Qwen/Qwen2.5-0.5B-Instruct" and kept["gpu"] == "NVIDIA L4"
    assert kept["figures"]["weights_bytes"] > 0 and kept["figures"]["kv_cache_bytes"] > 0
    assert s.stop() == 0
    # the next plan of the setup, at another utilization and context, from the measured figures
    out = subprocess.run([sys.executable, "-m", "oomguard", "plan", "Qwen/Qwen2.5-0.5B-Instruct", "--gpu", "l4",
                          "--max-model-len", "8192", "--gpu-memory-utilization", "0.9", "--json", "--state-dir",
                          str(state)], capture_output=True, text=True, timeout=120, env=_env())
    plan = json.loads(out.stdout)
    assert plan["provenance"]["weights_gib"].startswith("measured"), plan["provenance"]
    # and the next serve's own plan
    again = serve(engine, "--state-dir", str(state))
    again.wait_for(lambda st: st["state"] == "ready", what="ready again")
    (planned,) = [e for e in again.events() if e["event"] == "plan"]
    assert "measured" in planned["note"]


def _address_space_limit(limit_bytes: int):
    """A memory limit for serve and its children (inherited), as a container's would be: llama-server's CPU
    buffers fail to allocate past it as a GPU's would past its memory."""
    def apply():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


@pytest.mark.engine
def test_llama_server_context_that_cannot_be_allocated_is_relaunched_with_one_that_fits(serve, llama_server_binary,
                                                                                         tiny_gguf):
    # 2M tokens of context: its KV cache and compute buffers need about 5 GiB, more than the 1.5 GiB limit;
    # halving -c reaches a context that fits (the tiny model's KV cache is 256 bytes a token)
    engine = [str(llama_server_binary), "-m", str(tiny_gguf), "-c", "2000000", "-t", "2", "-a", "tiny-llama"]
    s = serve(engine, "--max-restarts", "5", preexec_fn=_address_space_limit(1536 << 20))
    st = s.wait_for(lambda st: st["state"] == "ready", timeout=120, what="ready with a smaller context")
    assert st["restarts"], "the first context should not have fit"
    for r in st["restarts"]:
        assert r["cause"] == "exit" and r["finding_class"] in ("oom_profiling_or_graph", "oom_weights_load",
                                                               "kv_cache_too_small"), r
        assert r["flags_after"]["ctx_size"] < r["flags_before"]["ctx_size"]
    assert st["restarts"][0]["flags_before"]["ctx_size"] == 2_000_000
    assert st["engine_flags"]["ctx_size"] == st["restarts"][-1]["flags_after"]["ctx_size"] < 2_000_000
    body = json.dumps({"model": "tiny-llama", "prompt": "hello", "max_tokens": 8}).encode()
    req = urllib.request.Request(s.url + "/v1/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200 and json.loads(resp.read())["choices"]
    assert s.stop() == 0


def _gauges(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name in metric_names.ENGINE_GAUGES}


def test_status_metrics_export_the_proxys_admission_gauges_for_an_endpoint_picker(serve):
    s = serve([*SIM, "--max-num-seqs", "4"])
    st = s.wait_for(lambda st: st["state"] == "ready", what="ready")
    engine = st["engine_url"].removeprefix("http://")
    deadline = time.monotonic() + 20
    while (got := _gauges(s.status_url)).get((metric_names.ADMIT, (("engine", engine), ("model_name", "sim-model")))) \
            != 1.0 and time.monotonic() < deadline:
        time.sleep(0.2)
    labels = (("engine", engine), ("model_name", "sim-model"))
    assert got[(metric_names.ADMIT, labels)] == 1.0
    capacity = (60 - 1) * 16    # --num-gpu-blocks 60 of 16 tokens, less V1's null block
    assert got[(metric_names.KV_CAPACITY_TOKENS, labels)] == capacity
    assert 0 < got[(metric_names.KV_HEADROOM_TOKENS, labels)] <= 0.90 * capacity
    # the same names, labels and values as the proxy's own /metrics (idle: nothing moves between the reads)
    assert _gauges(s.url) == _gauges(s.status_url)
    assert s.status()["engine_admission"] == {"admit": 1.0, "kv_capacity_tokens": capacity,
                                              "kv_headroom_tokens": got[(metric_names.KV_HEADROOM_TOKENS, labels)]}


def test_gives_up_after_max_restarts_with_the_story(serve):
    s = serve([*SIM, "--max-num-seqs", "64", "--crash-on-kv-exhaustion"], "--max-restarts", "0")
    st = s.wait_for(lambda st: st["state"] == "ready", what="ready")
    _crash_load(st["engine_url"])
    assert s.proc.wait(30) == 1
    err = s.err.read_text()
    assert "gave up" in err and "oom_runtime" in err and "Traceback" not in err.split("gave up")[1]


def test_remembered_configuration_is_used_first(serve, tmp_path):
    state = tmp_path / "state"
    s = serve([*SIM, "--max-num-seqs", "64", "--crash-on-kv-exhaustion"], "--state-dir", str(state))
    st = s.wait_for(lambda st: st["state"] == "ready", what="ready")
    _crash_load(st["engine_url"])
    st = s.wait_for(lambda st: st["restarts"] and st["state"] == "ready", what="restart")
    safer = st["engine_flags"]["max_num_seqs"]
    assert s.stop() == 0
    again = serve([*SIM, "--max-num-seqs", "64", "--crash-on-kv-exhaustion"], "--state-dir", str(state))
    st = again.wait_for(lambda st: st["state"] == "ready", what="ready again")
    assert st["engine_flags"]["max_num_seqs"] == safer
    assert any(e["event"] == "remembered_configuration" for e in again.events())


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oomguard", *args], capture_output=True, text=True, env=_env(),
                          timeout=timeout)


@pytest.mark.parametrize("args, says", [
    (["serve"], "after `--`"),
    (["serve", "--", "bash", "-c", "true"], "not an engine command"),
    (["serve", "--listen", "127.0.0.1:0", "--", *SIM], "fixed port"),
    (["serve", "--alert-at", "2", "--", *SIM], "--alert-at"),
    (["serve", "--", "llama-server-missing-binary", "-m", "x.gguf"], "cannot run the engine"),
    (["serve", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "10000000",
      "--gpu-memory-utilization", "0.1"], "would not start"),
    (["serve", "--status", "http://127.0.0.1:9"], "cannot read serve's status"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    if args[0] == "serve" and "--listen" not in args and "--status" not in args:
        args = [args[0], "--listen", f"127.0.0.1:{_free_port()}", *args[1:]]
    if "vllm" in args:
        args = [args[0], "--gpu", "h100", *args[1:]]
    done = _cli(*args)
    assert done.returncode == 2, done.stderr
    lines = [l for l in done.stderr.splitlines() if not l.startswith("{")]
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_an_engine_that_refuses_its_command_line_is_exit_2(tmp_path):
    # both ports free (the status port's default, --listen's + 1, may be another test's)
    done = _cli("serve", "--listen", f"127.0.0.1:{_free_port()}", "--status-listen", f"127.0.0.1:{_free_port()}",
                "--", *SIM, "--speed", "-1")
    assert done.returncode == 2, done.stderr
    assert "the engine refused its command line" in done.stderr and "--speed" in done.stderr


def test_help_lists_serve():
    assert "serve" in _cli("--help").stdout
