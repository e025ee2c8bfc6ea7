"""Pin the planner's accuracy on real vLLM startup logs (benchmarks/plan_accuracy.py) so it cannot regress.

Targets (issue 2), on records whose model is in the catalog and whose vLLM version is known:
available KV memory within 0.3 GiB median and 1 GiB p90, KV tokens within 3% median, weights within 1%,
and the start/fail verdict right on every record.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "vllm_startup_logs.jsonl"

pytestmark = pytest.mark.skipif(not DATA.is_file(), reason="shared/data beside the checkout is not present")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("plan_accuracy", ROOT / "benchmarks" / "plan_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the module executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def summary(bench):
    # the records whose log prints its vLLM version (the set these pins were set on)
    return bench.summarize(bench.run(DATA, date_versions=False))


@pytest.fixture(scope="module")
def everything(bench):
    """All startup records (shared/data, batch2, benchmarks/data), with the dated versions, in and out of sample."""
    records = bench.load_records(bench.ALL_DATA)
    cases = bench.run_records(records)
    return {"cases": cases, "summary": bench.summarize(cases), "general": bench.generalisation(records, cases)}


def test_enough_records_are_modelled(summary):
    assert summary["modelled"] >= 13, summary["skipped"]


def test_available_kv_memory(summary):
    kv = summary["figures"]["kv_cache_memory_gib"]
    assert kv["median_abs"] <= 0.3 and kv["p90_abs"] <= 1.0, kv


def test_kv_tokens(summary):
    assert summary["figures"]["kv_cache_tokens"]["median_rel"] <= 0.03


def test_weights(summary):
    assert summary["figures"]["weights_gib"]["median_rel"] <= 0.01
    assert summary["figures"]["weights_gib"]["p90_rel"] <= 0.01  # MXFP4 experts padded per kernel (weights.py)


def test_measured_figures_do_not_regress(summary):
    # the fitted estimates (profile.py, benchmarks/fit_profile.py), compared with the worker that logged them
    # was 0.2 with a fitted sampler. 0.12: record 003 (Qwen2.5-VL-72B, V0) does not show its max_model_len, and at
    # the model's own 128K a multimodal V0 run batches the whole context (no chunked prefill for multimodal models,
    # engine/arg_utils.py); its logged 2.51 GiB matched only while every long context was planned chunked
    assert summary["figures"]["activation_peak_gib"]["p90_abs"] <= 0.12
    # the graph pool is fitted on batch2 too now (0.3 on these records alone); up to 0.19 it is outside the budget
    assert summary["figures"]["cuda_graph_gib"]["p90_abs"] <= 0.45
    assert summary["figures"]["kv_cache_memory_gib"]["p90_abs"] <= 0.15  # was 0.25


def test_verdict_accuracy_does_not_regress(summary):
    assert summary["figures"]["verdict_accuracy"] >= 12 / 13


def test_sampler_warm_up_from_source_on_vllm_0_10_to_0_13(bench, everything):
    # vLLM 0.10-0.16 sort [1024 x vocab] logits in the sampler warm-up (38 bytes a logit): the activation peaks of
    # llm-d-benchmark's H100 runs (dated 0.10.2-0.13 from their log lines) follow from the code, not from a fit
    dated = [c for c in everything["cases"] if c.predicted and c.record.get("activation_peak_gib") is not None
             and bench.band(c.record) == "0.10-0.13"]
    assert len(dated) >= 4
    for c in dated:
        assert abs(c.predicted["activation_peak_gib"] - c.record["activation_peak_gib"]) <= 0.1, c.record["id"]


def test_generalisation_is_measured_and_does_not_regress(bench, everything):
    general, summary = everything["general"], everything["summary"]
    assert summary["modelled"] >= 70
    pooled = general["pooled"]
    assert pooled["in_sample"]["kv_median_gib"] <= 0.15 and pooled["in_sample"]["kv_p90_gib"] <= 1.5
    # leave-one-band-out: each band scored with coefficients fitted without it, issue 14's targets (0.3 / 1.0 GiB).
    # It held at 1.6 GiB p90 until FlashInfer's fusion workspace came from source: the 1.5 GiB that TP over NVLink
    # gained between the 0.11 logs (0.55 GiB of non-torch memory) and the 0.19 ones (2.1) is its three buffers
    # rounded to multicast pages, which no band needs to be fitted on
    assert pooled["held_out"]["kv_median_gib"] <= 0.3 and pooled["held_out"]["kv_p90_gib"] <= 1.0
    assert pooled["held_out"]["kv_median_gib"] < pooled["static"]["kv_median_gib"]
    # issue 14 asks for at most 15%; 26 of 165 is 15.8% since the 29 logs collected twice are scored once: 23 of
    # them are the R9700's, whose KV range reaches 2.73 GiB below the prediction, as far as the held-out R9700 runs
    # fell (two starts of one setup are 2-2.6 GiB apart, benchmarks/measured_repeat.py); modelling ROCm made one
    # more of them at_risk (col-g-056, whose logged KV lies inside its range) and four more verdicts right
    # The warm-up verdict then allowed for its figures' misses both ways (a start predicted to leave 0.07 GiB free is
    # at risk, not "starts") and for NCCL's varying device memory over PCIe: col-b-015 and col-d-028, which failed
    # there, became right, with six tight starts at_risk beside them (34 of 204, 16.7%: over issue 14's 15%)
    assert len(summary["at_risk"]) <= 0.17 * summary["modelled"]
    # the AMD verdicts: 23 of 29 right before ROCm's layouts and allocator figures were modelled, 27 then; three
    # MI300X starts (set m, two with V0's whole-context batch on ROCm) came later and are right too
    amd = [c for c in everything["cases"] if c.predicted and bench.gpu_class(c.record) == "AMD (ROCm)"]
    assert len(amd) >= 32 and sum(map(bench.verdict_right, amd)) >= len(amd) - 2


@pytest.mark.xfail(strict=True, reason="open: gpt-oss-20b at 0.95 on vLLM 0.19 H100s (059, TP 1; col-d-023, TP 2) "
                   "OOMs in the sampler warm-up about 1.8 GiB short, while Llama-4-Scout (vocab 202048) starts with "
                   "less to spare: the sampler's own allocations are as in the profile run (v1/sample, Triton top-k/"
                   "top-p), so the gap is allocator memory in partly used segments that vLLM's allocated-byte figures "
                   "do not count, likely from MXFP4's Hopper weight swizzle after loading; no figure known before "
                   "launch separates them (measuring memory_reserved - memory_allocated after load_model would)")
def test_verdict_right_on_every_record(summary):
    assert summary["verdict_misses"] == []


def test_beats_both_baselines_on_kv_memory(summary):
    ours = summary["figures"]["kv_cache_memory_gib"]["median_abs"]
    for name in ("static", "naive"):
        assert ours < summary["baselines"][name]["kv_cache_memory_gib"]["median_abs"]


def test_most_collected_startups_name_a_model_the_planner_answers_offline(everything):
    # issue 15's target is 85% of the real startups the project collected (those that name a model id); with GLM-5.2
    # in the catalog, the 24 starts of local GLM-5.2 copies (W4A16, AutoRound, an FP8 MTP graft) resolve by name and
    # the share is 92% (219 of 237): this guards it from falling back below the target
    coverage = everything["summary"]["coverage"]["collected"]
    assert coverage["records"] >= 200 and coverage["answered"] / coverage["records"] >= 0.9, coverage


def test_model_ids_people_serve_are_answered_offline_in_both_halves():
    # benchmarks/model_coverage.py: 203 model strings from public commands, manifests and logs, split by source into
    # a half the catalog may grow on and a half not looked at; issue 15's target on the unseen half is 85%, not met
    # (72% with this round's name resolution and catalog, 57% at its start): this guards what was reached
    spec = importlib.util.spec_from_file_location("model_coverage", ROOT / "benchmarks" / "model_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    records = module.load(sorted(module.DATA.glob("*.jsonl")))
    halves = {name: [r for r in records if module.half(r) == name] for name in "ab"}
    assert min(map(len, halves.values())) >= 80
    for name, rows in halves.items():
        share = sum(module.answered(str(r.get("model") or "")) for r in rows) / len(rows)
        assert share >= 0.7, (name, share)
