"""What to run next after the engine failed: pure, from the failure (an `Outcome`) and the command that failed.

The axis follows the diagnosis (oomguard/diagnose): a runtime OOM or a KV cache that ran out lowers the work per
step (max_num_seqs, max_num_batched_tokens) and the share of the GPU vLLM takes; a KV cache too small for
max_model_len lowers max_model_len to what vLLM estimates it holds (or, for a context the user asked for that an
FP8 KV cache would hold, keeps it with --kv-cache-dtype fp8); an OOM while profiling or capturing CUDA graphs
lowers the batch and turns graphs off; llama.cpp lowers -c, then -ngl, then quantizes its KV cache. The diagnosis's
own fixes (computed from the log's numbers) are taken first where they name a setting on that axis; the fallback
moves below apply when it names none. A failure that is not about memory (killed, hung, an engine bug) restarts the
same configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .engine import LLAMA_FLAGS, EngineCommand

MEMORY_CLASSES = frozenset({"oom_runtime", "no_cache_blocks", "kv_cache_too_small", "oom_profiling_or_graph",
                            "oom_weights_load", "gpu_memory_in_use", "context_too_long"})

# the vLLM settings each class may move (dests), in the order the fallback tries them
VLLM_AXES: dict[str, tuple[str, ...]] = {
    "oom_runtime": ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"),
    "no_cache_blocks": ("max_num_seqs", "gpu_memory_utilization", "max_model_len"),
    "kv_cache_too_small": ("max_model_len", "gpu_memory_utilization", "kv_cache_dtype"),
    "context_too_long": ("max_model_len",),
    "oom_profiling_or_graph": ("max_num_batched_tokens", "max_num_seqs", "enforce_eager", "gpu_memory_utilization"),
    "oom_weights_load": ("quantization", "cpu_offload_gb", "tensor_parallel_size", "kv_cache_dtype"),
    "gpu_memory_in_use": ("gpu_memory_utilization",),
}
LLAMA_AXES = ("ctx_size", "n_gpu_layers", "cache_type_k", "cache_type_v", "ubatch_size", "batch_size")
MIN_LLAMA_CTX = 256
VLLM_DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class Outcome:
    """How one run of the engine ended, as the supervisor saw it and diagnose read it."""
    cause: str                        # "exit", "signal", "hang", "startup_timeout"
    ready: bool                       # it had answered /health before it ended
    exit_code: int | None = None      # negative: killed by that signal
    finding_class: str | None = None
    summary: str = ""
    fixes: tuple[tuple[str, object], ...] = ()   # (flag spelling, value) from the diagnosis, in its order
    facts: dict = field(default_factory=dict)    # numbers the log stated: max_num_seqs, kv_cache_tokens, n_ctx, ...
    kv_exhausted: bool = False        # the log says the KV cache ran out (requests outgrew it)


@dataclass(frozen=True)
class Adjustment:
    changes: dict                     # dest -> new value; {} restarts the same configuration
    reason: str

    @property
    def same(self) -> bool:
        return not self.changes


def next_configuration(cmd: EngineCommand, outcome: Outcome) -> Adjustment | None:
    """The configuration to relaunch with; None when the failure is about memory and nothing on its axis is left
    to lower (relaunching would fail the same way)."""
    cls = outcome.finding_class
    if cls not in MEMORY_CLASSES:
        why = {"signal": "the engine was killed", "hang": "the engine stopped answering",
               "startup_timeout": "the engine did not become ready in time"}.get(outcome.cause, "the engine exited")
        return Adjustment({}, f"{why} ({cls or 'no memory error in its log'}): same configuration")
    if cmd.kind == "llamacpp":
        return _llama(cmd, outcome)
    return _vllm(cmd, outcome, cls)


def _dest_of_vllm(flag: str) -> str | None:
    from oomguard.engines.vllm.flags import FLAGS
    for f in FLAGS:
        if flag in f.options:
            return f.dest
    return None


def _vllm(cmd: EngineCommand, outcome: Outcome, cls: str) -> Adjustment | None:
    axes = VLLM_AXES[cls]
    flags, facts = cmd.flags, outcome.facts
    changes: dict = {}
    for flag, value in outcome.fixes:
        dest = _dest_of_vllm(flag)
        if dest in axes and dest not in changes and value is not None and flags.get(dest) != value:
            changes[dest] = value
    seqs = flags.get("max_num_seqs") or facts.get("max_num_seqs") or VLLM_DEFAULT_MAX_NUM_SEQS
    if cls in ("oom_runtime", "no_cache_blocks"):
        target = min(int(changes.get("max_num_seqs", seqs)), max(1, int(seqs) // 2))
        if outcome.kv_exhausted and facts.get("max_concurrency"):
            # requests outgrew the KV cache: no more at once than it holds at full length (vLLM's own
            # "Maximum concurrency for N tokens per request" figure), so it cannot run out again
            target = min(target, max(1, math.floor(float(facts["max_concurrency"]))))
        if target < seqs:
            changes["max_num_seqs"] = target
        batched = changes.get("max_num_batched_tokens") or flags.get("max_num_batched_tokens")
        if batched and "max_num_seqs" in changes and batched < changes["max_num_seqs"]:
            changes["max_num_batched_tokens"] = changes["max_num_seqs"]   # vLLM refuses fewer tokens than seqs
    elif cls in ("kv_cache_too_small", "context_too_long") and "max_model_len" not in changes:
        estimate = facts.get("estimated_max_model_len")
        current = flags.get("max_model_len") or facts.get("max_model_len")
        if (cls == "kv_cache_too_small" and flags.get("max_model_len") and estimate and 2 * estimate >= current
                and flags.get("kv_cache_dtype", "auto") == "auto" and "kv_cache_dtype" not in changes):
            # the context the user asked for is kept when an FP8 KV cache (one byte per element where the model's
            # dtype takes two) holds it; a context that was only the model's default is cut to what fits instead
            changes["kv_cache_dtype"] = "fp8"
        elif estimate and (not current or estimate < current):
            changes["max_model_len"] = int(estimate)
        elif current and current > 256:
            changes["max_model_len"] = int(current) // 2
    elif cls == "oom_profiling_or_graph" and not changes:
        batched = flags.get("max_num_batched_tokens") or facts.get("max_num_batched_tokens")
        if not flags.get("enforce_eager"):
            changes["enforce_eager"] = True
        elif batched and batched > 512:
            changes["max_num_batched_tokens"] = max(512, int(batched) // 2)
    elif cls == "gpu_memory_in_use" and "gpu_memory_utilization" not in changes:
        util = flags.get("gpu_memory_utilization") or facts.get("gpu_memory_utilization") or 0.9
        if util > 0.3:
            changes["gpu_memory_utilization"] = round(float(util) - 0.05, 2)
    if not changes:
        return None
    said = ", ".join(f"{k}={v}" for k, v in changes.items())
    return Adjustment(changes, f"{cls}: {said}")


def _llama(cmd: EngineCommand, outcome: Outcome) -> Adjustment | None:
    spelled = {s: dest for dest, spellings in LLAMA_FLAGS.items() for s in spellings}
    flags, facts = cmd.flags, outcome.facts
    changes: dict = {}
    for flag, value in outcome.fixes:
        dest = spelled.get(flag)
        if dest and value is not None and flags.get(dest) != value and dest not in ("cache_type_v",):
            changes[dest] = value
    ctx = flags.get("ctx_size") or facts.get("n_ctx")
    if "ctx_size" not in changes and ctx and int(ctx) > MIN_LLAMA_CTX:
        # the context first: the KV cache and the compute buffers both grow with it
        changes = {"ctx_size": max(MIN_LLAMA_CTX, int(ctx) // 2)}
    elif not changes:
        ngl = flags.get("n_gpu_layers")
        if ngl is not None and int(ngl) > 0:
            changes["n_gpu_layers"] = int(ngl) // 2
        elif flags.get("cache_type_k") in (None, "f16"):
            changes["cache_type_k"] = "q8_0"
    if not changes:
        return None
    said = ", ".join(f"{LLAMA_FLAGS[k][0]} {v}" for k, v in changes.items())
    return Adjustment(changes, f"{outcome.finding_class}: {said}")
