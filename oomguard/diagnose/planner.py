"""The one place diagnose calls the planner (oomguard.plan.api.predict): check a fix, rewrite the serve line,
and compare what the log measured with what the planner predicts.

Everything here degrades: no model, a model outside the catalog, an unknown GPU or a planner error gives a note
("planner unavailable for this model: ...") and the text-derived fixes stand.
"""

from __future__ import annotations

from collections.abc import Mapping

import shlex

from oomguard.diagnose.model import Finding, Fix
from oomguard.failures import FailureClass
from oomguard.models.resolve import quant_from_name, stated_parameters

# facts measured in the log -> the planner's to_dict() key, and the tolerance before we call it a difference
_COMPARE = (("weights_gib", "weights_gib", 0.05), ("activation_peak_gib", "activation_peak_gib", 0.25),
            ("non_torch_gib", "non_torch_gib", 0.5), ("cuda_graph_gib", "cuda_graph_gib", 0.5),
            ("available_kv_gib", "kv_cache_gib", 0.1), ("kv_cache_tokens", "kv_cache_tokens", 0.1),
            ("num_gpu_blocks", "num_gpu_blocks", 0.1), ("max_concurrency", "max_concurrency", 0.1))
_MEMORY_CLASSES = {FailureClass.KV_CACHE_TOO_SMALL, FailureClass.NO_CACHE_BLOCKS, FailureClass.GPU_MEMORY_IN_USE,
                   FailureClass.OOM_WEIGHTS_LOAD, FailureClass.OOM_PROFILING_OR_GRAPH, FailureClass.OOM_RUNTIME}


def engine_flags(facts: dict) -> dict:
    """The user's vLLM engine settings from the log's non-default args (vLLM dest names)."""
    from oomguard.engines.vllm.flags import ENGINE_DESTS
    args = facts.get("non_default_args") or {}
    flags = {k: v for k, v in args.items() if k in ENGINE_DESTS and v is not None}
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "gpu_memory_utilization",
                "max_num_seqs", "max_num_batched_tokens", "enforce_eager", "kv_cache_dtype", "quantization", "dtype"):
        if key not in flags and facts.get(key) is not None and key in ENGINE_DESTS:
            flags[key] = facts[key]
    if flags.get("quantization") in ("None", None):
        flags.pop("quantization", None)
    if flags.get("dtype") in ("auto",):
        flags.pop("dtype", None)
    for key in ("dtype",):
        if isinstance(flags.get(key), str) and flags[key].startswith("torch."):
            flags[key] = flags[key][6:]
    return flags


def _extra_args(facts: dict) -> list[str]:
    """Non-engine flags from the log (--port, --trust-remote-code ...) so the rewritten line stays complete."""
    from oomguard.engines.vllm.flags import ENGINE_DESTS
    out: list[str] = []
    skip = {"model", "model_tag", "dispatch_function", "subparser", "func"}
    for key, value in (facts.get("non_default_args") or {}).items():
        if key in ENGINE_DESTS or key in skip or value is None or value is False or isinstance(value, (dict, list)):
            continue
        option = "--" + key.replace("_", "-")
        out += [option] if value is True else [option, shlex.quote(str(value))]
    return out


def _flag_dest(fix: Fix) -> str | None:
    if not fix.flag or not fix.flag.startswith("--"):
        return None
    from oomguard.engines.vllm.flags import FLAGS
    for flag in FLAGS:
        if fix.flag in flag.options:
            return flag.dest
    return None


def serve_line(model: str, flags: dict, facts: dict, env: dict | None = None, extra: list[str] | None = None) -> str:
    from oomguard.engines.vllm.flags import format_vllm_command
    line = format_vllm_command(model, flags)
    tail = _extra_args(facts)
    given = {w.split("=", 1)[0] for w in tail if w.startswith("-")}
    skip = False
    for word in extra or []:  # the user's own options oomguard does not model, unless the log already gave them
        if word.startswith("-"):
            skip = word.split("=", 1)[0] in given
        if not skip:
            tail.append(shlex.quote(word) if not word.startswith("-") else word)
    prefix = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items())
    return (prefix + " " if prefix else "") + line + (" " + " ".join(tail) if tail else "")


def _gpu_args(facts: dict) -> dict:
    """predict()'s GPU arguments from what the log shows: a catalog name, else the total memory CUDA reported."""
    name = facts.get("gpu_name")
    if name:
        try:
            from oomguard.gpus.catalog import resolve_gpu
            return {"gpu": resolve_gpu(name)}
        except Exception:
            pass
    total = facts.get("total_gpu_memory_gib")
    if total:
        return {"gpu": None, "gpu_memory_gib": float(total)}
    raise LookupError("the log shows neither the GPU model nor its memory")


def _predict(model: str, facts: dict, flags: dict):
    from oomguard.plan.api import predict
    gpu = _gpu_args(facts)
    world = int(flags.get("tensor_parallel_size") or 1) * int(flags.get("pipeline_parallel_size") or 1)
    return predict(model, gpu.pop("gpu"), gpu_count=max(world, int(facts.get("gpu_count") or 1)),
                   vllm_version=facts.get("vllm_version"), flags=flags, **gpu)


def planned_weights_gib(facts: Mapping, total_gib: float | None) -> float | None:
    """The planner's weights per GPU for the model, precision and parallelism the log shows (None: the log names no
    model the planner knows offline, runs another engine's checkpoint format, or offloads weights to the CPU)."""
    model = facts.get("model")
    if not model or not total_gib or facts.get("engine") in ("llamacpp", "ollama") or facts.get("cpu_offload_gb"):
        return None
    flags = {k: v for k, v in engine_flags(facts).items()
             if k in ("tensor_parallel_size", "pipeline_parallel_size", "dtype", "quantization")}
    world = int(flags.get("tensor_parallel_size") or 1) * int(flags.get("pipeline_parallel_size") or 1)
    from oomguard.plan.api import predict
    for version in dict.fromkeys((facts.get("vllm_version"), None)):   # a build string it cannot read: the newest
        try:
            report = predict(str(model), None, gpu_count=world, vllm_version=version, flags=flags,
                             gpu_memory_gib=float(total_gib))
        except Exception:   # a model the planner cannot read: the text alone places the error
            continue
        return report.first.weights_bytes / 2**30
    return _weights_from_name(str(model), flags, world)


def _weights_from_name(model: str, flags: dict, world: int) -> float | None:
    """A model the planner cannot read whose name states its size ("baichuan-13b"): the weights at the low end of
    what that rounded size allows (5% fewer parameters), at the precision its name, --quantization or --dtype gives."""
    params, quant = stated_parameters(model), quant_from_name(model)
    if not params or (flags.get("quantization") and not quant):   # a quantization the name does not say: unknown
        return None
    per = quant.bytes_per_param() if quant else 4 if flags.get("dtype") in ("float32", "float") else 2
    return 0.95 * params * per / world / 2**30


def advise(finding: Finding, facts: Mapping, command: dict | None = None, use_planner: bool = True) -> dict:
    """Rewrite the user's serve line with the finding's first applicable fix, checked with the planner when it can.

    Adds `finding.command` and notes; returns the facts it learned: "planner" (status) and "comparison" (measured vs
    predicted).
    """
    learned: dict = {}
    model = (command or {}).get("model") or facts.get("model")
    if not model or facts.get("engine", "vllm") != "vllm":
        return learned
    flags = engine_flags(facts)
    flags.update((command or {}).get("flags", {}))
    fix_flags = [(f, _flag_dest(f)) for f in finding.fixes]
    env = {f.flag: f.value for f in finding.fixes if f.flag and not f.flag.startswith("-") and f.flag.isupper()}

    status, report_now, chosen = None, None, None
    if use_planner:
        try:
            report_now = _predict(model, facts, flags)
            learned["planner"] = "ok"
            learned.update(_compare(report_now, facts))
        except Exception as exc:  # the planner is optional here: say why and keep the text-derived fixes
            status = f"planner unavailable for this model: {_reason(exc)}"
            learned["planner"] = status

    candidates = [(fix, dest) for fix, dest in fix_flags if dest]
    if report_now is not None and finding.cls in _MEMORY_CLASSES:
        for fix, dest in candidates:
            trial = dict(flags, **{dest: fix.value})
            try:
                report = _predict(model, facts, trial)
            except Exception:
                continue
            if report.starts:
                chosen = (fix, dest, report)
                break
        if chosen is None and finding.cls == FailureClass.KV_CACHE_TOO_SMALL and report_now.estimated_max_model_len:
            est = report_now.estimated_max_model_len
            fix = Fix("the planner's estimate of the longest context that fits", "--max-model-len", int(est))
            finding.fixes.insert(0, fix)
            chosen = (fix, "max_model_len", None)
    if chosen is None and candidates:
        chosen = (candidates[0][0], candidates[0][1], None)
        if report_now is not None and finding.cls in _MEMORY_CLASSES:
            fix = candidates[0][0]
            try:
                trial = _predict(model, facts, dict(flags, **{candidates[0][1]: fix.value}))
                why = trial.error or "it predicts a start"
            except Exception as exc:
                why = _reason(exc)
            finding.notes.append(f"planner: {fix.render()} alone does not make vLLM start: {why}")

    if chosen is not None:
        fix, dest, report = chosen
        new_flags = dict(flags, **{dest: fix.value})
        first_env = {k: v for k, v in env.items() if finding.fixes and finding.fixes[0].flag == k}
        finding.command = serve_line(model, new_flags, facts, first_env, (command or {}).get("extra"))
        if report is not None:
            version = f" {facts['vllm_version']}" if facts.get("vllm_version") else ""
            finding.notes.append(f"planner: with {fix.render()} vLLM{version} starts; "
                                 f"KV cache {report.kv_cache_tokens:,} tokens, max concurrency "
                                 f"{report.max_concurrency:.2f}x at {report.max_model_len:,} tokens")
    elif env and finding.fixes and finding.fixes[0].flag in env:
        first = finding.fixes[0]
        finding.command = serve_line(model, flags, facts, {first.flag: first.value}, (command or {}).get("extra"))
    if status:
        finding.notes.append(status)
    return learned


def _reason(exc: Exception) -> str:
    text = str(exc).split("\n")[0]
    return (text[:160] + "...") if len(text) > 160 else (text or type(exc).__name__)


def _compare(report, facts: Mapping) -> dict:
    predicted = report.to_dict()
    rows = []
    for measured_key, predicted_key, tolerance in _COMPARE:
        measured, guess = facts.get(measured_key), predicted.get(predicted_key)
        if not isinstance(measured, (int, float)) or not isinstance(guess, (int, float)):
            continue
        base = max(abs(measured), abs(guess), 1e-9)
        differs = abs(measured - guess) / base > tolerance and abs(measured - guess) > 0.05
        rows.append({"what": measured_key, "measured": measured, "predicted": round(guess, 2) if isinstance(
            guess, float) else guess, "differs": differs})
    return {"comparison": rows} if rows else {}
