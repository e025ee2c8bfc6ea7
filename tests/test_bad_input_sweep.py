"""What a stranger types: every command's options with values no one should pass, paths that cannot be used, input
nested beyond reason. Each ends in one line and exit 1-3 (2 for bad input), never exit 70 or a traceback; the
servers (proxy, simulate, serve) refuse before they listen."""

from __future__ import annotations

import subprocess
import sys

import pytest

from oomguard import cli

BAD_VALUES = ("nan", "inf", "-1", "1e400", "x", "[]", "%s", "", "a" * 5000)
PLAN_OPTIONS = ("--gpu", "--gpu-memory", "--gpu-count", "--free-memory", "--vllm-version", "--model-config", "--like",
                "--max-model-len", "--gpu-memory-utilization", "--max-num-seqs", "--tensor-parallel-size",
                "--kv-cache-dtype", "--p99-tokens", "--peak-concurrency", "--prefix-sharing", "--workload", "--top",
                "--nodes", "--gpus-per-node", "--format", "--max-num-batched-tokens", "--block-size",
                "--cpu-offload-gb", "--quantization", "--limit-mm-per-prompt", "--speculative-config",
                "--max-lora-rank", "--swap-space", "--kv-cache-memory-bytes")


@pytest.fixture(autouse=True)
def _no_stdin(monkeypatch):
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))    # what diagnose reads when given no file


def _in_process(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:    # argparse's own refusal
        code = exc.code
    return code, capsys.readouterr().err


def _assert_clean(argv: list[str], code, err: str) -> None:
    assert code in (0, 1, 2, 3), (argv[:6], code, err[-300:])
    assert "internal error" not in err and "Traceback" not in err, (argv[:6], err[-300:])


@pytest.mark.parametrize("option", PLAN_OPTIONS)
def test_plan_options_with_values_no_one_should_pass(option, capsys):
    for value in BAD_VALUES:
        argv = ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", option, value]
        _assert_clean(argv, *_in_process(argv, capsys))


@pytest.fixture
def odd_files(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100_000)
    (tmp_path / "random.bin").write_bytes(bytes(range(256)) * 100)
    (tmp_path / "empty").write_text("")
    return [str(tmp_path / n) for n in ("deep.json", "random.bin", "empty")] + [str(tmp_path), "/nonexistent/x",
                                                                                 "a" * 5000]


def test_files_that_cannot_be_read_as_asked(odd_files, capsys):
    for path in odd_files:
        for argv in (["diagnose", path], ["plan", path], ["plan", "x", "--model-config", path],
                     ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--workload", path],
                     ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--state-dir", path]):
            _assert_clean(argv, *_in_process(argv, capsys))


def test_model_ids_and_commands_no_one_should_pass(capsys):
    for value in BAD_VALUES:
        for argv in (["plan", value], ["plan", "--", "vllm", "serve", value], ["diagnose", "--metrics", value],
                     ["loadtest", value]):
            _assert_clean(argv, *_in_process(argv, capsys))


@pytest.mark.parametrize("argv", [
    ["proxy", "--upstream", "[]"], ["proxy", "--upstream", "%s"], ["proxy", "--upstream", "http://h:99999"],
    ["proxy", "--upstream", "http://127.0.0.1:9", "--queue-timeout", "nan"],
    ["proxy", "--upstream", "http://127.0.0.1:9", "--listen", "x"],
    ["simulate", "sim-model", "--num-gpu-blocks", "1e400"], ["simulate", "sim-model", "--speed", "nan"],
    ["simulate", "a" * 5000], ["serve", "--", "a" * 5000], ["serve", "--listen", "x", "--", "vllm", "serve", "m"],
])
def test_servers_refuse_before_they_listen(argv):
    done = subprocess.run([sys.executable, "-m", "oomguard", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (argv[:4], done.returncode, done.stderr[-300:])
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
