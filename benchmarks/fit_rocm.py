"""Fit what a ROCm start adds where vLLM's code gives no number (profile.RocmFit), on a split of the AMD records.

vLLM's own arithmetic for ROCm (the weight layouts its quantization methods choose there, weights.py) is in the
planner already; what is left is the HIP runtime's and PyTorch's allocator behaviour. The R9700 records come from one
benchmark repository in three folders: the ROCm-attention runs (vLLM 0.13, `benchmark_results_amd-r9700-rocm_atten/`)
fit the three offsets (each the median residual: the weights vLLM logged beyond the planner's layout, the activation +
non-torch memory its KV budget implies beyond the CUDA fit, the HIP-graph pool beyond CUDA's); the other folders
(vLLM 0.11.2, Triton attention) and the other repositories' AMD runs are held out and scored. The KV range's
margins below and above are the widest misses of all of them (held out, and the fitting folder's own scatter around
its medians), so that an at-risk range holds every AMD start seen; the warm-up's graph margin is their graph misses'
90th percentile.
Usage: python benchmarks/fit_rocm.py [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from plan_accuracy import ALL_DATA, _pct, gpu_class, load_records, run_records, verdict_right  # noqa: E402

from oomguard.engines.vllm import profile  # noqa: E402

TRAIN_FOLDER = "benchmark_results_amd-r9700-rocm_atten/"


def is_train(record: dict) -> bool:
    return TRAIN_FOLDER in (record.get("source_url") or "")


def residuals(cases) -> dict[str, list[float]]:
    """Logged minus predicted, per figure, over the cases that logged it."""
    out: dict[str, list[float]] = {"weights": [], "profile": [], "graph": []}
    for c in cases:
        r, p = c.record, c.predicted
        if r.get("weights_gib") is not None:
            out["weights"].append(r["weights_gib"] - p["weights_gib"])
            if r.get("kv_cache_memory_gib") is not None:   # what the budget left for activation + non-torch memory
                implied = p["requested_gib"] - r["weights_gib"] - r["kv_cache_memory_gib"]
                out["profile"].append(implied - p["activation_peak_gib"] - p["non_torch_gib"])
        if r.get("cuda_graph_gib") is not None and p["cuda_graph_gib"]:
            out["graph"].append(r["cuda_graph_gib"] - p["cuda_graph_gib"])
    return out


def score(cases) -> dict:
    kv = [c.predicted["kv_cache_memory_gib"] - c.record["kv_cache_memory_gib"] for c in cases
          if c.record.get("kv_cache_memory_gib") is not None]
    return {"records": len(cases), "kv_n": len(kv),
            "kv_median_gib": round(statistics.median(abs(d) for d in kv), 2) if kv else None,
            "kv_p90_gib": round(_pct([abs(d) for d in kv], 0.9), 2) if kv else None,
            "verdicts_right": sum(verdict_right(c) for c in cases),
            "at_risk": sum(c.predicted["verdict"] == "at_risk" for c in cases)}


def amd(cases):
    return [c for c in cases if c.predicted and gpu_class(c.record) == "AMD (ROCm)"]


def fit() -> dict:
    records = [r for r in load_records(ALL_DATA) if gpu_class(r) == "AMD (ROCm)"]
    zero = replace(profile.ROCM_FIT, load_residue_gib=0.0, profile_gib=0.0, graph_gib=0.0)
    bare = amd(run_records(records, rocm=zero))
    train = residuals([c for c in bare if is_train(c.record)])
    fitted = replace(zero, **{"load_residue_gib": round(statistics.median(train["weights"]), 3),
                              "profile_gib": round(statistics.median(train["profile"]), 3),
                              "graph_gib": round(statistics.median(train["graph"]), 3)})
    scored = amd(run_records(records, rocm=fitted))
    # the margins: the misses of the held-out runs (out of sample), and of the fitting folder's own runs, whose
    # spread around the medians the held-out runs alone (all missed below, none above) would not show
    misses = [c.predicted["kv_cache_memory_gib"] - c.record["kv_cache_memory_gib"] for c in scored
              if c.record.get("kv_cache_memory_gib") is not None]
    graph_misses = [abs(d) for d in residuals(scored)["graph"]]
    fitted = replace(fitted, kv_below_gib=round(max(max(misses), 0.0), 2),
                     kv_above_gib=round(max(-min(misses), 0.0), 2),
                     graph_margin_gib=round(_pct(graph_misses, 0.9), 2))
    final = amd(run_records(records, rocm=fitted))
    split = {"train": [c for c in final if is_train(c.record)], "held_out": [c for c in final if not is_train(c.record)]}
    return {"fit": asdict(fitted), "shipped": asdict(profile.ROCM_FIT),
            "train_residuals_gib": {k: [round(x, 2) for x in v] for k, v in train.items()},
            "scores": {name: score(cs) for name, cs in (("all", final), *split.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    out = fit()
    if parser.parse_args().json:
        print(json.dumps(out, indent=2))
        return
    print("fitted on", TRAIN_FOLDER, "(RocmFit):")
    for k, v in out["fit"].items():
        print(f"  {k} = {v}   (shipped {out['shipped'][k]})")
    print("\n| AMD records | n | KV median / p90 GiB | verdicts right | at risk |\n|---|---|---|---|---|")
    for name, s in out["scores"].items():
        print(f"| {name} | {s['records']} | {s['kv_median_gib']} / {s['kv_p90_gib']} | {s['verdicts_right']}/"
              f"{s['records']} | {s['at_risk']} |")


if __name__ == "__main__":
    main()
