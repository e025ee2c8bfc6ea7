"""The one shell of oomguard/deploy: a target's document as YAML, under a comment header that says where each
number comes from. PyYAML is imported here, when a manifest is written, never on the CLI's import path."""

from __future__ import annotations

from types import ModuleType

from oomguard.deploy import epp, kserve, llmd, prodstack, ray
from oomguard.deploy.spec import (ENGINE_START_SECONDS, KV_SAFETY_MARGIN, LOAD_BYTES_PER_SECOND,
                                  PROBE_PERIOD_SECONDS, Deployment)
from oomguard.units import GiB

# --format value -> the target's module (each has DESCRIPTION, document(d) and notes(d))
TARGETS: dict[str, ModuleType] = {"kserve": kserve, "llmd": llmd, "prodstack": prodstack, "ray": ray, "epp": epp}
FORMATS = tuple(TARGETS)


def document(fmt: str, d: Deployment) -> dict:
    return TARGETS[fmt].document(d)


def summary(d: Deployment, probe: bool) -> list[str]:
    """What the plan gave the manifest, one line a figure (`probe`: the target has a startup probe)."""
    per_node = d.weights_bytes / d.nodes / GiB
    lines = [
        f"vLLM {d.vllm_version}; one replica = {d.nodes} node(s) x {d.gpus_per_node} GPU(s), tensor parallel "
        f"{d.tensor_parallel_size} x pipeline parallel {d.pipeline_parallel_size}",
        f"planned per replica: KV cache {d.kv_cache_tokens:,} tokens, {_requests(d.max_concurrency)} at once; a router "
        f"may put {KV_SAFETY_MARGIN:.0%} of them on it (oomguard pauses at 90% KV, resumes below 80%): "
        f"{d.admit_kv_tokens:,} tokens, {_requests(d.admit_concurrency)}",
    ]
    if probe:
        lines.append(f"startup probe: {ENGINE_START_SECONDS} s engine start + {per_node:.1f} GiB of weights per node "
                     f"at {LOAD_BYTES_PER_SECOND / 1e6:.0f} MB/s = {d.startup_seconds} s "
                     f"({d.startup_failure_threshold} probes {PROBE_PERIOD_SECONDS} s apart)")
    return lines


def _requests(n: int) -> str:
    return f"{n} request" + ("" if n == 1 else "s")


def render(fmt: str, d: Deployment, command: str) -> str:
    """The YAML file for `--format fmt`: `command` is the `vllm serve` line the plan printed for the same config."""
    import yaml

    target = TARGETS[fmt]
    header = [target.DESCRIPTION, f"planned by oomguard: {command}", *summary(d, getattr(target, "STARTUP_PROBE", False)),
              *target.notes(d)]
    body = yaml.safe_dump(target.document(d), sort_keys=False, width=1 << 16, allow_unicode=True)
    return "".join(f"# {line}\n" for line in header) + body
