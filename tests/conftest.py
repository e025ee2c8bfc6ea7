"""Shared fixtures: a real llama-server (built once, cached) serving a tiny random-weight llama model.

    def test_something(llama_server):
        server = llama_server(ctx_size=1024, parallel=2)    # started, /health is 200
        requests to server.url + "/v1/completions" ...      # stopped after the test

Fixtures
- `llama_server_binary` (session): Path of the cached llama-server; built on first use (about 7-12 minutes on
  2 cores) under ${OOMGUARD_CACHE:-~/.cache/oomguard}/llama-server/<version>/. If it cannot be built the
  tests that need it FAIL with the reason (they are not skipped: CI has the compiler and builds it).
- `tiny_gguf` (session): Path of the tiny model (2 layers, hidden 64, 32,000-token llama SPM vocabulary,
  n_ctx_train 4096). It practically never emits EOS, so completions run to max_tokens.
- `llama_server` (function) / `llama_server_module` (module): factories
  `start(ctx_size=2048, parallel=1, extra_args=(), threads=2, startup_timeout=60, alias="tiny-llama", **kwargs)
  -> LlamaServer`
  with `.url`, `.port`, `.process`, `.log_path`, `.stop()`, `.kill()`; every server started is stopped at the
  end of the fixture's scope. The server's log is in the test's tmp dir (`server.log_path`).

Every test that uses one of these fixtures gets the `engine` marker: `pytest -m "not engine"` leaves them out.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

TINY_MODEL_NAME = "tiny-llama"  # the id /v1/models reports for the tiny model (llama-server -a)
ENGINE_FIXTURES = {"llama_server_binary", "tiny_gguf", "llama_server", "llama_server_module"}


def pytest_configure(config):
    # no test asks the Hugging Face hub or reads a user's hub cache; tests/test_hub.py points at a local stand-in
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["OOMGUARD_HUB_CACHE"] = tempfile.mkdtemp(prefix="oomguard-hub-")
    config.addinivalue_line(
        "markers", "engine: runs a real llama-server (built from source on first use, then cached)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    from testsupport.llamacpp.build import BuildError, ensure_llama_server

    try:
        return ensure_llama_server()
    except BuildError as exc:
        pytest.fail(f"llama-server is needed by this test and could not be built: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_gguf(llama_server_binary, tmp_path_factory) -> Path:
    from testsupport.llamacpp.build import vocab_path
    from testsupport.llamacpp.tinymodel import ensure_tiny_gguf

    return ensure_tiny_gguf(vocab_path(), tmp_path_factory.mktemp("tiny-model"))


def _factory(binary: Path, model: Path, log_dir: Path, servers: list):
    from testsupport.llamacpp.server import LlamaServer, LlamaServerError

    def start(ctx_size: int = 2048, parallel: int = 1, extra_args=(), threads: int | None = 2, **kwargs):
        kwargs.setdefault("alias", TINY_MODEL_NAME)
        server = LlamaServer(binary, model, ctx_size=ctx_size, parallel=parallel, extra_args=extra_args,
                             threads=threads, log_path=log_dir / f"llama-server-{len(servers)}.log", **kwargs)
        servers.append(server)
        try:
            return server.start()
        except LlamaServerError as exc:
            pytest.fail(str(exc), pytrace=False)

    return start


@pytest.fixture
def llama_server(llama_server_binary, tiny_gguf, tmp_path):
    servers: list = []
    yield _factory(llama_server_binary, tiny_gguf, tmp_path, servers)
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def llama_server_module(llama_server_binary, tiny_gguf, tmp_path_factory):
    servers: list = []
    yield _factory(llama_server_binary, tiny_gguf, tmp_path_factory.mktemp("llama-server"), servers)
    for server in servers:
        server.stop()


# ---------------------------------------------------------------- oomguard simulate (no build needed)
def _sim_factory(log_dir: Path, sims: list):
    from oomguard.simulate.process import SimulatorError, SimulatorProcess

    def start(model: str = "sim-model", **kwargs):
        kwargs.setdefault("log_path", log_dir / f"simulate-{len(sims)}.log")
        sim = SimulatorProcess(model, **kwargs)
        sims.append(sim)
        try:
            return sim.start()
        except SimulatorError as exc:
            pytest.fail(str(exc), pytrace=False)

    return start


@pytest.fixture
def vllm_simulator(tmp_path):
    """Factory: `vllm_simulator(num_gpu_blocks=1000, max_model_len=4096, speed=100, vllm_version=None,
    max_num_seqs=None, max_num_batched_tokens=None, block_size=16, crash_on_kv_exhaustion=False, gpu=None,
    extra_args=())` -> a started `oomguard simulate` child process (`.url`, `.output()`, `.stop()`, `.kill()`,
    `.wait()`, `.process`)."""
    sims: list = []
    yield _sim_factory(tmp_path, sims)
    for sim in sims:
        sim.stop()


@pytest.fixture(scope="module")
def vllm_simulator_module(tmp_path_factory):
    sims: list = []
    yield _sim_factory(tmp_path_factory.mktemp("simulate"), sims)
    for sim in sims:
        sim.stop()


# ---- llama.cpp fit tools (tests/test_llamacpp_fit.py) ----------------------------------------------------

@pytest.fixture(scope="session")
def llama_fit_tools() -> dict:
    """{"llama-fit-params": Path, "ggml-rpc-server": Path, "llama-quantize": Path}, built with llama-server's
    cache (one extra build the first time on a cache made before these tools were added)."""
    from testsupport.llamacpp.build import BuildError, ensure_fit_tools

    try:
        return ensure_fit_tools()
    except BuildError as exc:
        pytest.fail(f"the llama.cpp fit tools are needed by this test and could not be built: {exc}", pytrace=False)


SMALL_GGUF_CONFIG = dict(n_layer=12, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_ctx_train=8192)


@pytest.fixture(scope="session")
def small_gguf(llama_fit_tools, tmp_path_factory) -> Path:
    """A small real F16 llama GGUF (12 layers, hidden 256, FFN 768, 4 heads / 2 KV heads, 32,000-token vocab,
    random weights, about 51 MB) with row lengths that every K-quant accepts."""
    from testsupport.llamacpp.build import vocab_path
    from testsupport.llamacpp.tinymodel import TinyConfig, ensure_tiny_gguf

    return ensure_tiny_gguf(vocab_path(), tmp_path_factory.mktemp("small-model"), TinyConfig(**SMALL_GGUF_CONFIG))
