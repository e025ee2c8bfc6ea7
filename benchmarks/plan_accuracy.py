"""How close `oomguard plan` comes to what vLLM really reported at startup.

Runs the planner on every record of ../shared/data/vllm_startup_logs.jsonl it can model (model in the
catalog, vLLM version known, GPU known) and prints, per figure, the median and 90th-percentile error, the
start/fail verdict accuracy, the skipped records with the reason, and two baselines computed in the same run:
  naive   the seeds' formula: weights = params x bytes, KV per token = layers x hidden x 2 x 2 bytes,
          KV memory = total x utilization - weights
  static  what static planners do: exact weights and exact per-token KV bytes, KV = total x util - weights
Usage: python benchmarks/plan_accuracy.py [--data PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from oomguard.engines.vllm.memory import EngineConfig, predict  # noqa: E402
from oomguard.engines.vllm.versions import parse_version  # noqa: E402
from oomguard.engines.vllm.weights import Parallel, stage_weight_bytes  # noqa: E402
from oomguard.errors import UsageError  # noqa: E402
from oomguard.gpus.catalog import resolve_gpu  # noqa: E402
from oomguard.models.load import catalog_entry, from_catalog  # noqa: E402
from oomguard.units import GiB  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "vllm_startup_logs.jsonl"
FIGURES = ("weights_gib", "activation_peak_gib", "non_torch_gib", "cuda_graph_gib", "kv_cache_memory_gib",
           "kv_cache_tokens", "max_concurrency")
_QUANT_WORDS = {"fp8", "awq", "gptq", "awq_marlin", "gptq_marlin", "compressed-tensors", "mxfp4", "bitsandbytes"}
# the gpu_worker.py line that prints the activation, non-torch and CUDA-graph figures, and the worker printing it
_USAGE_LINE = re.compile(r"^\((?P<who>[^)]*)\).*for peak activation", re.MULTILINE)
_PP_RANK = re.compile(r"PP(\d+)")
STAGE_FIGURES = ("activation_peak_gib", "non_torch_gib", "cuda_graph_gib")  # read from logged_stage's worker


@dataclass
class Case:
    record: dict
    predicted: dict | None = None
    naive: dict | None = None
    static: dict | None = None
    skip: str | None = None


def record_inputs(r: dict):
    """Planner inputs from what the log showed (no measured memory figure is used as an input)."""
    if not r.get("vllm_version"):
        raise LookupError("vLLM version not shown in the log")
    try:
        version = parse_version(r["vllm_version"])
    except UsageError as exc:
        raise LookupError(f"version {r['vllm_version']!r} not modelled") from exc
    if "fork" in str(r["vllm_version"]):
        raise LookupError("a fork of vLLM, not modelled")
    if catalog_entry(r["model"]) is None:
        raise LookupError(f"model {r['model']} not in the catalog")
    try:
        gpu = resolve_gpu(r.get("gpu_model") or "")
    except UsageError as exc:
        raise LookupError(f"GPU {r.get('gpu_model')!r} not in the catalog") from exc
    if r.get("gpu_total_memory_gib"):  # the log printed the device total: use what this GPU reported
        gpu = replace(gpu, total_memory_bytes=int(r["gpu_total_memory_gib"] * GiB))
    quant = str(r.get("quantization") or "").split(" ")[0] or None
    dtype = str(r.get("dtype") or "auto").replace("torch.", "")
    cfg = EngineConfig(
        tensor_parallel_size=r.get("tensor_parallel_size") or 1,
        pipeline_parallel_size=r.get("pipeline_parallel_size") or 1,
        gpu_memory_utilization=r.get("gpu_memory_utilization"),
        max_model_len=r.get("max_model_len"), max_num_seqs=r.get("max_num_seqs"),
        max_num_batched_tokens=r.get("max_num_batched_tokens"),
        dtype=dtype if dtype in ("bfloat16", "float16", "float32") else "auto",
        quantization=quant if quant in _QUANT_WORDS else None,
        kv_cache_dtype=r.get("kv_cache_dtype") or "auto", block_size=r.get("block_size"),
        enforce_eager=bool(r.get("enforce_eager")), cpu_offload_gb=r.get("cpu_offload_gb") or 0.0)
    model = from_catalog(r["model"])
    gpus = max(r.get("num_gpus") or 1, cfg.tensor_parallel_size * cfg.pipeline_parallel_size)
    return model, gpu, cfg, version, gpus, r.get("engine")


def logged_stage(record: dict) -> int:
    """Pipeline stage of the worker whose log line gave the activation / non-torch / graph figures (0 if unsaid).

    With pipeline parallelism each stage prints its own "Actual usage is ..." line, and a record keeps one of them
    (e.g. Worker_PP1's), so predictions are compared with that stage's worker, not with the first stage's."""
    match = _USAGE_LINE.search(record.get("raw_excerpt") or "")
    pp = _PP_RANK.search(match.group("who")) if match else None
    return int(pp.group(1)) if pp else 0


def baselines(model, gpu, report) -> tuple[dict, dict]:
    """The seeds' naive formula and a weights + KV static planner, on the same inputs."""
    c = report.config
    util, tp, pp = c["gpu_memory_utilization"], c["tensor_parallel_size"], c["pipeline_parallel_size"]
    params = stage_weight_bytes(replace(model, quant=None, vision=None), Parallel(), 0, 1)
    budget = gpu.total_memory_bytes * util
    naive_w = params * 2 / (tp * pp)
    naive_tok = model.num_layers * model.hidden_size * 2 * 2 / (tp * pp)
    naive_kv = budget - naive_w
    static_w = report.first.weights_bytes
    static_kv = budget - static_w
    per_token = report.first.bytes_per_block / report.block_size
    out = []
    for w, kv, tok in ((naive_w, naive_kv, naive_tok), (static_w, static_kv, per_token)):
        tokens = max(int(kv // tok), 0)
        out.append({"weights_gib": w / GiB, "kv_cache_memory_gib": kv / GiB, "kv_cache_tokens": tokens,
                    "starts": tokens >= c["max_model_len"]})
    return out[0], out[1]


def run(data: Path) -> list[Case]:
    cases = []
    for line in data.read_text().splitlines():
        if not line.strip():
            continue
        case = Case(json.loads(line))
        try:
            model, gpu, cfg, version, gpus, engine = record_inputs(case.record)
            report = predict(model, gpu, cfg, version, gpu_count=gpus, engine=engine)
        except LookupError as exc:
            case.skip = str(exc)
        except UsageError as exc:
            case.skip = f"planner refused: {exc}"
        else:
            d = report.to_dict()
            logged = report.workers[min(logged_stage(case.record), len(report.workers) - 1)]
            case.predicted = {"weights_gib": report.first.weights_bytes / GiB,
                              "activation_peak_gib": logged.activation_peak_bytes / GiB,
                              "non_torch_gib": logged.non_torch_bytes / GiB,
                              "cuda_graph_gib": logged.cuda_graph_bytes / GiB,
                              "kv_cache_memory_gib": report.first.kv_cache_bytes / GiB,
                              "kv_cache_tokens": d["kv_cache_tokens"], "max_concurrency": d["max_concurrency"],
                              "starts": report.starts, "estimated_max_model_len": report.estimated_max_model_len,
                              "error_class": report.error_class}
            case.naive, case.static = baselines(model, gpu, report)
        cases.append(case)
    return cases


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(cases: list[Case]) -> dict:
    modelled = [c for c in cases if c.predicted]
    summary: dict = {"records": len(cases), "modelled": len(modelled), "figures": {}, "baselines": {}}
    for method in ("predicted", "naive", "static"):
        target = summary["figures"] if method == "predicted" else summary["baselines"].setdefault(method, {})
        for fig in FIGURES:
            abs_err, rel_err = [], []
            for c in modelled:
                pred, real = (getattr(c, method) or {}).get(fig), c.record.get(fig)
                if pred is None or real is None or (c.record["outcome"] != "ok" and fig == "kv_cache_tokens"):
                    continue
                abs_err.append(abs(pred - real))
                rel_err.append(abs(pred - real) / abs(real) if real else 0.0)
            if abs_err:
                target[fig] = {"n": len(abs_err), "median_abs": statistics.median(abs_err), "p90_abs": _pct(abs_err, 0.9),
                               "median_rel": statistics.median(rel_err), "p90_rel": _pct(rel_err, 0.9)}
        verdicts = [(getattr(c, method) or {}).get("starts") == (c.record["outcome"] == "ok") for c in modelled]
        target["verdict_accuracy"] = sum(verdicts) / len(verdicts) if verdicts else float("nan")
    summary["verdict_misses"] = [c.record["id"] for c in modelled
                                 if c.predicted["starts"] != (c.record["outcome"] == "ok")]
    summary["skipped"] = [(c.record["id"], c.skip) for c in cases if c.skip]
    return summary


def print_table(summary: dict) -> None:
    print(f"records: {summary['records']}, modelled: {summary['modelled']}\n")
    print("| figure | n | oomguard median | oomguard p90 | static median | naive median |")
    print("|---|---|---|---|---|---|")
    for fig in FIGURES:
        s = summary["figures"].get(fig)
        if s is None:
            continue
        unit = "" if fig in ("kv_cache_tokens", "max_concurrency") else " GiB"
        base = [summary["baselines"][m].get(fig) for m in ("static", "naive")]  # only weights/KV/tokens exist
        cells = [f"{b['median_abs']:.3g}{unit} ({b['median_rel']:.1%})" if b else "-" for b in base]
        print(f"| {fig} | {s['n']} | {s['median_abs']:.3g}{unit} ({s['median_rel']:.1%}) | "
              f"{s['p90_abs']:.3g}{unit} ({s['p90_rel']:.1%}) | {cells[0]} | {cells[1]} |")
    b = summary["baselines"]
    print(f"| start/fail verdict | {summary['modelled']} | {summary['figures']['verdict_accuracy']:.0%} right | | "
          f"{b['static']['verdict_accuracy']:.0%} | {b['naive']['verdict_accuracy']:.0%} |")
    if summary["verdict_misses"]:
        print(f"\nverdict misses: {', '.join(summary['verdict_misses'])}")
    print("\nskipped:")
    for rid, why in summary["skipped"]:
        print(f"  {rid}: {why}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--per-record", action="store_true", help="print each record's predicted vs reported figures")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        print(f"no data at {args.data}: pass --data PATH to vllm_startup_logs.jsonl", file=sys.stderr)
        return 2
    cases = run(args.data)
    summary = summarize(cases)
    if args.per_record:
        for c in cases:
            if c.predicted:
                row = "  ".join(f"{f}={c.predicted[f]:.4g}/{c.record.get(f)}" for f in FIGURES)
                print(f"{c.record['id']} {c.record['model'][:30]:30} starts={c.predicted['starts']}/"
                      f"{c.record['outcome']} {row}")
    if args.json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        print()
    else:
        print_table(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
