"""The real llama-server fixture: build cache, tiny model, process control, and the HTTP surface tests rely on."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import urllib.error
import urllib.request

import pytest

from testsupport.llamacpp import build
from testsupport import free_port
from testsupport.llamacpp.server import LlamaServer, LlamaServerError
from oomguard.metrics import parse_metrics


def _get(url: str, timeout: float = 10):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode()


def _post(url: str, body: dict, timeout: float = 60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _sse_events(url: str, body: dict, timeout: float = 60) -> list[str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.headers.get("Content-Type", "").startswith("text/event-stream")
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:"):
                events.append(line[5:].strip())
    return events


# ------------------------------------------------------------------ no binary needed

def test_cache_layout_follows_oomguard_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("OOMGUARD_CACHE", str(tmp_path))
    assert build.install_dir("1.2.3") == tmp_path / "llama-server" / "1.2.3"
    assert build.binary_path("1.2.3").name == "llama-server"
    assert not build.cached("1.2.3")
    dest = build.install_dir("1.2.3")
    dest.mkdir(parents=True)
    (dest / build.VOCAB_NAME).write_bytes(b"x")
    binary = dest / "llama-server"
    binary.write_text("#!/bin/sh\n")
    assert not build.cached("1.2.3")  # not executable yet
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    assert build.cached("1.2.3")
    # cached: ensure_llama_server returns it without building or locking
    assert build.ensure_llama_server("1.2.3", progress=None) == binary


def test_build_without_tools_fails_with_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setenv("OOMGUARD_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(build.BuildError, match="missing cmake"):
        build.ensure_llama_server("9.9.9", progress=None)


def test_build_lock_is_exclusive(tmp_path):
    import fcntl

    lock = tmp_path / "x.lock"
    with build._locked(lock, lambda _: None):
        with open(lock) as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released


def test_server_refuses_missing_files(tmp_path):
    with pytest.raises(LlamaServerError, match="no llama-server binary"):
        LlamaServer(tmp_path / "nope", tmp_path / "model.gguf").start()


def test_server_reports_early_exit_with_its_log(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 3\n")
    fake.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    with pytest.raises(LlamaServerError, match="exited with code 3(.|\n)*failed to load model"):
        LlamaServer(fake, model, log_path=tmp_path / "log.txt", startup_timeout=10).start()


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# ------------------------------------------------------------------ real llama-server

def test_tiny_model_is_small_deterministic_and_llama(tiny_gguf, tmp_path):
    from gguf import GGUFReader

    from testsupport.llamacpp.tinymodel import write_tiny_gguf

    assert 2_000_000 < tiny_gguf.stat().st_size < 16_000_000
    again = write_tiny_gguf(tmp_path / "again.gguf", build.vocab_path())
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(tiny_gguf.read_bytes()).digest()
    reader = GGUFReader(str(tiny_gguf))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "llama"
    assert int(reader.fields["llama.context_length"].parts[-1][0]) == 4096
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 32000


def test_binary_is_cached_and_runs(llama_server_binary):
    import subprocess

    assert llama_server_binary.parent == build.install_dir()
    assert os.access(llama_server_binary, os.X_OK)
    out = subprocess.run([str(llama_server_binary), "--version"], capture_output=True, text=True, timeout=30)
    assert "version" in (out.stdout + out.stderr).lower()


def test_models_endpoint(llama_server):
    server = llama_server(ctx_size=1024, parallel=2)
    status, body = _get(server.url + "/v1/models")
    assert status == 200
    models = json.loads(body)
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny-llama"
    assert models["data"][0]["meta"]["n_ctx"] == 512  # per slot: ctx_size / parallel


def test_completion_non_streaming_runs_to_max_tokens(llama_server):
    server = llama_server(ctx_size=1024, parallel=1)
    status, body = _post(server.url + "/v1/completions",
                         {"prompt": "Hello there, how are", "max_tokens": 24, "temperature": 0})
    assert status == 200, body
    data = json.loads(body)
    assert data["object"] == "text_completion"
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 24
    assert data["usage"]["prompt_tokens"] >= 5


def test_completion_streaming_and_chat(llama_server):
    server = llama_server(ctx_size=1024, parallel=2)
    events = _sse_events(server.url + "/v1/completions",
                         {"prompt": "Once upon a time", "max_tokens": 16, "stream": True, "temperature": 0})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len([c for c in chunks if c["choices"] and c["choices"][0].get("text")]) >= 8
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    status, body = _post(server.url + "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 8


def test_prompt_longer_than_slot_context_is_a_400(llama_server):
    server = llama_server(ctx_size=256, parallel=2)  # 128 tokens per slot
    status, body = _post(server.url + "/v1/completions", {"prompt": "word " * 400, "max_tokens": 4})
    assert status == 400, body
    assert json.loads(body)["error"]["type"] == "exceed_context_size_error"


def test_metrics_parse_as_llamacpp(llama_server):
    server = llama_server(ctx_size=1024, parallel=2)
    _post(server.url + "/v1/completions", {"prompt": "abc", "max_tokens": 10, "temperature": 0})
    status, text = _get(server.url + "/metrics")
    assert status == 200
    sample = parse_metrics(text)
    assert sample.engine == "llamacpp"
    assert sample.running == 0 and sample.waiting == 0
    assert sample.generation_tokens_total >= 10
    assert sample.prompt_tokens_total >= 1
    assert sample.decode_calls_total >= 10
    assert sample.kv_usage is None  # this llama.cpp no longer exports KV usage


def test_stop_and_kill(llama_server):
    server = llama_server(ctx_size=512, parallel=1)
    url = server.url
    server.stop()
    assert not server.running
    with pytest.raises(OSError):
        _get(url + "/health", timeout=2)
    again = llama_server(ctx_size=512, parallel=1)
    again.kill()
    assert not again.running
