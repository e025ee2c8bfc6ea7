"""After the engine started: what it printed about its own memory, kept in the state directory per setup (model,
GPU, vLLM release, settings; plan/measured.py) so that the next `plan` and `serve` of that setup use the measured
figures instead of the estimates."""

from __future__ import annotations

import time

from .engine import EngineCommand
from .plancheck import planned


def learn(cmd: EngineCommand, scanner, gpu: str | None, vllm_version: str | None,
          state_dir: str | None) -> tuple[str, dict]:
    """Keep the figures of a start, from the diagnose Scanner that read its output; returns the event to log:
    ("figures_kept" | "figures_not_kept", its fields)."""
    from oomguard.diagnose.facts import build
    from oomguard.engines.vllm.measured import MeasuredFigures
    from oomguard.engines.vllm.memory import predict
    from oomguard.engines.vllm.versions import parse_version
    from oomguard.plan.measured import MeasuredStore, key_of, setup_of

    if scanner is None:
        return "figures_not_kept", {"reason": "the engine printed nothing"}
    facts = dict(build(scanner.facts.get("_raw", {}), scanner.engines)[0])
    ran = facts.get("vllm_version")       # the release that ran, as it says, over --vllm-version
    try:
        version = str(ran) if ran and parse_version(str(ran)) else vllm_version
    except ValueError:
        version = vllm_version
    p = planned(cmd, gpu, version)
    if p.why_not:
        return "figures_not_kept", {"reason": p.why_not}
    report = predict(p.model, p.gpu, p.cfg, p.version, gpu_count=p.gpus)
    figures = MeasuredFigures.from_log_facts(facts, report.config["gpu_memory_utilization"],
                                             time.strftime("%Y-%m-%d %H:%M:%S"))
    if figures is None:
        return "figures_not_kept", {"reason": "the engine's log states no weights figure"}
    key = key_of(report)
    MeasuredStore(state_dir).put(key, setup_of(report), figures)
    return "figures_kept", {"setup": key, "model": report.model_id, "gpu": report.gpu_name,
                            "vllm_version": report.vllm_version, "figures": figures.to_dict()}
