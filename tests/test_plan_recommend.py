"""`oomguard plan ... --p99-tokens/--peak-concurrency/--workload` (issue 3): the search, its outputs, tiering.

Every expectation is derived from the memory model itself (the candidate that differs in one setting is
evaluated and must fail), not from hard-coded figures.
"""

import json
import subprocess
import sys

import pytest

from oomguard.engines.vllm.flags import FLAGS
from oomguard.engines.vllm.memory import EngineConfig, predict
from oomguard.engines.vllm.versions import NEWEST
from oomguard.gpus.catalog import list_gpus, resolve_gpu
from oomguard.models.load import from_catalog
from oomguard.models.variants import base_name, precision_variants
from oomguard.plan.recommend import recommend
from oomguard.plan.search import context_length, evaluate, search
from oomguard.plan.workload import Workload, peak_overlap, percentile, read_workload_file
from oomguard.units import GiB


def oomguard(*args):
    return subprocess.run([sys.executable, "-m", "oomguard", *args], capture_output=True, text=True, timeout=120)


def _search(model_id, gpu, count, p99, peak, **kw):
    model = from_catalog(model_id)
    variants = kw.pop("variants", precision_variants(model))
    return model, search(model, resolve_gpu(gpu), count, Workload(p99, peak), NEWEST, variants=variants, **kw)


def _same_but(result, chosen, **change):
    for c in result.candidates:
        if c.checkpoint.label == chosen.checkpoint.label and all(
                getattr(c.config, k) == change.get(k, getattr(chosen.config, k))
                for k in ("tensor_parallel_size", "pipeline_parallel_size", "kv_cache_dtype")):
            return c
    return None


def _holds_peak(candidate, workload):
    """Recheck a candidate independently: vLLM starts and its blocks hold C requests of p99 tokens."""
    r = candidate.report
    per_request = r.kv_layout.blocks_per_request(workload.p99_tokens, r.in_flight_tokens)
    return r.starts and r.num_gpu_blocks >= workload.peak_concurrency * per_request


def test_fits_one_gpu_only_with_fp8_kv():
    workload = Workload(8000, 10)
    _, result = _search("meta-llama/Llama-3.1-8B-Instruct", "rtx4090", 1, 8000, 10)
    best = result.best
    assert best is not None and best.gpus == 1
    assert best.config.kv_cache_dtype == "fp8" and best.checkpoint.label == "bf16"
    auto = _same_but(result, best, kv_cache_dtype="auto")
    assert auto is not None and not auto.feasible and not _holds_peak(auto, workload)
    assert _holds_peak(best, workload)


def test_needs_tensor_parallel_two():
    workload = Workload(8000, 16)
    # the model's own checkpoint only: the catalog's 4-bit copy fits one GPU (see test_needs_a_quantized_checkpoint_from_the_catalog)
    _, result = _search("meta-llama/Llama-3.1-70B-Instruct", "h100", 2, 8000, 16, variants=[])
    assert result.best.config.tensor_parallel_size == 2
    one_gpu = [c for c in result.candidates if c.gpus == 1]
    assert one_gpu and not any(c.feasible for c in one_gpu)
    assert _holds_peak(result.best, workload)


def test_objectives_rank_by_their_own_measure():
    _, fewest = _search("meta-llama/Llama-3.1-70B-Instruct", "h100", 8, 7400, 32, objective="fewest-gpus")
    _, headroom = _search("meta-llama/Llama-3.1-70B-Instruct", "h100", 8, 7400, 32, objective="most-headroom")
    _, fast = _search("meta-llama/Llama-3.1-70B-Instruct", "h100", 8, 7400, 32, objective="max-throughput")
    assert fewest.best.gpus == min(c.gpus for c in fewest.feasible)
    assert headroom.best.held == max(c.held for c in headroom.feasible)
    top = fast.best.speed.decode_tokens_per_s
    assert top == max(c.speed.decode_tokens_per_s for c in fast.feasible)
    assert all(c.reason for c in fast.feasible)


def test_needs_a_quantized_checkpoint_from_the_catalog():
    model = from_catalog("meta-llama/Llama-3.1-8B-Instruct")
    variants = precision_variants(model)
    int4 = [v for v in variants if v.quant and v.quant.bits == 4]
    assert int4, "the catalog should hold a 4-bit copy of Llama-3.1-8B-Instruct"
    workload = Workload(4096, 8)
    result = search(model, resolve_gpu("rtx3060"), 1, workload, NEWEST, variants=variants)
    best = result.best
    assert best is not None and best.checkpoint.other_checkpoint and best.checkpoint.model.quant.bits == 4
    assert base_name(best.checkpoint.model.model_id) == base_name(model.model_id)
    own = [c for c in result.candidates if not c.checkpoint.other_checkpoint]
    assert own and not any(c.feasible for c in own)   # bf16 and online fp8 both fall short
    r = oomguard("plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx3060", "--p99-tokens", "4096",
                 "--peak-concurrency", "8", "--json")
    assert r.returncode == 0, r.stderr
    chosen = json.loads(r.stdout)["chosen"]
    assert chosen["other_checkpoint"] and chosen["command"].startswith(f"vllm serve {chosen['model']}")
    assert any(w["setting"] == "model" for w in chosen["why"])


def test_cannot_fit_anywhere_gives_a_tiering_plan_with_a_slowdown():
    r = oomguard("plan", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "rtx4090", "--p99-tokens", "4096",
                 "--peak-concurrency", "4", "--no-other-checkpoints", "--json")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["fits"] is False and data["chosen"] is None
    nf = data["no_fit"]
    assert "weights" in nf["breaks"]
    kinds = {c["kind"] for c in nf["changes"]}
    assert {"more-gpus", "larger-gpu"} <= kinds
    offload = nf["cpu_offload"]
    weights_gib = 70e9 * 2 / GiB
    assert offload["offload_gib_per_gpu"] > weights_gib - 24        # most of the weights must leave the GPU
    assert offload["pcie_gb_per_s_assumed"] > 0
    # bytes over PCIe per step bound the speed: never faster than the link allows
    floor_ms = offload["offload_gib_per_gpu"] * GiB / (offload["pcie_gb_per_s_assumed"] * 1e9) * 1e3
    assert offload["uva"]["step_ms"] >= floor_ms
    assert "s per token" in offload["verdict"] and "not usable" in offload["verdict"]
    llama = nf["llamacpp"]   # the GGUF tier: part of the layers on the GPU, the rest in host RAM
    assert 0 < llama["n_gpu_layers"] < 81 and not llama["fits_on_gpu"]
    assert f"-ngl {llama['n_gpu_layers']}" in llama["command"] and llama["command"].startswith("llama-server")
    assert llama["speed"]["decode_tokens_per_s"] > 0
    human = oomguard("plan", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "rtx4090", "--p99-tokens", "4096",
                     "--peak-concurrency", "4")
    assert human.returncode == 1 and "Nothing fits" in human.stdout and "--cpu-offload-gb" in human.stdout
    assert "llama-server -m" in human.stdout


def test_smallest_changes_really_fit():
    model = from_catalog("meta-llama/Llama-3.1-8B-Instruct")
    gpu = resolve_gpu("rtx3060")
    workload = Workload(4096, 8)
    rec = recommend(model, gpu, 1, workload, NEWEST, "fewest-gpus", gpus=list_gpus())
    assert rec.chosen is None and rec.no_fit is not None
    for change in rec.no_fit.changes:
        if change.candidate is not None:
            assert change.candidate.feasible and change.candidate.report.starts
    shorter = [c for c in rec.no_fit.changes if c.kind == "shorter-context"]
    lower = [c for c in rec.no_fit.changes if c.kind == "lower-concurrency"]
    assert shorter and lower
    tokens = int(shorter[0].summary.split("up to ")[1].split(" ")[0].replace(",", ""))
    concurrency = int(lower[0].summary.split(" ")[0])
    for wl, fits in ((Workload(tokens, 8), True), (Workload(tokens + 256, 8), False),
                     (Workload(4096, concurrency), True), (Workload(4096, concurrency + 1), False)):
        assert (search(model, gpu, 1, wl, NEWEST).best is not None) is fits, wl


def test_shared_gpu_plans_against_free_memory():
    gpu = resolve_gpu("l4")
    model = from_catalog("meta-llama/Llama-3.1-8B-Instruct")
    workload = Workload(4096, 4)
    full = search(model, gpu, 1, workload, NEWEST)
    assert full.best.checkpoint.label == "bf16"
    free = 13 * GiB   # another process holds the rest
    shared = search(model, gpu, 1, workload, NEWEST, free_memory_bytes=free)
    best = shared.best
    assert best is not None and best.checkpoint.label != "bf16"     # bf16 weights leave no room in 13 GiB
    assert best.config.gpu_memory_utilization * gpu.total_memory_bytes <= free
    assert best.report.starts
    r = oomguard("plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "l4", "--free-memory", "13",
                 "--p99-tokens", "4096", "--peak-concurrency", "4", "--format", "yaml")
    assert r.returncode == 0, r.stderr
    util = [line for line in r.stdout.splitlines() if line.startswith("gpu-memory-utilization:")]
    assert util and float(util[0].split(":")[1]) * gpu.total_memory_bytes <= free


def test_outputs_yaml_llm_kwargs_and_serve_line_agree():
    r = oomguard("plan", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "l4", "--p99-tokens", "6000", "--peak-concurrency", "8",
                 "--prefix-sharing", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    chosen = json.loads(r.stdout)["chosen"]
    flags = chosen["flags"]
    assert flags["enable_prefix_caching"] is True and flags["max_model_len"] == 6144
    assert flags["max_num_seqs"] == 8
    long_options = {f.options[0][2:]: f.dest for f in FLAGS}
    yaml_keys = {}
    for line in chosen["yaml"].splitlines():
        key, value = line.split(": ", 1)
        yaml_keys[key] = value
    assert yaml_keys.pop("model") == '"Qwen/Qwen2.5-7B-Instruct"'
    assert {long_options[k] for k in yaml_keys} == set(flags)
    for dest, value in flags.items():
        option = next(f.options[0] for f in FLAGS if f.dest == dest)
        assert (f"{option} {value}" if not isinstance(value, bool) else option) in chosen["command"]
        assert f"{dest}={value!r}" in chosen["llm_kwargs"]
    why = {w["setting"]: w["reason"] for w in chosen["why"]}
    assert "6,144 covers your p99 of 6,000" in why["max_model_len"]
    assert why["enable_prefix_caching"].startswith("on: your requests share 50%")
    assert len(json.loads(r.stdout)["candidates"]) >= 1


def test_recommended_config_starts_when_replanned_from_its_own_command():
    r = oomguard("plan", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h100", "--gpu-count", "8", "--p99-tokens",
                 "7400", "--peak-concurrency", "32", "--json")
    chosen = json.loads(r.stdout)["chosen"]
    again = oomguard("plan", "--gpu", "h100", "--gpu-count", "8", "--json", "--", *chosen["command"].split())
    assert again.returncode == 0, again.stderr
    plan = json.loads(again.stdout)
    assert plan["starts"] and plan["max_concurrency"] * plan["max_model_len"] >= 32 * 7400 * 0.99


def test_max_model_len_rounds_the_p99_up_and_respects_the_model():
    model = from_catalog("meta-llama/Llama-3.1-8B-Instruct")
    assert context_length(Workload(7400, 1), model) == 8192
    assert context_length(Workload(8192, 1), model) == 8192
    assert context_length(Workload(10 ** 6, 1), model) == model.derived_max_model_len


def test_workload_file_derives_p99_and_peak(tmp_path):
    lines = []
    for i in range(200):   # 200 requests, 1 s apart, each lasting 5 s: at most 5 overlap (end == next start)
        lines.append(json.dumps({"prompt_tokens": 100 + i, "output_tokens": 50, "start": i, "end": i + 5}))
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    w = read_workload_file(str(path))
    totals = [150 + i for i in range(200)]
    assert w.p99_tokens == percentile(totals, 99) == 347
    assert w.peak_concurrency == 5 == peak_overlap([(i, i + 5) for i in range(200)])
    assert w.max_tokens_out == 50
    text = tmp_path / "t.jsonl"
    text.write_text(json.dumps({"prompt": "x" * 400, "max_tokens": 100}) + "\n")
    wt = read_workload_file(str(text), peak_concurrency=3)
    assert wt.p99_tokens == 200 and wt.peak_concurrency == 3 and any("characters per token" in n for n in wt.notes)
    r = oomguard("plan", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "l4", "--workload", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["workload"]["peak_concurrency"] == 5


@pytest.mark.parametrize("content,needle", [
    (None, "not found"),
    ("{not json\n", "not valid JSON"),
    ('[1, 2]\n', "expected a JSON object"),
    ('{"output_tokens": 5}\n', "no prompt length"),
    ('{"prompt_tokens": 5}\n', "no output length"),
    ('{"prompt_tokens": -5, "output_tokens": 1}\n', "non-negative"),
    ('{"prompt_tokens": 5, "output_tokens": 1}\n', "--peak-concurrency"),
    ('{"prompt_tokens": 5, "output_tokens": 1, "start": 3, "end": 1}\n', "ends before it starts"),
    ("", "no requests"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
])
def test_bad_workload_files_exit_2_with_one_line(tmp_path, content, needle):
    path = tmp_path / "w.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    r = oomguard("plan", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "l4", "--workload", str(path))
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["--p99-tokens", "4096"], "--peak-concurrency"),
    (["--p99-tokens", "0", "--peak-concurrency", "2"], "positive"),
    (["--p99-tokens", "4096", "--peak-concurrency", "2", "--prefix-sharing", "1.5"], "--prefix-sharing"),
    (["--p99-tokens", "4096", "--peak-concurrency", "2", "--max-model-len", "2048"], "below your p99"),
    (["--p99-tokens", "4096", "--peak-concurrency", "2", "--objective", "cheapest"], "invalid choice"),
    (["--p99-tokens", "4096", "--peak-concurrency", "2", "--free-memory", "500"], "--free-memory"),
])
def test_bad_workload_arguments_exit_2(args, needle):
    r = oomguard("plan", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "l4", *args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_candidate_predictions_are_the_planners():
    """A candidate's report is exactly what `oomguard plan` predicts for its flags."""
    model, result = _search("Qwen/Qwen2.5-7B-Instruct", "l4", 1, 6000, 8)
    best = result.best
    direct = predict(model, resolve_gpu("l4"), EngineConfig(**best.command_flags()), NEWEST, gpu_count=1)
    assert direct.to_dict() == best.report.to_dict()
    again = evaluate(best.checkpoint, resolve_gpu("l4"), 1, Workload(6000, 8), NEWEST, best.config, None)
    assert again.held == best.held and again.feasible


DATA = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "data" / "vllm_startup_logs.jsonl"


@pytest.mark.skipif(not DATA.is_file(), reason="shared/data beside the checkout is not present")
def test_fixes_for_real_startup_failures_would_start():
    """Cross-check (issue 3): for each failed startup the planner can model, the recommended configuration,
    with the user's hardware and engine settings kept, starts by the model; where vLLM printed its own
    estimated maximum model length, the recommended max_model_len is no larger."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("plan_accuracy", Path(__file__).resolve().parents[1] /
                                                  "benchmarks" / "plan_accuracy.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    checked = 0
    for line in DATA.read_text().splitlines():
        record = json.loads(line)
        if record["outcome"] != "error":
            continue
        try:
            model, gpu, cfg, version, gpus, _ = bench.record_inputs(record)
        except LookupError:
            continue
        if cfg.data_parallel_size > 1:   # the search plans one replica; data + expert parallel layouts are not searched
            continue
        pinned = {k: getattr(cfg, k) for k in ("tensor_parallel_size", "pipeline_parallel_size", "kv_cache_dtype",
                                                 "enforce_eager", "max_num_seqs", "max_num_batched_tokens",
                                                 "block_size", "quantization") if getattr(cfg, k) is not None}
        workload = Workload(cfg.max_model_len or model.derived_max_model_len, 1)
        rec = recommend(model, gpu, gpus, workload, version, "fewest-gpus", fixed=pinned, gpus=list_gpus())
        if rec.chosen is not None:
            fixed = rec.chosen
        else:
            shorter = [c for c in rec.no_fit.changes if c.kind == "shorter-context"]
            assert shorter, record["id"]
            tokens = int(shorter[0].summary.split("up to ")[1].split(" ")[0].replace(",", ""))
            fixed = search(model, gpu, gpus, Workload(tokens, 1), version, fixed=pinned).best
        assert fixed.report.starts and fixed.held >= 1, record["id"]
        estimate = record.get("error_estimated_max_model_len")
        if estimate:
            assert fixed.config.max_model_len <= estimate, record["id"]
        checked += 1
    assert checked >= 1


def test_default_keeps_the_named_model_at_its_precision_when_it_fits():
    # 70B on 8 x H100: a 4-bit copy fits one GPU, but the model asked for runs in bf16 on four with room to spare
    model, result = _search("meta-llama/Llama-3.1-70B-Instruct", "h100", 8, 7400, 32)
    best = result.best
    assert result.objective == "keep-model"
    assert best.checkpoint.label == "bf16" and not best.checkpoint.other_checkpoint
    assert best.config.kv_cache_dtype == "auto" and not best.config.enforce_eager
    assert best.held >= 1.5 * 32
    fewest = _search("meta-llama/Llama-3.1-70B-Instruct", "h100", 8, 7400, 32, objective="fewest-gpus")[1].best
    assert fewest.gpus < best.gpus                                    # the objective that asks for it may trade


def test_a_configuration_at_risk_is_not_recommended():
    from oomguard.plan.search import Checkpoint
    model = from_catalog("meta-llama/Llama-3.1-8B-Instruct")
    ckpt = Checkpoint(model, None, "bf16", 0, False)
    edge = EngineConfig(max_model_len=34000, gpu_memory_utilization=0.9)      # at_risk on an L4 (test_plan_cli)
    c = evaluate(ckpt, resolve_gpu("l4"), 1, Workload(34000, 1), (0, 19, 0), edge, None)
    assert c.report.verdict == "at_risk" and not c.feasible and "may not start" in c.shortfall


def test_eager_mode_is_explained_by_what_the_graphs_would_take():
    r = oomguard("plan", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "l4", "--p99-tokens", "4096",
                 "--peak-concurrency", "8", "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64")
    assert r.returncode == 0, r.stderr
    assert "eager mode" in r.stdout   # 4 slots of rank 64 leave no room for graphs on a 24 GB L4
    assert "0.00 GiB" not in r.stdout.split("eager mode", 1)[1][:80]   # the memory it frees, not the eager plan's
    assert "--enable-lora --max-loras 4 --max-lora-rank 64" in r.stdout
