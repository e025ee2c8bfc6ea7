"""`oomguard plan --format kserve|llmd|prodstack|ray|epp`: every document validates against the real schema of its
target (tests/data/schemas, sources.yaml says where each comes from), and the vLLM flags each one makes its engine
run, planned again, give the verdict of the plan that wrote it."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml

from oomguard.cli import main
from oomguard.deploy import epp, kserve, llmd, prodstack, render
from oomguard.deploy.spec import KV_SAFETY_MARGIN
from oomguard.engines.vllm.flags import FLAGS, parse_vllm_command, set_flags
from oomguard.plan.api import predict

SCHEMAS = Path(__file__).parent / "data" / "schemas"
DESTS = {f.dest for f in FLAGS}

# (id, argv after `oomguard plan`, GPUs the plan is given): one GPU, TP on one node with an fp8 KV cache and LoRA
# slots, a JSON-valued flag, TP x PP over two nodes, an AMD GPU, a workload search over four nodes
CASES = [
    ("one-gpu", ["meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--max-model-len", "8192"]),
    ("tp4-fp8kv-lora", ["meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h100", "--gpu-count", "4", "-tp", "4",
                        "--kv-cache-dtype", "fp8", "--max-model-len", "32768", "--enable-lora", "--max-loras", "2",
                        "--max-lora-rank", "16"]),
    ("speculative", ["Qwen/Qwen2.5-7B-Instruct", "--gpu", "l4", "--max-model-len", "4096", "--speculative-config",
                     '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}',
                     "--no-enable-prefix-caching"]),
    ("two-nodes", ["meta-llama/Llama-3.1-405B-Instruct", "--gpu", "h100", "--nodes", "2", "--gpus-per-node", "8",
                   "--max-model-len", "16384"]),
    ("amd", ["meta-llama/Llama-3.1-70B-Instruct", "--gpu", "mi300x", "--max-model-len", "16384"]),
    ("workload-four-nodes", ["meta-llama/Llama-3.1-405B-Instruct", "--gpu", "h100", "--nodes", "4",
                             "--gpus-per-node", "8", "--p99-tokens", "16000", "--peak-concurrency", "32"]),
]
IDS = [c[0] for c in CASES]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@cache
def schema(fmt: str) -> dict:
    if fmt == "kserve":
        with gzip.open(SCHEMAS / "kserve" / "serving.kserve.io_llminferenceservices.yaml.gz", "rt") as f:
            crd = yaml.safe_load(f)
        version = next(v for v in crd["spec"]["versions"] if v["name"] == kserve.API_VERSION.split("/")[1])
        return strict(version["schema"]["openAPIV3Schema"])
    path = {"prodstack": "prodstack/values.schema.json", "llmd": "llmd/values.schema.json",
            "epp": "epp/endpointpickerconfig.schema.json", "ray": "ray/serve_llm_config.schema.json"}[fmt]
    return json.loads((SCHEMAS / path).read_text())


def strict(node):
    """A CRD schema as the API server applies it under `kubectl apply`'s default field validation (strict): an
    unknown field is an error, except below x-kubernetes-preserve-unknown-fields."""
    if isinstance(node, dict):
        node = {k: strict(v) for k, v in node.items()}
        if "properties" in node and "additionalProperties" not in node and \
                not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    elif isinstance(node, list):
        node = [strict(v) for v in node]
    return node


def validate(fmt: str, doc: dict) -> None:
    s = schema(fmt)
    cls = jsonschema.validators.validator_for(s, default=jsonschema.Draft7Validator)   # CRDs: OpenAPI v3 ~ draft 7
    cls.check_schema(s)
    errors = sorted(cls(s).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])


def planned(header: str) -> tuple[str, dict]:
    """The model and flags of the `vllm serve` line a manifest's header says it carries."""
    line = next(l for l in header.splitlines() if l.startswith("# planned by oomguard: "))
    command = parse_vllm_command(line.removeprefix("# planned by oomguard: "))
    return command.model, command.flags


def carried(fmt: str, doc: dict) -> dict:
    """The vLLM flags (by dest) the document makes its engine run, read the way the target reads them."""
    if fmt == "ray":
        kwargs = doc["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]
        assert set(kwargs) <= DESTS, set(kwargs) - DESTS   # EngineArgs names: vLLM's flag dests
        return dict(kwargs)
    words = {"kserve": kserve.vllm_words, "llmd": llmd.vllm_words, "prodstack": prodstack.vllm_words}[fmt](doc)
    command = parse_vllm_command(["vllm", "serve", "MODEL", *words])
    assert not command.ignored, command.ignored
    return command.flags


def replan_verdict(argv: list[str], model: str, flags: dict) -> str:
    """The verdict of planning `flags` on the GPUs the case names (GPU, count, version) with oomguard's API."""
    return predict(model, argv[argv.index("--gpu") + 1], gpu_count=replan_count(argv), flags=flags).verdict


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("fmt", render.FORMATS)
def test_every_manifest_validates_and_replans_to_the_same_verdict(case, fmt, capsys):
    _, argv = case
    code, out, err = run([*argv, "--format", fmt], capsys)
    assert code == 0, err
    doc = yaml.safe_load(out)
    validate(fmt, doc)
    if fmt == "kserve":   # the Endpoint Picker config KServe runs, inline
        validate("epp", doc["spec"]["router"]["scheduler"]["config"]["inline"])
    model, flags = planned(out)
    assert predict(model, argv[argv.index("--gpu") + 1],
                   gpu_count=replan_count(argv), flags=flags).verdict == "starts"
    if fmt == "epp":
        return
    got = carried(fmt, doc)
    if fmt == "prodstack" and "enable_prefix_caching" not in flags:   # the chart's template forces a value
        assert got.pop("enable_prefix_caching") is True
    assert norm(got) == norm(set_flags(flags)), "the manifest and the printed vllm serve line disagree"
    assert replan_verdict(argv, model, got) == "starts"


def norm(flags: dict) -> dict:
    """Flags with a parallel size of 1 (vLLM's default; KServe's template writes `--tensor-parallel-size 1`) dropped."""
    return {k: v for k, v in flags.items() if not (k.endswith("_parallel_size") and v == 1)}


def replan_count(argv: list[str]) -> int:
    if "--gpu-count" in argv:
        return int(argv[argv.index("--gpu-count") + 1])
    if "--nodes" in argv:
        return int(argv[argv.index("--nodes") + 1]) * int(argv[argv.index("--gpus-per-node") + 1])
    return 1


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_saturation_detector_carries_the_planned_kv_tokens_and_concurrency(case, capsys):
    _, argv = case
    code, out, _ = run([*argv, "--format", "epp"], capsys)
    assert code == 0
    doc = yaml.safe_load(out)
    model, flags = planned(out)
    report = predict(model, argv[argv.index("--gpu") + 1], gpu_count=replan_count(argv), flags=flags)
    detector = next(p for p in doc["plugins"] if p.get("name") == epp.SATURATION)
    assert doc["flowControl"]["saturationDetector"]["pluginRef"] == epp.SATURATION
    params = detector["parameters"]
    assert params["concurrencyMode"] == "hybrid" and params["headroom"] == 0
    assert params["maxTokenConcurrency"] == math.floor(report.kv_cache_tokens * KV_SAFETY_MARGIN)
    if "--peak-concurrency" in argv:   # a workload: the peak it was chosen to hold
        planned_requests = int(argv[argv.index("--peak-concurrency") + 1])
    else:                              # a single plan: the requests of max_model_len its KV cache holds
        planned_requests = min(math.floor(report.max_concurrency), report.config["max_num_seqs"])
    assert params["maxConcurrency"] == max(1, math.floor(planned_requests * KV_SAFETY_MARGIN))
    assert KV_SAFETY_MARGIN == 0.90


def test_multi_node_plans_tp_within_a_node_and_pp_across_nodes(capsys):
    code, out, _ = run(["meta-llama/Llama-3.1-405B-Instruct", "--gpu", "h100", "--nodes", "2", "--gpus-per-node",
                        "8", "--max-model-len", "16384", "--json"], capsys)
    plan = json.loads(out)
    assert code == 0 and plan["gpu_count"] == 16
    assert plan["config"]["tensor_parallel_size"] == 8 and plan["config"]["pipeline_parallel_size"] == 2
    assert any("not NVLink" in a and "pipeline stages across nodes" in a for a in plan["assumptions"])
    code, out, _ = run(["meta-llama/Llama-3.1-405B-Instruct", "--gpu", "h100", "--nodes", "2", "--gpus-per-node",
                        "8", "--max-model-len", "16384", "--format", "ray"], capsys)
    pg = yaml.safe_load(out)["applications"][0]["args"]["llm_configs"][0]["placement_group_config"]
    assert pg == {"bundles": [{"GPU": 1}] * 16, "strategy": "PACK"}
    code, out, _ = run(["meta-llama/Llama-3.1-405B-Instruct", "--gpu", "h100", "--nodes", "2", "--gpus-per-node",
                        "8", "--max-model-len", "16384", "--format", "prodstack"], capsys)
    model = yaml.safe_load(out)["servingEngineSpec"]["modelSpec"][0]
    assert model["raySpec"]["enabled"] and model["replicaCount"] == 1 and model["requestGPU"] == 8
    assert model["vllmConfig"]["tensorParallelSize"] == 8 and model["vllmConfig"]["pipelineParallelSize"] == 2


def test_a_model_that_fits_one_node_takes_one_node(capsys):
    code, out, _ = run(["meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--nodes", "2", "--gpus-per-node", "8",
                        "--max-model-len", "16384", "--json"], capsys)
    plan = json.loads(out)
    assert code == 0 and plan["config"]["tensor_parallel_size"] == 8 and plan["config"]["pipeline_parallel_size"] == 1
    assert "vLLM starts on 1 of the 2 nodes given" in plan["assumptions"][-1]


def test_a_workload_across_nodes_keeps_the_model_before_quantizing_it(capsys):
    # 405B in bf16 does not fit one node of 8 H100s; with four nodes given the search spreads pipeline stages over
    # nodes rather than quantize (keep-model), TP staying within a node
    code, out, _ = run(["meta-llama/Llama-3.1-405B-Instruct", "--gpu", "h100", "--nodes", "4", "--gpus-per-node",
                        "8", "--p99-tokens", "16000", "--peak-concurrency", "32", "--json"], capsys)
    chosen = json.loads(out)["chosen"]
    assert code == 0 and chosen["checkpoint"] == "bf16"
    assert chosen["flags"]["tensor_parallel_size"] <= 8 and chosen["flags"]["pipeline_parallel_size"] >= 2


@pytest.mark.parametrize("argv, says", [
    (["--nodes", "0", "--gpus-per-node", "8"], "--nodes"),
    (["--nodes", "2"], "--gpus-per-node"),
    (["--nodes", "2", "--gpus-per-node", "8", "-tp", "16"], "tensor parallelism stays within a node"),
    (["--nodes", "2", "--gpus-per-node", "8", "--gpu-count", "8"], "disagrees"),
    (["--nodes", "2", "--gpus-per-node", "8", "-tp", "4", "-pp", "3"], "whole nodes"),
    (["--format", "kserve", "--json"], "give one of them"),
    (["--format", "kserve", "--llm-class"], "LLM(...)"),
    (["--format", "ray", "-dp", "2", "--gpu-count", "2"], "replica count"),
    (["--format", "nosuch"], "invalid choice"),
])
def test_bad_deployment_input_is_one_line_and_exit_2(argv, says, capsys):
    code, out, err = run(["meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", *argv], capsys)
    assert code == 2 and out == "" and says in err and err.count("\n") == 1, err


def test_a_plan_that_fails_or_is_at_risk_writes_no_manifest_and_exits_with_its_verdict(capsys):
    # 70B in bf16 on four GPUs without -tp fails on the first; the nearest configuration that starts is named
    code, out, err = run(["meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h100", "--gpu-count", "4",
                          "--max-model-len", "32768", "--vllm-version", "0.19.0", "--format", "kserve"], capsys)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "no kserve manifest written" in err and "nearest configuration that starts: vllm serve" in err
    code, out, err = run(["meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090", "--max-model-len", "32768",
                          "--format", "epp"], capsys)
    if code == 3:   # at risk on this card (tests/test_plan_cli.py covers the verdict itself)
        assert out == "" and "may not start" in err and err.count("\n") == 1
    code, out, err = run(["meta-llama/Llama-3.1-405B-Instruct", "--gpu", "l4", "--p99-tokens", "4096",
                          "--peak-concurrency", "4", "--format", "llmd"], capsys)
    assert code == 1 and out == "" and "nothing fits" in err and err.count("\n") == 1


def test_manifests_leave_out_what_the_engines_set_themselves(capsys):
    code, out, _ = run(["--gpu", "h100", "--format", "kserve", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
                        "--max-model-len", "8192", "--port", "9000", "--host", "0.0.0.0", "--api-key", "sk-secret",
                        "--served-model-name", "llama", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"],
                       capsys)
    assert code == 0
    args = yaml.safe_load(out)["spec"]["template"]["containers"][0]["args"]
    assert args[-3:] == ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
    for owned in ("--port", "9000", "--host", "--api-key", "sk-secret", "--served-model-name"):
        assert owned not in args and owned not in out


def test_startup_probe_is_sized_for_the_weights(capsys):
    small = yaml.safe_load(run(["meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100", "--max-model-len", "8192",
                                "--format", "llmd"], capsys)[1])
    large = yaml.safe_load(run(["meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h100", "--gpu-count", "4", "-tp", "4",
                                "--max-model-len", "8192", "--format", "llmd"], capsys)[1])
    probe = lambda values: values["decode"]["containers"][0]["extraConfig"]["startupProbe"]   # noqa: E731
    # 300 s of engine start + the weights at 250 MB/s: 8B (15 GiB) ~ 6 min, 70B (132 GiB) ~ 15 min
    assert probe(small)["failureThreshold"] * probe(small)["periodSeconds"] == pytest.approx(365, abs=10)
    assert probe(large)["failureThreshold"] * probe(large)["periodSeconds"] == pytest.approx(870, abs=20)


def test_the_vllm_config_file_is_written_with_pyyaml_and_reads_back(capsys):
    code, out, _ = run(["Qwen/Qwen2.5-7B-Instruct", "--gpu", "l4", "--max-model-len", "4096", "--speculative-config",
                        '{"method": "ngram", "num_speculative_tokens": 3}', "--kv-cache-dtype", "fp8",
                        "--format", "yaml"], capsys)
    config = yaml.safe_load(out)
    assert code == 0 and config["model"] == "Qwen/Qwen2.5-7B-Instruct" and config["kv-cache-dtype"] == "fp8"
    assert json.loads(config["speculative-config"]) == {"method": "ngram", "num_speculative_tokens": 3}
    assert 'model: "Qwen/Qwen2.5-7B-Instruct"' in out   # strings double-quoted, as before PyYAML


def test_formats_agree_and_the_cli_import_path_stays_light():
    from oomguard.plan.command import MANIFESTS
    assert MANIFESTS == render.FORMATS
    code = ("import sys, oomguard.cli, oomguard.plan.command; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'yaml', 'jsonschema', 'rich', 'prometheus_client'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_sources_name_every_vendored_schema():
    sources = yaml.safe_load((SCHEMAS / "sources.yaml").read_text())
    assert set(sources) == {"kserve", "prodstack", "llmd", "epp", "ray"}
    for name, source in sources.items():
        assert (SCHEMAS / source["schema"]).is_file(), name
        assert source["repository"].count("/") == 1 and ("commit" in source or "from" in source), name
        if source["kind"].startswith("derived"):
            assert "DERIVED" in schema(name)["description"]
