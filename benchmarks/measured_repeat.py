"""How well one start's own figures predict another start of the same setup (what `oomguard serve` learns and
`oomguard plan --state-dir` uses: oomguard/engines/vllm/measured.py).

Groups the startup records the planner can model by setup (model, GPU, vLLM release and every resolved setting but
those that move only the KV budget: utilization, context length, KV dtype, block size, prefix caching). For every
ordered pair of records in a group (two starts, not one log collected twice) that started and logged their KV budget, the figures read from the first one's
log (as serve reads them) plan the second one's configuration; its logged "Available KV cache memory" is the truth.
Printed beside the estimate-only error for the same records, in the same run.
Usage: python benchmarks/measured_repeat.py [--data PATH ...] [--json] [--per-pair]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from plan_accuracy import ALL_DATA, load_records, record_inputs, shared_gpu_free_bytes  # noqa: E402

from oomguard.diagnose.pipeline import diagnose_text  # noqa: E402
from oomguard.engines.vllm.measured import MeasuredFigures  # noqa: E402
from oomguard.engines.vllm.memory import predict  # noqa: E402
from oomguard.errors import UsageError  # noqa: E402
from oomguard.plan.measured import key_of  # noqa: E402
from oomguard.units import GiB  # noqa: E402


def planned(records: list[dict]) -> dict[str, list[tuple[dict, tuple, object]]]:
    """Records that started and logged their KV budget, grouped by setup key: (record, planner inputs, report)."""
    groups: dict[str, list] = defaultdict(list)
    for r in records:
        if r.get("outcome") != "ok" or r.get("kv_cache_memory_gib") is None or not r.get("raw_excerpt"):
            continue
        try:
            inputs = record_inputs(r)
            model, gpu, cfg, version, gpus, engine = inputs
            report = predict(model, gpu, cfg, version, gpu_count=gpus, engine=engine,
                             free_memory_bytes=shared_gpu_free_bytes(r, gpu))
        except (LookupError, UsageError):
            continue
        groups[key_of(report)].append((r, inputs, report))
    return groups


def same_log(a: dict, b: dict) -> bool:
    """One log file collected twice (the same path at two commits of its repository): not a second start."""
    def path(r: dict) -> str:
        return re.sub(r"/blob/[0-9a-f]{7,40}/", "/blob/-/", r.get("source_url") or r["id"])
    return path(a) == path(b)


def pairs(groups: dict[str, list]) -> list[dict]:
    rows = []
    for members in groups.values():
        for a, _, a_report in members:
            facts = dict(diagnose_text(a["raw_excerpt"], use_planner=False, name=a["id"]).facts)
            figures = MeasuredFigures.from_log_facts(facts, a_report.config["gpu_memory_utilization"], a["id"])
            if figures is None:
                continue
            for b, (model, gpu, cfg, version, gpus, engine), b_report in members:
                if b is a or same_log(a, b):
                    continue
                learnt = predict(model, gpu, cfg, version, gpu_count=gpus, engine=engine, measured=figures,
                                 free_memory_bytes=shared_gpu_free_bytes(b, gpu))
                truth = b["kv_cache_memory_gib"]
                rows.append({"from": a["id"], "to": b["id"], "gpu": b_report.gpu_name,
                             "util_from": a_report.config["gpu_memory_utilization"],
                             "util_to": b_report.config["gpu_memory_utilization"], "truth_gib": truth,
                             "measured_error_gib": round(learnt.first.kv_cache_bytes / GiB - truth, 3),
                             "estimate_error_gib": round(b_report.first.kv_cache_bytes / GiB - truth, 3),
                             "within_range": learnt.kv_cache_low_bytes / GiB <= truth <= learnt.kv_cache_high_bytes / GiB})
    return rows


def summary(rows: list[dict]) -> dict:
    def stats(subset: list[dict]) -> dict:
        out = {"pairs": len(subset), "within_range": sum(r["within_range"] for r in subset)}
        for key in ("measured_error_gib", "estimate_error_gib"):
            errs = sorted(abs(r[key]) for r in subset)
            out[key] = {"median": round(statistics.median(errs), 3), "max": round(errs[-1], 3)} if errs else {}
        return out
    nvidia = [r for r in rows if r["gpu"].startswith("NVIDIA")]
    return {"all": stats(rows), "nvidia": stats(nvidia), "other": stats([r for r in rows if r not in nvidia]),
            "utilization_changed": stats([r for r in rows if r["util_from"] != r["util_to"]])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="+", default=list(ALL_DATA))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--per-pair", action="store_true", help="print every pair")
    args = parser.parse_args(argv)
    rows = pairs(planned(load_records(args.data)))
    result = {"summary": summary(rows), "pairs": rows}
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    if args.per_pair:
        for r in rows:
            print(f"{r['from']:>18} -> {r['to']:<18} {r['gpu'][:24]:24} util {r['util_from']}->{r['util_to']}  "
                  f"KV {r['truth_gib']:7.2f} GiB  measured {r['measured_error_gib']:+.3f}  "
                  f"estimate {r['estimate_error_gib']:+.3f}  {'in range' if r['within_range'] else 'OUT of range'}")
    print(f"{'ordered pairs of starts':34} {'n':>4}  {'|KV error| measured':>22}  {'estimates alone':>18}  in range")
    for name, label in (("all", "all"), ("nvidia", "NVIDIA GPUs"), ("other", "other GPUs (ROCm)"),
                        ("utilization_changed", "utilization differs")):
        g = result["summary"][name]
        m, e = g["measured_error_gib"], g["estimate_error_gib"]
        cell = (lambda d: f"{d['median']:.3f} / {d['max']:.3f}" if d else "-")
        print(f"{label:34} {g['pairs']:>4}  {cell(m):>22}  {cell(e):>18}  {g['within_range']}/{g['pairs']}")
    print("(median / max GiB of |predicted - logged| available KV memory)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
