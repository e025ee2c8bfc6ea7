"""`oomguard plan` from the outside: exit codes, JSON contract, pasted commands, bad input."""

import json
import subprocess
import sys

import pytest

CONTRACT_KEYS = {"weights_gib", "activation_peak_gib", "non_torch_gib", "cuda_graph_gib", "kv_cache_gib",
                 "kv_cache_tokens", "num_gpu_blocks", "max_concurrency", "max_model_len", "starts",
                 "estimated_max_model_len", "error", "vllm_version", "assumptions", "provenance"}


def oomguard(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "oomguard", *args], capture_output=True, text=True, input=stdin,
                          timeout=60)


def test_quick_start_command_runs_offline():
    r = oomguard("plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090", "--max-model-len", "32768")
    assert r.returncode in (0, 1), r.stderr
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in r.stdout
    assert "Traceback" not in r.stderr


def test_json_contract_and_exit_code_follow_the_verdict():
    ok = oomguard("plan", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "h100", "--max-model-len", "8192", "--json")
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert CONTRACT_KEYS <= data.keys()
    assert data["starts"] is True and data["error"] is None
    assert set(data["provenance"]) >= {"weights_gib", "activation_peak_gib", "kv_cache_gib"}
    bad = oomguard("plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090", "--vllm-version", "0.19.0", "--json")
    assert bad.returncode == 1
    data = json.loads(bad.stdout)
    assert data["starts"] is False and data["error"] and data["estimated_max_model_len"]


def test_pasted_vllm_serve_and_api_server_commands():
    a = oomguard("plan", "--gpu", "h100", "--json", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
                 "--max-model-len", "8192", "--trust-remote-code", "--port", "8000")
    assert a.returncode == 0, a.stderr
    data = json.loads(a.stdout)
    assert data["max_model_len"] == 8192
    assert "--trust-remote-code" in data["ignored_flags"] and "--port" in data["ignored_flags"]
    b = oomguard("plan", "--gpu", "h100", "--json", "--", "python", "-m", "vllm.entrypoints.openai.api_server",
                 "--model", "meta-llama/Llama-3.1-8B-Instruct", "--max_model_len", "4096")
    assert b.returncode == 0, b.stderr
    assert json.loads(b.stdout)["max_model_len"] == 4096


def test_own_options_typed_after_a_pasted_command_are_taken_not_misread():
    # `--gpu` after the pasted line would otherwise be an abbreviation of --gpu-memory-utilization to argparse
    r = oomguard("plan", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max_model_len", "8192",
                 "--gpu", "h100", "--gpu-count=1", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert "H100" in data["gpu"] and data["max_model_len"] == 8192 and data["ignored_flags"] == []
    before = oomguard("plan", "--gpu", "l4", "--json", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
                      "--max-model-len", "4096", "--gpu", "h100")
    assert "L4" in json.loads(before.stdout)["gpu"]  # given before --, it wins


@pytest.mark.parametrize("args, needle", [
    (["plan", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-count", "x"], "whole number"),
    (["plan", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--gpu"], "needs a value"),
    (["plan", "no-such/model", "--gpu", "h100"], "--model-config"),
    (["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h900"], "unknown GPU"),
    (["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--gpu-memory-utilization", "1.5"], "(0, 1]"),
    (["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--max-model-len", "0"], "positive"),
    (["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--max-model-len", "lots"], "not a number"),
    (["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "-tp", "3", "--gpu-count", "4"], "divisible"),
    (["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "-tp", "4"], None),
    (["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "-tp", "4", "--gpu-count", "2"], "--gpu-count"),
    (["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "-q", "awq"], "awq"),
    (["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--vllm-version", "banana"], "X.Y.Z"),
    (["plan", "--model-config", "/nonexistent/config.json", "--gpu", "h100"], "no such file"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    r = oomguard(*args)
    if needle is None:  # a valid request: -tp 4 defaults --gpu-count to 4
        assert r.returncode in (0, 1), r.stderr
        return
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert needle in r.stderr


def test_malformed_config_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    r = oomguard("plan", "--model-config", str(bad), "--gpu", "h100")
    assert r.returncode == 2 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr
    bad.write_text(json.dumps({"hidden_size": 4096}))
    r = oomguard("plan", "--model-config", str(bad), "--gpu", "h100")
    assert r.returncode == 2 and "num_hidden_layers" in r.stderr


def test_model_directory_weights_from_safetensors_headers(tmp_path):
    import struct
    from oomguard.models.load import catalog_entry
    (tmp_path / "config.json").write_text(json.dumps(catalog_entry("Qwen/Qwen3-0.6B")["config"]))
    header = json.dumps({"a": {"dtype": "BF16", "shape": [1000, 1000], "data_offsets": [0, 2_000_000]},
                         "__metadata__": {"format": "pt"}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    from oomguard.models.load import from_path
    assert from_path(str(tmp_path)).checkpoint_bytes == 2_000_000


def test_cli_import_path_stays_light():
    # `oomguard --help` must stay fast: the CLI and the plan command's options import nothing heavy
    code = ("import sys, oomguard.cli, oomguard.plan.command; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'rich', 'aiohttp', 'prometheus_client', "
            "'numpy', 'pynvml', 'huggingface_hub'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
    help_text = oomguard("--help")
    assert help_text.returncode == 0 and "plan" in help_text.stdout


def test_interconnect_overrides_the_catalog(capsys):
    import json
    from oomguard.cli import main
    base = ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "-tp", "2", "--vllm-version", "0.19.0",
            "--json"]
    main(base)
    nvlink = json.loads(capsys.readouterr().out)
    main(base + ["--interconnect", "pcie"])
    pcie = json.loads(capsys.readouterr().out)
    assert pcie["non_torch_gib"] < nvlink["non_torch_gib"] and pcie["kv_cache_gib"] > nvlink["kv_cache_gib"]


def test_at_risk_exits_3_with_the_range_and_the_reason(capsys):
    import json
    from oomguard.cli import main
    argv = ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "l4", "--max-model-len", "34000",
            "--vllm-version", "0.19.0"]
    assert main(argv + ["--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "at_risk" and out["starts"] is True and out["risks"]
    assert out["kv_cache_gib_low"] < out["kv_cache_gib"] < out["kv_cache_gib_high"]
    assert main(argv) == 3 and "At risk" in capsys.readouterr().out
    assert main(argv[:5] + ["30000"] + argv[6:] + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "starts"


@pytest.mark.parametrize("argv, says", [
    (["--gpu-count", "0"], "--gpu-count must be at least 1"),
    (["-tp", "0"], "--tensor-parallel-size must be a positive integer"),
    (["--block-size", "7"], "--block-size 7 is not one vLLM"),
    (["--block-size", "48", "--vllm-version", "0.12.0"], "use 1, 8, 16, 32, 64, 128, 256"),
    (["--workload", ".", "--peak-concurrency", "4"], "is a directory"),
])
def test_bad_plan_input_is_one_line_and_exit_2(argv, says, capsys):
    from oomguard.cli import main
    assert main(["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err


def test_a_whole_command_in_one_quoted_argument(capsys):
    import json
    from oomguard.cli import main
    assert main(["plan", "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 4096", "--gpu", "h100",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_model_len"] == 4096


def test_a_pasted_command_keeps_every_option_it_had(capsys):
    import json
    from oomguard.cli import main
    assert main(["plan", "--gpu", "h100", "--json", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
                 "--host", "0.0.0.0", "--port", "8001", "--api-key", "sk-secret", "--tool-call-parser", "hermes",
                 "--enable-auto-tool-choice", "--max-model-len", "4096"]) == 0
    command = json.loads(capsys.readouterr().out)["command"]
    for kept in ("--host 0.0.0.0", "--port 8001", "--tool-call-parser hermes", "--enable-auto-tool-choice",
                 "--max-model-len 4096"):
        assert kept in command
    assert "sk-secret" not in command and '--api-key "$VLLM_API_KEY"' in command   # vLLM reads the variable too


def test_format_yaml_and_llm_class_without_a_workload(capsys):
    from oomguard.cli import main
    base = ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--max-model-len", "4096"]
    assert main(base + ["--format", "yaml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == 'model: "meta-llama/Llama-3.1-8B-Instruct"' and "max-model-len: 4096" in lines
    assert main(base + ["--llm-class"]) == 0
    out = capsys.readouterr().out
    assert "LLM(model='meta-llama/Llama-3.1-8B-Instruct'" in out and "vllm serve" not in out


def test_a_failing_plan_names_the_nearest_configuration_that_starts(capsys):
    import json
    from oomguard.cli import main
    # four GPUs given, no -tp: vLLM would load 70B on one and fail; the planner says TP 4 starts
    argv = ["plan", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h100", "--gpu-count", "4", "--max-model-len",
            "32768", "--vllm-version", "0.19.0", "--json"]
    assert main(argv) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "fails" and out["nearest_start"]["changes"] == {"tensor_parallel_size": 4}
    assert "--tensor-parallel-size 4" in out["nearest_start"]["command"]
    # a context too long for one RTX 4090: a shorter one that vLLM's estimate allows
    assert main(["plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090", "--vllm-version", "0.19.0",
                 "--json"]) == 1
    near = json.loads(capsys.readouterr().out)["nearest_start"]
    assert near["verdict"] == "starts" and near["max_model_len"] < 131072


def test_the_bar_and_the_verdict_give_one_free_figure_and_hybrid_tokens_are_explained(capsys):
    from oomguard.cli import main
    from oomguard.engines.vllm.memory import EngineConfig, predict
    from oomguard.gpus.catalog import resolve_gpu
    from oomguard.models.load import from_catalog
    from oomguard.plan.render import memory_slices
    report = predict(from_catalog("openai/gpt-oss-20b"), resolve_gpu("h100"), EngineConfig(), (0, 19, 0))
    slices = dict(memory_slices(report))
    assert slices["free"] == report.headroom_bytes and sum(slices.values()) == report.total_memory_bytes
    assert main(["plan", "openai/gpt-oss-20b", "--gpu", "h100", "--vllm-version", "0.19.0"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "shared by 2 layer group(s)" in out and f"{report.kv_cache_tokens:,} tokens" in out


def test_a_gpu_the_release_does_not_run_on_fails_with_the_reason_and_the_releases_that_do(capsys):
    import json
    from oomguard.cli import main
    base = ["plan", "meta-llama/Llama-3.2-1B-Instruct", "--max-model-len", "4096", "--json"]
    # the name exactly as nvidia-smi prints it; the CUDA 13 wheels of 0.20 carry no sm_70 kernels
    assert main(base + ["--gpu", "Tesla V100-SXM2-16GB", "--vllm-version", "0.20.0"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "fails" and out["starts"] is False and out["error_class"] == "dtype_capability"
    assert "no kernel image is available" in out["error"] and "--vllm-version 0.19.x or earlier" in out["error"]
    assert "nearest_start" not in out          # no memory setting changes what the GPU can run
    assert main(base + ["--gpu", "Tesla V100-SXM2-16GB", "--vllm-version", "0.19.0"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["dtype"] == "float16"   # bfloat16 falls back, with a note
    # what vLLM only warns about is a note: V0 on Turing in 0.9, a name cut short by nvidia-smi's table
    assert main(base + ["--gpu", "Tesla T4", "--vllm-version", "0.9.2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "v0" and any("falls back from V1 to V0" in a for a in out["assumptions"])
    assert main(base + ["--gpu", "NVIDIA RTX 6000 Ada Gene...", "--vllm-version", "0.19.0"]) == 0
    assert "RTX 6000 Ada" in json.loads(capsys.readouterr().out)["gpu"]
    # the human output says why, without a search for a memory setting that cannot help
    assert main(base[:-1] + ["--gpu", "p40", "--dtype", "half"]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "vLLM fails to start (dtype_capability): CUDA error: no kernel image" in text
    assert "No vLLM release's wheels do" in text and "No single change" not in text


def test_an_ambiguous_architecture_is_one_line_exit_2(capsys):
    from oomguard.cli import main
    assert main(["plan", "meta-llama/Llama-3.2-1B-Instruct", "--gpu", "gfx942"]) == 2
    err = capsys.readouterr().err.strip()
    assert "gfx942 names several catalog GPUs: mi300x-192gb, mi325x-256gb" in err and "\n" not in err


def test_help_lists_only_commands_that_run():
    import importlib

    from oomguard.cli import COMMANDS

    r = oomguard("--help")
    assert r.returncode == 0
    for name, (module, _) in COMMANDS.items():
        assert name in r.stdout
        importlib.import_module(module)   # every listed command has its module
