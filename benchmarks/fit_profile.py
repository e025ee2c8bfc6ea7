"""Fit the coefficients of oomguard/engines/vllm/profile.py on real vLLM startups, by least squares.

profile.py models what vLLM measures rather than computes (activation peak, non-torch memory, memory in use
before vLLM starts, the CUDA-graph pool). Every one of those figures is linear in its coefficients, or (the
activation peak) the larger of two linear candidates, so the fit needs no solver library:
  - design rows come from profile.py's own functions, evaluated with one coefficient at 1 and the others at 0,
    so the fit always has the shape the planner uses;
  - one linear least-squares problem per figure, solved by its normal equations;
  - for the activation peak, max(forward, sampler), every assignment of records to a branch is solved and the
    coefficients with the smallest true squared error are kept (the global least-squares optimum).
Inputs per record are what the log showed (settings, model, GPU, version), as in plan_accuracy.py.
Usage: python benchmarks/fit_profile.py [--data PATH] [--json] [--write]
  --write  puts the fitted values, to 3 significant figures, into profile.py (after adding records or models)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from plan_accuracy import (ALL_DATA, contradicts_budget, disturbed, experts_across_gpus, is_fork,  # noqa: E402
                           load_records, logged_stage, record_inputs)

from oomguard.engines.vllm import profile  # noqa: E402
from oomguard.engines.vllm.memory import predict  # noqa: E402
from oomguard.engines.vllm.platform import platform_of  # noqa: E402
from oomguard.engines.vllm.releases import release  # noqa: E402
from oomguard.engines.vllm.versions import parse_version  # noqa: E402
from oomguard.engines.vllm.weights import padded_vocab  # noqa: E402
from oomguard.errors import UsageError  # noqa: E402
from oomguard.gpus.catalog import resolve_gpu  # noqa: E402
from oomguard.models.spec import DTYPE_BYTES  # noqa: E402
from oomguard.units import GiB  # noqa: E402

# figure -> (record field, the coefficients it depends on)
GROUPS = {
    "activation_peak": ("activation_peak_gib", ("forward_bytes_per_hidden", "forward_bytes_per_inter")),
    "non_torch": ("non_torch_gib", ("non_torch_single_gib", "non_torch_single_early_gib", "non_torch_tp_gib",
                                    "non_torch_pp_only_gib",
                                    "non_torch_v0_gib", "non_torch_v06_gib")),
    "start_used": ("gpu_total_memory_gib - gpu_free_at_start_gib", ("context_gib", "nccl_init_gib")),
    "cuda_graph": ("cuda_graph_gib", ("graph_base_gib", "graph_per_layer_gib", "graph_per_layer_tp_gib",
                                      "graph_moe_gib_per_m")),
    "cuda_graph_estimate": ("cuda_graph_estimated_gib", ("graph_est_base_gib", "graph_est_per_layer_gib",
                                                         "graph_est_per_layer_tp_gib", "graph_est_moe_gib_per_m")),
}
MAX_BRANCH_GROUPS = 16  # exhaustive branch search up to 2^16 assignments (more: alternating assignment)
LOG_NOISE_GIB = 0.05    # vLLM prints these figures to 0.01 GiB, and identical runs differ by a few hundredths
PROFILE_PY = ROOT / "oomguard" / "engines" / "vllm" / "profile.py"


@dataclass(frozen=True)
class Observation:
    """One measured figure of one record: target = max over candidates of (const + sum(row[f] * coefficient f))."""

    record: str
    group: str
    target_gib: float
    candidates: tuple[tuple[float, tuple[float, ...]], ...]   # (const GiB, GiB per unit of each coefficient)

    def predict(self, beta: tuple[float, ...]) -> float:
        return max(const + sum(r * b for r, b in zip(row, beta)) for const, row in self.candidates)

    def active(self, beta: tuple[float, ...]) -> tuple[float, tuple[float, ...]]:
        """The candidate that is the larger under `beta`."""
        return max(self.candidates, key=lambda c: c[0] + sum(r * b for r, b in zip(c[1], beta)))


def linearize(fn, names: tuple[str, ...], base: profile.ProfileCoefficients = profile.COEFFICIENTS):
    """fn(coefficients) -> bytes, known to be linear in `names`: its constant and per-coefficient slope, in GiB."""
    zero = replace(base, **{n: 0.0 for n in names})
    const = fn(zero)
    return const / GiB, tuple((fn(replace(zero, **{n: 1.0})) - const) / GiB for n in names)


def linearize_many(fn, names: tuple[str, ...]):
    """Like linearize, for a function returning a tuple of candidates (the activation peak's two branches)."""
    zero = replace(profile.COEFFICIENTS, **{n: 0.0 for n in names})
    consts = fn(zero)
    slopes = [fn(replace(zero, **{n: 1.0})) for n in names]
    return tuple((c / GiB, tuple((s[i] - c) / GiB for s in slopes)) for i, c in enumerate(consts))


def _version_and_engine(r: dict):
    if not r.get("vllm_version") or is_fork(r):
        return None
    try:
        version = parse_version(r["vllm_version"])
    except UsageError:
        return None
    return version, r.get("engine") or release(version).default_engine


def _gpu(r: dict):
    try:
        return resolve_gpu(r.get("gpu_model") or "")
    except UsageError:
        return None


def _planned(r: dict):
    """(model, GPU, the planner's report) for a record, or None where the catalog lacks its model or GPU."""
    try:
        model, gpu, cfg, version, gpus, engine = record_inputs(r)
        return model, gpu, predict(model, gpu, cfg, version, gpu_count=gpus, engine=engine)
    except (LookupError, UsageError):
        return None


def fusion_workspace(planned, version, tp: int, pp: int, gpu, graphs: bool) -> int | None:
    """FlashInfer's fusion workspace in a record's non-torch figure, computed from source (None: it depends on a model
    the catalog lacks)."""
    if tp <= 1 or gpu is None or gpu.interconnect != "nvlink":   # no workspace: no model needed
        return 0
    if planned is None:
        return None
    model, _, report = planned
    c = report.config
    return profile.allreduce_fusion_workspace_bytes(version, tp, pp, model.hidden_size, DTYPE_BYTES[c["dtype"]],
                                                    c["max_num_batched_tokens"], gpu, graphs)


def observations(records: list[dict]) -> list[Observation]:
    """Every figure the records measured that profile.py models, with its design (no measured figure is an input)."""
    obs: list[Observation] = []
    for r in records:
        ve = _version_and_engine(r)
        if ve is None or disturbed(r) or contradicts_budget(r) or experts_across_gpus(r):
            continue
        version, engine = ve
        tp, pp = r.get("tensor_parallel_size") or 1, r.get("pipeline_parallel_size") or 1
        gpu = _gpu(r)
        if gpu and platform_of(gpu).rocm:   # these coefficients are CUDA's; ROCm's own fit is fit_rocm.py
            continue
        link, cc = (gpu.interconnect, gpu.compute_capability) if gpu else ("nvlink", (9, 0))
        graphs = not r.get("enforce_eager")
        planned = _planned(r)
        if r.get("non_torch_gib") is not None and (gpu or tp == 1):  # layout, version, GPU (and the fusion workspace)
            workspace = fusion_workspace(planned, version, tp, pp, gpu, graphs)
            if workspace is not None:
                names = GROUPS["non_torch"][1]
                obs.append(Observation(r["id"], "non_torch", r["non_torch_gib"], (linearize(
                    lambda c: profile.non_torch_bytes(engine, version, tp, pp, c, link, cc, graphs=graphs,
                                                      fusion_workspace=workspace), names),)))
        # on unified memory (GB10) the OS's own use shows as used GPU memory, and a start refused because memory was
        # in use measures another process: neither is the CUDA context this models
        if r.get("gpu_total_memory_gib") and r.get("gpu_free_at_start_gib") and not (gpu and gpu.unified_memory) \
                and r.get("error_kind") != "gpu_memory_in_use":
            names = GROUPS["start_used"][1]
            used = r["gpu_total_memory_gib"] - r["gpu_free_at_start_gib"]
            obs.append(Observation(r["id"], "start_used", used, (linearize(
                lambda c: profile.start_used_bytes(engine, version, tp * pp, c, link), names),)))
        if engine != "v1" or planned is None:  # the activation and graph shapes are V1's (sampler run, graph pool)
            continue
        model, gpu, report = planned
        c = report.config
        stage = min(logged_stage(r), pp - 1)
        layers = report.workers[stage].layers
        act_bytes = DTYPE_BYTES[c["dtype"]]
        tokens, reqs = c["max_num_batched_tokens"], min(c["max_num_seqs"], c["max_num_batched_tokens"])
        # a vision model's profile run also runs its encoder over dummy images, which profile.py does not model yet:
        # fitting the text forward pass to those peaks would bend it for every text model
        if r.get("activation_peak_gib") is not None and model.vision is None:
            names = GROUPS["activation_peak"][1]
            obs.append(Observation(r["id"], "activation_peak", r["activation_peak_gib"], linearize_many(
                lambda co: profile.activation_candidates(model, tokens, reqs, padded_vocab(model.vocab_size), tp, pp,
                                                         stage == pp - 1, act_bytes, version, gpu.multiprocessors,
                                                         co, runner_v2=c["model_runner"] == "v2"), names)))
        shape = profile.GraphShape.of(version, c["max_num_seqs"], tokens, gpu.compute_capability,
                                      performance_mode=c["performance_mode"])
        # "Graph capturing finished" is a net free-memory delta only from 0.18 (synchronize and empty_cache first)
        if r.get("cuda_graph_gib") is not None and not c["enforce_eager"] and release(version).graph_pool_measured:
            names = GROUPS["cuda_graph"][1]
            obs.append(Observation(r["id"], "cuda_graph", r["cuda_graph_gib"], (linearize(
                lambda co: profile.cuda_graph_bytes(model, layers, False, co, tp, shape), names),)))
        if r.get("cuda_graph_estimated_gib") is not None and not c["enforce_eager"]:
            names = GROUPS["cuda_graph_estimate"][1]
            obs.append(Observation(r["id"], "cuda_graph_estimate", r["cuda_graph_estimated_gib"], (linearize(
                lambda co: profile.cuda_graph_estimate_bytes(model, layers, False, co, tp, shape), names),)))
    return obs


def _solve_subset(a: list[list[float]], b: list[float], free: tuple[int, ...]) -> list[float] | None:
    """Solve the normal equations restricted to the `free` coefficients (the others held at 0)."""
    m = [[a[i][j] for j in free] + [b[i]] for i in free]
    n = len(free)
    for col in range(n):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, n), key=lambda i: abs(m[i][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None  # the records do not determine these coefficients
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(n):
            if i != col:
                f = m[i][col] / m[col][col]
                m[i] = [x - f * y for x, y in zip(m[i], m[col])]
    beta = [0.0] * len(b)
    for idx, i in enumerate(free):
        beta[i] = m[idx][n] / m[idx][idx]
    return beta


def solve(rows: list[tuple[float, ...]], targets: list[float]) -> tuple[float, ...] | None:
    """Non-negative least squares (every coefficient here is a size: bytes, GiB), exactly, by active sets.

    The unconstrained normal-equation solution when it is non-negative; otherwise the best solution with some
    coefficients held at 0. Coefficients no row informs stay at 0. None when nothing is determined."""
    k = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * t for r, t in zip(rows, targets)) for i in range(k)]
    tt = sum(t * t for t in targets)
    informed = tuple(i for i in range(k) if a[i][i] > 0)
    best, best_sse = None, float("inf")
    for size in range(len(informed), 0, -1):
        for free in itertools.combinations(informed, size):
            beta = _solve_subset(a, b, free)
            if beta is None or min(beta) < 0:
                continue
            err = tt - 2 * sum(x * y for x, y in zip(beta, b)) + sum(
                beta[i] * a[i][j] * beta[j] for i in range(k) for j in range(k))
            if err < best_sse - 1e-15:
                best, best_sse = beta, err
        if best is not None and size == len(informed):
            break  # the unconstrained optimum is feasible: it is the answer
    return None if best is None else tuple(best)


def sse(obs: list[Observation], beta: tuple[float, ...]) -> float:
    return sum((o.target_gib - o.predict(beta)) ** 2 for o in obs)


def fit_group(obs: list[Observation]) -> tuple[float, ...]:
    """Least squares of max-of-linear candidates: solve every branch assignment, keep the best true fit."""
    branchy: dict[tuple, list[Observation]] = {}  # identical candidate sets take the same branch
    for o in obs:
        if len(o.candidates) > 1:
            branchy.setdefault(o.candidates, []).append(o)
    keys = list(branchy)
    if len(keys) > MAX_BRANCH_GROUPS:
        return _fit_alternating(obs)
    best, best_sse = None, float("inf")
    for choice in itertools.product(*(range(len(k)) for k in keys)):
        picked = dict(zip(keys, choice))
        rows, targets = [], []
        for o in obs:
            const, row = o.candidates[picked.get(o.candidates, 0)]
            rows.append(row)
            targets.append(o.target_gib - const)
        beta = solve(rows, targets)
        if beta is None:
            continue
        err = sse(obs, beta)
        if err < best_sse - 1e-15:
            best, best_sse = beta, err
    if best is None:
        raise ValueError("no branch assignment gives a determined fit")
    return best


def _fit_alternating(obs: list[Observation], rounds: int = 50) -> tuple[float, ...]:
    """Too many two-branch records for the exhaustive search: assign each to the branch the current fit makes the
    larger, refit, and repeat until the assignment stops changing (a local optimum, started from profile.py)."""
    names = GROUPS[obs[0].group][1]
    beta = tuple(getattr(profile.COEFFICIENTS, n) for n in names)
    for _ in range(rounds):
        rows, targets, picks = [], [], []
        for o in obs:
            pick = max(range(len(o.candidates)),
                       key=lambda i: o.candidates[i][0] + sum(r * b for r, b in zip(o.candidates[i][1], beta)))
            const, row = o.candidates[pick]
            rows.append(row)
            targets.append(o.target_gib - const)
            picks.append(pick)
        new = solve(rows, targets)
        if new is None or new == beta:
            break
        beta = new
    return beta


def fit(records: list[dict]) -> dict:
    """Fitted coefficients, per group: the values, and each observation with its residuals (fitted and shipped)."""
    obs = observations(records)
    shipped = asdict(profile.COEFFICIENTS)
    out = {"coefficients": {}, "groups": {}}
    for group, (field, names) in GROUPS.items():
        group_obs = [o for o in obs if o.group == group]
        if not group_obs:
            continue
        beta = fit_group(group_obs)
        # a coefficient is informed when some record's larger candidate (the branch the fit uses) depends on it
        informed = [any(o.active(beta)[1][i] for o in group_obs) for i in range(len(names))]
        if all(n in profile.SOURCE_PRIORS for n in names):
            prior = tuple(profile.SOURCE_PRIORS[n] for n in names)
            # the records must earn each fitted coefficient (AIC): what the code says stays unless fitting buys
            # more than 2 x the logs' rounding noise squared per coefficient it frees
            if sse(group_obs, prior) - sse(group_obs, beta) < 2 * sum(informed) * LOG_NOISE_GIB ** 2:
                informed = [False] * len(names)
        ship = tuple(shipped[n] for n in names)
        for n, b, used in zip(names, beta, informed):
            out["coefficients"][n] = {"fitted": b if used else None, "shipped": shipped[n]}
        targets = [o.target_gib for o in group_obs]
        fitted = [o.predict(beta) for o in group_obs]
        mean = statistics.fmean(targets)
        sst = sum((t - mean) ** 2 for t in targets)
        out["groups"][group] = {
            "figure": field, "n": len(group_obs),
            "fitted": _summary([abs(p - t) for p, t in zip(fitted, targets)], sse(group_obs, beta), sst),
            "shipped": _summary([abs(o.predict(ship) - o.target_gib) for o in group_obs], sse(group_obs, ship), sst),
            "records": [{"id": o.record, "measured": o.target_gib, "fitted": f, "shipped": o.predict(ship)}
                        for o, f in zip(group_obs, fitted)],
        }
    return out


def _summary(errors: list[float], sse_: float, sst: float) -> dict:
    s = sorted(errors)
    k = (len(s) - 1) * 0.9
    p90 = s[int(k)] + (s[min(int(k) + 1, len(s) - 1)] - s[int(k)]) * (k - int(k))
    return {"median_abs_gib": statistics.median(s), "p90_abs_gib": p90,
            "r2": 1 - sse_ / sst if sst > 1e-12 else None}


def rounded(value: float, digits: int = 3) -> float:
    """What profile.py ships for a fitted value: `digits` significant figures."""
    return 0.0 if value == 0 else round(value, digits - 1 - math.floor(math.log10(abs(value))))


def write_profile(result: dict, path: Path = PROFILE_PY) -> list[str]:
    """Put the fitted coefficients (rounded) into ProfileCoefficients' defaults; returns the lines changed."""
    text = path.read_text()
    changed = []
    for name, v in result["coefficients"].items():
        if v["fitted"] is None:
            continue
        new = rounded(v["fitted"])
        text, n = re.subn(rf"^(    {name}: float = )[-+0-9.e]+", lambda m: f"{m.group(1)}{new!r}", text, flags=re.M)
        if n != 1:
            raise ValueError(f"{name} not found once in {path.name}")
        if new != v["shipped"]:
            changed.append(f"{name}: {v['shipped']} -> {new}")
    path.write_text(text)
    return changed


def load(data: Path | list[Path]) -> list[dict]:
    """Startup records of the files, with the dated versions of benchmarks/data/startup_logs/inferred_versions.json."""
    return load_records(data if isinstance(data, list) else [data])


def print_report(result: dict) -> None:
    print("| coefficient | fitted | shipped (profile.py) | difference |")
    print("|---|---|---|---|")
    for n, v in result["coefficients"].items():
        f = v["fitted"]
        fitted = "not informed" if f is None else f"{f:.4g}"
        diff = "" if f is None else f"{v['shipped'] - f:+.3g}" if f == 0 else f"{(v['shipped'] - f) / abs(f):+.1%}"
        print(f"| {n} | {fitted} | {v['shipped']:.4g} | {diff} |")
    print("\n| figure | n | fitted median / p90 abs (GiB) | fitted R^2 | shipped median / p90 abs (GiB) "
          "| shipped R^2 |")
    print("|---|---|---|---|---|---|")
    for group, g in result["groups"].items():
        f, s = g["fitted"], g["shipped"]
        r2 = [("-" if x["r2"] is None else f"{x['r2']:.3f}") for x in (f, s)]
        print(f"| {g['figure']} | {g['n']} | {f['median_abs_gib']:.3f} / {f['p90_abs_gib']:.3f} | {r2[0]} | "
              f"{s['median_abs_gib']:.3f} / {s['p90_abs_gib']:.3f} | {r2[1]} |")
    for group, g in result["groups"].items():
        print(f"\n{g['figure']}: record, measured, fitted (residual), shipped (residual), GiB")
        for r in g["records"]:
            print(f"  {r['id']:18} {r['measured']:7.3f} {r['fitted']:7.3f} ({r['fitted'] - r['measured']:+.3f}) "
                  f"{r['shipped']:7.3f} ({r['shipped'] - r['measured']:+.3f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="+", default=list(ALL_DATA),
                        help="startup-log JSONL files (default: shared/data, its batch2/ and benchmarks/data/)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true", help="write the fitted values into profile.py")
    args = parser.parse_args(argv)
    if not any(p.is_file() for p in args.data):
        print(f"no data at {', '.join(map(str, args.data))}: pass --data PATH to vllm_startup_logs.jsonl",
              file=sys.stderr)
        return 2
    result = fit(load(args.data))
    if args.write:
        for line in write_profile(result) or ["profile.py already holds the fitted values"]:
            print(line, file=sys.stderr)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
