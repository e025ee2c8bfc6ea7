"""How fast `oomguard plan ... --p99-tokens` answers (issue 3: under a second for a 70B model on 8 GPUs).

Measures, in one run on this machine:
  * the whole command, end to end in a fresh process (interpreter start, imports, catalog, search, output),
    for a workload that fits and for one that fits nowhere (the tiering path searches much more);
  * the search alone in-process, and the memory model's evaluations per second;
  * `oomguard --help` for scale (the floor any command pays for starting Python).
Each figure is the median of --repeat runs; the ratio column is the figure over the 1 s target.

    python benchmarks/plan_search_speed.py [--repeat 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

TARGET_S = 1.0
FITS = ["plan", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h100", "--gpu-count", "8", "--p99-tokens", "7400",
        "--peak-concurrency", "32", "--json"]
NO_FIT = ["plan", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "a100-40gb", "--gpu-count", "8", "--p99-tokens",
          "131072", "--peak-concurrency", "64", "--json"]


def _cli_seconds(args: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "oomguard", *args], capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _in_process(repeat: int) -> tuple[float, float, int]:
    from oomguard.engines.vllm.versions import NEWEST
    from oomguard.gpus.catalog import resolve_gpu
    from oomguard.models.load import from_catalog
    from oomguard.models.variants import precision_variants
    from oomguard.plan.search import search
    from oomguard.plan.workload import Workload

    model = from_catalog("meta-llama/Llama-3.1-70B-Instruct")
    variants = precision_variants(model)
    gpu = resolve_gpu("h100")
    times, evaluations = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        result = search(model, gpu, 8, Workload(7400, 32), NEWEST, variants=variants)
        times.append(time.perf_counter() - start)
        evaluations = result.evaluations
    median = statistics.median(times)
    return median, evaluations / median, evaluations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    help_s = _cli_seconds(["--help"], args.repeat)
    fits_s = _cli_seconds(FITS, args.repeat)
    nofit_s = _cli_seconds(NO_FIT, args.repeat)
    search_s, per_s, evaluations = _in_process(args.repeat)
    rows = [
        ("oomguard --help (Python start + CLI)", help_s),
        ("plan 70B, 8 x H100, workload that fits (whole command)", fits_s),
        ("plan 70B, 8 x A100-40GB, nothing fits: tiering (whole command)", nofit_s),
        (f"search alone, in process ({evaluations} evaluations)", search_s),
    ]
    print(f"{'measurement':66} {'median s':>9} {'/ 1 s target':>13}")
    for label, seconds in rows:
        print(f"{label:66} {seconds:9.3f} {seconds / TARGET_S:12.2f}x")
    print(f"memory-model evaluations per second: {per_s:,.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target_s": TARGET_S, "rows": dict(rows), "evaluations_per_s": per_s}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
