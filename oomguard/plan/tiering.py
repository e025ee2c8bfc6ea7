"""When no configuration serves the workload: what breaks, the smallest change that fits, and tiering with its price.

The last resort when no GPU configuration fits is to tier memory (host RAM, a smaller GGUF). Every figure
here comes from the same memory model as the search (vLLM's startup arithmetic), and every speed from the
roofline in `speed.py`, so a plan that streams weights over PCIe says how slow that is instead of promising a
speed physics rules out.
Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import Version
from oomguard.gpus.spec import GpuSpec
from oomguard.models.params import parameter_counts
from oomguard.models.spec import ModelSpec, QuantSpec
from oomguard.plan.search import Candidate, evaluate, search
from oomguard.plan.speed import Speed, decode_speed
from oomguard.plan.workload import Workload
from oomguard.units import GiB
from oomguard.failures import FailureClass

SECONDS_PER_TOKEN_IS_UNUSABLE = 1.0
CONTEXT_STEP_SEARCH = 256          # granularity of the "shorter context" answer


@dataclass(frozen=True)
class Change:
    kind: str            # "more-gpus", "larger-gpu", "quantized-checkpoint", "shorter-context", "lower-concurrency"
    summary: str         # the change in one line, with its numbers
    candidate: Candidate | None = None

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "summary": self.summary}
        if self.candidate is not None:
            out["flags"] = self.candidate.command_flags()
            out["model"] = self.candidate.checkpoint.model.model_id
        return out


@dataclass(frozen=True)
class OffloadPlan:
    offload_gib_per_gpu: float
    candidate: Candidate
    uva: Speed                       # --cpu-offload-gb
    prefetch: Speed | None           # --offload-group-size/--offload-num-in-group (vLLM >= 0.17)
    prefetch_flags: dict | None
    pcie_gb_per_s: float
    verdict: str

    def to_dict(self) -> dict:
        return {"offload_gib_per_gpu": self.offload_gib_per_gpu, "flags": self.candidate.command_flags(),
                "pcie_gb_per_s_assumed": self.pcie_gb_per_s, "uva": self.uva.to_dict(),
                "prefetch": self.prefetch.to_dict() if self.prefetch else None, "prefetch_flags": self.prefetch_flags,
                "verdict": self.verdict}


@dataclass(frozen=True)
class NoFit:
    breaks: str                      # which constraint breaks, by how much
    closest: Candidate | None
    changes: tuple[Change, ...]
    offload: OffloadPlan | None
    llamacpp: object | None = None   # oomguard.engines.llamacpp.fit result, when a GGUF plan applies

    def to_dict(self) -> dict:
        llama = self.llamacpp.to_dict() if self.llamacpp is not None and hasattr(self.llamacpp, "to_dict") else None
        return {"breaks": self.breaks, "closest": self.closest.to_dict() if self.closest else None, "changes": [c.to_dict() for c in self.changes],
                "cpu_offload": self.offload.to_dict() if self.offload else None, "llamacpp": llama}


def describe_break(closest: Candidate | None, workload: Workload, gpu: GpuSpec, gpu_count: int) -> str:
    if closest is None:
        return "no tensor-parallel size is valid for this model on these GPUs"
    report = closest.report
    where = (f"at best ({closest.gpus} x {gpu.name}, {closest.describe()}, "
             f"gpu_memory_utilization {closest.config.gpu_memory_utilization})")
    if not report.starts:
        if report.error_class == FailureClass.OOM_WEIGHTS_LOAD:
            need = report.first.weights_bytes / GiB
            return (f"the weights alone need {need:.1f} GiB per GPU {where} but each GPU has "
                    f"{report.total_memory_bytes / GiB:.1f} GiB: vLLM fails while loading them")
        return f"vLLM would not start {where}: {report.error}"
    per_request = report.kv_layout.blocks_per_request(workload.p99_tokens, report.in_flight_tokens) * \
        report.kv_layout.bytes_per_block
    short = (workload.peak_concurrency - closest.held) * per_request
    return (f"{where} the KV cache holds {closest.held:.1f} of your {workload.peak_concurrency} concurrent "
            f"{workload.p99_tokens:,}-token requests ({closest.held / workload.peak_concurrency:.0%}): "
            f"short by about {short / GiB:.1f} GiB of KV per GPU")


def least_bytes(model: ModelSpec, workload: Workload, kv_bytes: int) -> float:
    """A lower bound of the memory any configuration needs for the workload: 4-bit weights plus the peak's KV at
    `kv_bytes` per value (sliding-window layers hold only their window; shared prefixes once)."""
    total_params = parameter_counts(model)[0]
    tokens = workload.p99_tokens
    per_token = 0.0
    for i, kind in enumerate(model.layer_attention):
        if model.reads_shared_kv(i):   # Gemma 4's KV-shared layers store no KV
            continue
        if kind == "mla":
            per_token += (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * kv_bytes
        else:
            window = model.sliding_window if kind == "sliding" else model.attention_chunk_size if kind == "chunked" \
                else None
            per_token += 2 * model.kv_heads_at(i) * model.head_dim_at(i) * kv_bytes * (
                min(tokens, window) / tokens if window else 1)
    held_tokens = tokens + (workload.peak_concurrency - 1) * tokens * (1 - workload.prefix_sharing)
    return total_params * 0.5 + per_token * held_tokens


def _first_feasible(model: ModelSpec, gpu: GpuSpec, gpu_count: int, workload: Workload, version: Version,
                    variants, free: int | None, usage_context: str) -> Candidate | None:
    budget = gpu_count * (free if free is not None else gpu.total_memory_bytes) * 0.95
    if least_bytes(model, workload, 1 if gpu.supports_fp8 else 2) > budget:
        return None  # cannot fit, whatever the search tries: skip it
    return search(model, gpu, gpu_count, workload, version, "fewest-gpus", variants=variants,
                  free_memory_bytes=free, usage_context=usage_context).best


def largest_fitting(low: int, high: int, fits) -> int | None:
    """The largest n in [low, high] with fits(n), for a fits() that is monotone (true, then false)."""
    if not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def int4_copy(model: ModelSpec) -> ModelSpec:
    """The model as a 4-bit, group-128 AWQ/GPTQ checkpoint would be (the most common quantized copy)."""
    return replace(model, model_id=f"{model.model_id} (4-bit AWQ/GPTQ)",
                   quant=QuantSpec(method="awq", bits=4, group_size=128, zero_point=True), checkpoint_bytes=None)


def smallest_changes(model: ModelSpec, gpu: GpuSpec, gpu_count: int, workload: Workload, version: Version,
                     variants, free: int | None, usage_context: str, gpus: list[GpuSpec]) -> list[Change]:
    changes: list[Change] = []
    args = (version, variants, None, usage_context)   # another machine: its memory is free
    for count in (2, 4, 8, 16):
        if count > gpu_count:
            found = _first_feasible(model, gpu, count, workload, *args)
            if found:
                changes.append(Change("more-gpus", f"{found.gpus} x {gpu.name} ({found.describe()}) hold your peak", found))
                break
    for bigger in sorted((g for g in gpus if g.total_memory_bytes > gpu.total_memory_bytes and g.vendor == gpu.vendor),
                         key=lambda g: g.total_memory_bytes):
        found = _first_feasible(model, bigger, gpu_count, workload, *args)
        if found:
            changes.append(Change("larger-gpu", f"{found.gpus} x {bigger.name} ({bigger.total_memory_bytes / GiB:.0f} GiB, "
                                  f"{found.describe()}) hold your peak", found))
            break
    if model.quant is None:
        quantized = int4_copy(model)
        found = _first_feasible(quantized, gpu, gpu_count, workload, version, [], free, usage_context)
        if found:
            changes.append(Change("quantized-checkpoint",
                                  f"a 4-bit AWQ/GPTQ checkpoint of {model.model_id} (not in the catalog: its id "
                                  f"usually ends in -AWQ or -GPTQ-Int4) fits on {found.gpus} x {gpu.name} ({found.describe()})", found))

    def fits_tokens(blocks: int) -> bool:  # in steps of CONTEXT_STEP_SEARCH tokens: enough precision, fewer searches
        return _first_feasible(model, gpu, gpu_count, replace(workload, p99_tokens=blocks * CONTEXT_STEP_SEARCH,
                                                              max_tokens_out=None),
                               version, variants, free, usage_context) is not None
    blocks = largest_fitting(1, (workload.p99_tokens - 1) // CONTEXT_STEP_SEARCH, fits_tokens) \
        if workload.p99_tokens > CONTEXT_STEP_SEARCH else None
    if blocks:
        tokens = blocks * CONTEXT_STEP_SEARCH
        changes.append(Change("shorter-context", f"requests up to {tokens:,} tokens (your p99 is "
                              f"{workload.p99_tokens:,}) at {workload.peak_concurrency} at once fit on these GPUs"))

    def fits_concurrency(c: int) -> bool:
        return _first_feasible(model, gpu, gpu_count, replace(workload, peak_concurrency=c), version, variants,
                               free, usage_context) is not None
    concurrency = largest_fitting(1, workload.peak_concurrency - 1, fits_concurrency) \
        if workload.peak_concurrency > 1 else None
    if concurrency:
        changes.append(Change("lower-concurrency", f"{concurrency} concurrent {workload.p99_tokens:,}-token requests "
                              f"(your peak is {workload.peak_concurrency}) fit on these GPUs: cap --max-num-seqs "
                              f"{concurrency} and queue the rest (oomguard proxy)"))
    return changes


def smallest_fitting(low: int, high: int, fits) -> int | None:
    """The smallest n in [low, high] with fits(n), for a fits() that is monotone (false, then true)."""
    if not fits(high):
        return None
    while low < high:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid + 1
    return low


def offload_plan(closest: Candidate | None, gpu: GpuSpec, gpu_count: int, workload: Workload, version: Version,
                 free: int | None) -> OffloadPlan | None:
    """The least --cpu-offload-gb (whole GiB per GPU) with which the closest configuration serves the peak."""
    if closest is None:
        return None
    weights = max(w.weights_bytes for w in closest.report.workers)
    config = replace(closest.config, gpu_memory_utilization=max(closest.config.gpu_memory_utilization, 0.9))

    def attempt(gib: int) -> Candidate:
        return evaluate(closest.checkpoint, gpu, gpu_count, workload, version, replace(config, cpu_offload_gb=gib),
                        free)
    need = smallest_fitting(1, math.ceil(weights * 0.95 / GiB), lambda gib: attempt(gib).feasible)
    if need is None:
        return None
    found = attempt(need)
    batch, context = workload.peak_concurrency, workload.p99_tokens
    uva = decode_speed(found.checkpoint.model, found.report, gpu, batch, context, "uva")
    prefetch = prefetch_flags = None
    if release(version).prefetch_offload:  # vllm/config/offload.py PrefetchOffloadConfig: last K of every G layers
        prefetch = decode_speed(found.checkpoint.model, found.report, gpu, batch, context, "prefetch")
        layers = found.report.first.layers
        group = min(8, layers)
        share = need * GiB / weights
        prefetch_flags = {"offload_group_size": group, "offload_num_in_group": min(group, math.ceil(group * share)),
                          "offload_prefetch_step": 1}
    pcie = gpu.pcie_bandwidth_bytes_per_s / 1e9
    crossing = f"{need} GiB per GPU crosses PCIe (~{pcie:.0f} GB/s assumed, {gpu.name}) on every decode step"
    if uva.step_seconds >= SECONDS_PER_TOKEN_IS_UNUSABLE:
        verdict = (f"{crossing}: at least {uva.step_seconds:.1f} s per token for each request. Physically "
                   "possible, not usable for interactive serving")
    else:
        verdict = (f"{crossing}: ~{uva.per_request_tokens_per_s:.1f} tok/s per request "
                   f"({uva.decode_tokens_per_s:,.0f} tok/s for all {batch})")
    return OffloadPlan(need, found, uva, prefetch, prefetch_flags, pcie, verdict)


def no_fit(model: ModelSpec, gpu: GpuSpec, gpu_count: int, workload: Workload, version: Version, misses,
           variants, free: int | None, usage_context: str, gpus: list[GpuSpec], llamacpp=None) -> NoFit:
    closest = misses[0] if misses else None
    return NoFit(breaks=describe_break(closest, workload, gpu, gpu_count), closest=closest,
                 changes=tuple(smallest_changes(model, gpu, gpu_count, workload, version, variants, free,
                                                usage_context, gpus)),
                 offload=offload_plan(closest, gpu, gpu_count, workload, version, free), llamacpp=llamacpp)

