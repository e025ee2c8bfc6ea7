"""The planner's word on a vLLM command before serve launches it: starts as given, starts after the nearest change
(oomguard/plan/nearest.py), or cannot start. Where the model or GPU is unknown offline, serve launches unplanned and
says so."""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.errors import UsageError

from .engine import EngineCommand


@dataclass(frozen=True)
class PlanCheck:
    verdict: str                 # "starts" | "adjusted" | "fails" | "unplanned"
    changes: dict                # for "adjusted"
    note: str


def check(cmd: EngineCommand, gpu: str | None, vllm_version: str | None) -> PlanCheck:
    if not cmd.is_vllm_like:
        return PlanCheck("unplanned", {}, "the planner models vLLM; llama-server is launched as given")
    if "--num-gpu-blocks" in cmd.extra or any(w.startswith("--num-gpu-blocks") for w in cmd.extra):
        return PlanCheck("unplanned", {}, "the simulator's KV cache is given (--num-gpu-blocks)")
    from oomguard.engines.vllm.memory import predict
    from oomguard.engines.vllm.versions import NEWEST, parse_version
    from oomguard.plan.api import engine_config, resolve_gpu, resolve_model
    from oomguard.plan.nearest import nearest_start
    try:
        model = resolve_model(cmd.model)
    except (UsageError, OSError, ValueError) as exc:
        return PlanCheck("unplanned", {}, f"model not planned offline: {exc}")
    try:
        gpu_spec = resolve_gpu(gpu)
    except UsageError as exc:
        return PlanCheck("unplanned", {}, f"GPU unknown: {exc}")
    version = parse_version(vllm_version) if vllm_version else NEWEST
    cfg = engine_config(cmd.flags)     # a UsageError here is a bad flag: the caller refuses
    gpus = (cfg.tensor_parallel_size or 1) * (cfg.pipeline_parallel_size or 1) * (cfg.data_parallel_size or 1)
    report = predict(model, gpu_spec, cfg, version, gpu_count=gpus)
    if report.verdict == "starts":
        return PlanCheck("starts", {}, f"planned: starts on {gpu_spec.name} "
                                       f"(KV cache {report.kv_cache_tokens} tokens)")
    near = nearest_start(model, gpu_spec, cfg, version, gpus, report)
    if near is None:
        return PlanCheck("fails", {}, f"vLLM would not start ({report.verdict}): {report.error or 'at risk'}; "
                                      "no nearby configuration starts")
    said = ", ".join(f"{k}={v}" for k, v in near.changes.items())
    return PlanCheck("adjusted", dict(near.changes), f"planned: as given it {report.verdict.replace('_', ' ')} "
                                                     f"({report.error or 'at risk'}); adjusted: {said}")
