"""Search vLLM configurations for the one that serves a workload, scored by vLLM's own startup memory model.

The configuration checklist as a search: for every checkpoint of the model (its own precision, online FP8, the
quantized copies in the catalog), every tensor-parallel size that divides the heads and fits the GPUs (pipeline
stages only when TP alone cannot fit), and the KV-cache dtypes the GPU runs, settle the other knobs from the
workload (max_model_len = the p99 rounded up; max_num_seqs = the peak concurrency; prefix caching only when
the stated sharing makes it pay; gpu_memory_utilization 0.90, 0.95 only when needed, never above what is
free), and keep the configurations under which vLLM starts AND holds peak-concurrency requests of p99 tokens
at once, so nothing is preempted. Pure: no I/O; each evaluation is one `memory.predict` call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from oomguard.engines.vllm import defaults
from oomguard.engines.vllm.memory import EngineConfig, MemoryReport, predict
from oomguard.engines.vllm.quantization import runs_on
from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import Version
from oomguard.errors import UsageError
from oomguard.gpus.spec import GpuSpec
from oomguard.models.spec import ModelSpec
from oomguard.plan.speed import Speed, decode_speed
from oomguard.plan.topology import Topology
from oomguard.plan.workload import Workload
from oomguard.failures import FailureClass

# keep-model (the default): the checkpoint the user named at its own precision, on the fewest GPUs, whenever it serves
# the peak; else the least loss of fidelity (fp8 KV, then 8-bit, then 4-bit weights). The others rank every candidate.
OBJECTIVES = ("keep-model", "fewest-gpus", "most-headroom", "max-throughput")
UTILIZATIONS = (0.90, 0.95)        # vLLM's usual default first; 0.95 only to fit (above it too little stays free)
UTILIZATION_MARGIN = 0.01          # below the free fraction on a shared GPU, for the other process's growth
PREFIX_CACHING_PAYS = 0.30         # under a 30% hit rate the cache does not pay for its hashing and pinned blocks
CONTEXT_STEP = 1024                # max_model_len = p99 rounded up to this
SMALL_PREFILL_CHUNK = 2048         # max_num_batched_tokens when the profile run's activation peak does not fit


@dataclass(frozen=True)
class Checkpoint:
    model: ModelSpec
    quantization: str | None       # the --quantization flag to pass (None: the checkpoint's own)
    label: str                     # "bf16", "fp8 (online)", "awq int4", ...
    precision_rank: int            # 0 native, 1 eight-bit, 2 four-bit: fidelity order at equal cost
    other_checkpoint: bool         # True when this precision is a different repository id


@dataclass(frozen=True)
class Candidate:
    checkpoint: Checkpoint
    config: EngineConfig
    report: MemoryReport
    held: float                    # requests of p99 tokens the KV cache holds at once
    speed: Speed | None
    feasible: bool
    shortfall: str | None          # why it does not serve the workload
    reason: str = ""
    graphs_freed_bytes: int = 0    # what eager mode took off the GPU, where the search turned it on

    @property
    def gpus(self) -> int:
        return self.config.tensor_parallel_size * self.config.pipeline_parallel_size

    def command_flags(self) -> dict:
        """The vLLM settings worth writing down: what differs from EngineConfig's defaults (vLLM's), by dest."""
        return self.config.flags(changed_only=True)

    def to_dict(self) -> dict:
        return {"model": self.checkpoint.model.model_id, "checkpoint": self.checkpoint.label,
                "other_checkpoint": self.checkpoint.other_checkpoint, "gpus": self.gpus,
                "flags": self.command_flags(), "feasible": self.feasible, "requests_held": round(self.held, 2),
                "shortfall": self.shortfall, "reason": self.reason,
                "speed": self.speed.to_dict() if self.speed else None, "prediction": self.report.to_dict()}

    def describe(self) -> str:
        """'TP 2, fp8 dyn, fp8 KV' (PP only when used)."""
        c = self.config
        pp = c.pipeline_parallel_size
        parts = [f"TP {c.tensor_parallel_size}" + (f" x PP {pp}" if pp > 1 else ""), self.checkpoint.label]
        if c.kv_cache_dtype == "fp8":
            parts.append("fp8 KV")
        if c.enforce_eager:
            parts.append("eager")
        return ", ".join(parts)

    @property
    def rank_cost(self) -> float:
        """Fidelity cost: quantized weights first, then the fp8 KV cache."""
        return self.checkpoint.precision_rank + (0.5 if self.config.kv_cache_dtype == "fp8" else 0)


@dataclass(frozen=True)
class SearchResult:
    candidates: tuple[Candidate, ...]      # feasible first, in objective order; then the closest misses
    evaluations: int
    objective: str
    notes: tuple[str, ...] = field(default=())

    @property
    def feasible(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if c.feasible)

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates and self.candidates[0].feasible else None


def context_length(workload: Workload, model: ModelSpec) -> int:
    """max_model_len: the p99 rounded up to a multiple of 1,024, never past what the model allows."""
    return min(math.ceil(workload.p99_tokens / CONTEXT_STEP) * CONTEXT_STEP, model.derived_max_model_len)


def checkpoints(model: ModelSpec, gpu: GpuSpec, variants: list[ModelSpec]) -> list[Checkpoint]:
    """The precisions the model can be served in: its own, online FP8 for a 16-bit checkpoint, catalog copies."""
    cc = gpu.compute_capability
    out = [Checkpoint(model, None, _label(model), _precision(model), False)]
    if model.quant is None and runs_on("fp8", cc):  # W8A8 on cc >= 8.9, weight-only FP8 (Marlin) below
        out.append(Checkpoint(model, "fp8", "fp8 dyn", 1, False))
    out += [Checkpoint(v, None, _label(v), _precision(v), True) for v in variants
            if runs_on(v.quant.method if v.quant else None, cc)]
    return out


def _label(model: ModelSpec) -> str:
    q = model.quant
    if q is None or q.bits >= 16:
        return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[model.dtype]
    return f"{q.method} {'int' if q.method in ('awq', 'gptq', 'compressed-tensors') else 'fp'}{q.bits}" \
        if q.method not in ("fp8", "mxfp4", "modelopt_fp4") else q.method


def _precision(model: ModelSpec) -> int:
    return 0 if model.quant is None or model.quant.bits >= 16 else 1 if model.quant.bits >= 8 else 2


def tp_sizes(model: ModelSpec, gpu_count: int) -> list[int]:
    """TP sizes vLLM accepts: they divide the attention heads and the MLP width; KV heads split evenly or are
    replicated a whole number of times (QKVParallelLinear)."""
    kvs = set(model.layer_kv_heads) or {model.num_kv_heads}   # Gemma 4's full layers have KV heads of their own

    def valid(tp: int) -> bool:
        return model.num_heads % tp == 0 and model.intermediate_size % tp == 0 and (
            model.mla is not None or all(kv % tp == 0 or tp % kv == 0 for kv in kvs))
    return [tp for tp in range(1, gpu_count + 1) if valid(tp)]


def utilization_choices(gpu: GpuSpec, free_memory_bytes: int | None) -> list[float]:
    if free_memory_bytes is None:
        return list(UTILIZATIONS)
    cap = math.floor((free_memory_bytes / gpu.total_memory_bytes - UTILIZATION_MARGIN) * 100) / 100
    if cap <= 0.05:
        return []
    return [u for u in UTILIZATIONS if u <= cap] or [cap]


def shared_prefix_tokens(workload: Workload, block_size: int, caching: bool) -> int:
    """Tokens every request shares that the prefix cache stores once (full blocks only)."""
    if not caching:
        return 0
    return int(workload.p99_tokens * workload.prefix_sharing) // block_size * block_size


def evaluate(checkpoint: Checkpoint, gpu: GpuSpec, gpu_count: int, workload: Workload, version: Version,
             config: EngineConfig, free_memory_bytes: int | None) -> Candidate:
    """One configuration: does vLLM start, and does its KV cache hold the peak without preemption?"""
    used = config.tensor_parallel_size * config.pipeline_parallel_size
    report = predict(checkpoint.model, gpu, config, version, gpu_count=min(used, gpu_count),
                     free_memory_bytes=free_memory_bytes)
    caching = bool(config.enable_prefix_caching)
    held = report.requests_held(workload.p99_tokens, shared_prefix_tokens(workload, report.block_size, caching)) \
        if report.starts else 0.0
    if not report.starts:
        shortfall = f"vLLM would not start: {report.error}"
    elif report.verdict == "at_risk":   # a recommendation must be sure to start, not merely likely to
        shortfall = f"vLLM may not start: the estimates' uncertainty reaches {'; '.join(report.risks)}"
    elif held < workload.peak_concurrency:
        shortfall = (f"the KV cache holds {held:.1f} of the {workload.peak_concurrency} concurrent "
                     f"{workload.p99_tokens:,}-token requests")
    else:
        shortfall = None
    speed = decode_speed(checkpoint.model, report, gpu, workload.peak_concurrency, workload.p99_tokens) \
        if report.starts else None
    return Candidate(checkpoint, config, report, held, speed, shortfall is None, shortfall)


def _configs(model: ModelSpec, gpu: GpuSpec, version: Version, workload: Workload, usage_context: str) -> dict:
    """The settings the workload fixes (every candidate shares them), by vLLM dest."""
    max_len = context_length(workload, model)
    seqs = workload.peak_concurrency
    engine = release(version).default_engine
    _, tokens, _ = defaults.resolve_batch(version, engine, gpu.name, gpu.total_memory_bytes, usage_context, max_len,
                                          model.vision is not None, seqs, None)
    base = {"max_model_len": max_len, "max_num_seqs": seqs, "usage_context": usage_context,
            "enable_prefix_caching": workload.prefix_sharing >= PREFIX_CACHING_PAYS}
    if engine == "v1" and tokens < seqs:   # vLLM refuses max_num_batched_tokens < max_num_seqs
        base["max_num_batched_tokens"] = seqs
    return base


def _may_relieve(candidate: Candidate, change: dict) -> bool:
    """Whether `change` can turn this miss into a fit: it fails in the profile run or graph capture, or it starts
    with a KV cache a little short that the freed activation or graph memory would go to."""
    report = candidate.report
    short_kv = report.starts and (report.cuda_graphs_in_budget or "max_num_batched_tokens" in change)
    if report.error_class != FailureClass.OOM_PROFILING_OR_GRAPH and not short_kv:
        return False
    if "max_num_batched_tokens" in change:
        return report.config["max_num_batched_tokens"] > change["max_num_batched_tokens"]
    return True


def search(model: ModelSpec, gpu: GpuSpec, gpu_count: int, workload: Workload, version: Version,
           objective: str = "keep-model", *, variants: list[ModelSpec] = (), free_memory_bytes: int | None = None,
           usage_context: str = "serve", fixed: dict | None = None, topology: Topology | None = None) -> SearchResult:
    """Every candidate configuration, feasible ones first in `objective` order, then the closest misses.

    `fixed` pins vLLM settings the user gave on the command line (they are not searched). `topology` (nodes of
    G GPUs): TP only within a node, whole nodes for a replica that spans several, and 2 to N pipeline stages only
    when one node cannot serve the peak at the model's own precision.
    """
    if objective not in OBJECTIVES:
        raise UsageError(f"unknown --objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    fixed = fixed or {}
    utils = [fixed["gpu_memory_utilization"]] if "gpu_memory_utilization" in fixed else \
        utilization_choices(gpu, free_memory_bytes)
    if not utils:
        raise UsageError("the free memory given leaves nothing for vLLM on this GPU")
    base = EngineConfig.from_flags({**_configs(model, gpu, version, workload, usage_context), **fixed})
    kv_dtypes = [fixed["kv_cache_dtype"]] if "kv_cache_dtype" in fixed else \
        ["auto"] + (["fp8"] if gpu.supports_fp8 else [])
    ckpts = checkpoints(model, gpu, list(variants))
    if "quantization" in fixed:
        ckpts = [Checkpoint(model, fixed["quantization"], fixed["quantization"], 1, False)]
    per_node = topology.gpus_per_node if topology else gpu_count
    tps = [fixed["tensor_parallel_size"]] if "tensor_parallel_size" in fixed else tp_sizes(model, per_node)
    evaluations = 0
    results: list[Candidate] = []

    def shapes(pps: list[int]):
        for ckpt in ckpts:
            for tp in tps:
                for pp in pps:
                    if tp * pp <= gpu_count and pp <= model.num_layers and (
                            topology is None or topology.fits(tp, pp)):
                        for kv in kv_dtypes:
                            yield ckpt, tp, pp, kv

    def run(pps: list[int]) -> None:
        nonlocal evaluations
        for ckpt, tp, pp, kv in shapes(pps):
            shape = replace(base, tensor_parallel_size=tp, pipeline_parallel_size=pp, kv_cache_dtype=kv,
                            quantization=ckpt.quantization)
            best = None
            for util in utils:  # the lowest utilization that serves the peak
                best = evaluate(ckpt, gpu, gpu_count, workload, version, replace(shape, gpu_memory_utilization=util),
                                free_memory_bytes)
                evaluations += 1
                if best.report.error_class == FailureClass.GPU_MEMORY_IN_USE and "gpu_memory_utilization" not in fixed:
                    # the CUDA context (and NCCL, with TP) already holds part of the GPU: ask for what is free
                    r = best.report
                    cap = math.floor((1 - r.start_used_bytes / r.total_memory_bytes - UTILIZATION_MARGIN) * 100) / 100
                    if cap < util:
                        best = evaluate(ckpt, gpu, gpu_count, workload, version,
                                        replace(shape, gpu_memory_utilization=cap), free_memory_bytes)
                        evaluations += 1
                    break
                if best.feasible or not best.report.starts and best.report.error_class in (
                        FailureClass.OOM_WEIGHTS_LOAD, FailureClass.DTYPE_CAPABILITY, FailureClass.CONTEXT_TOO_LONG):
                    break  # more utilization cannot help these
            # still short: a smaller prefill chunk shrinks the profile run's activation peak; eager mode frees
            # the CUDA-graph memory (in the KV budget from 0.20). Both cost speed, so only when they are needed.
            for change in ({"max_num_batched_tokens": SMALL_PREFILL_CHUNK}, {"enforce_eager": True}):
                if not best.feasible and not any(k in fixed for k in change) and _may_relieve(best, change):
                    graphs = best.report.first.cuda_graph_bytes
                    best = evaluate(ckpt, gpu, gpu_count, workload, version, replace(best.config, **change),
                                    free_memory_bytes)
                    if "enforce_eager" in change:
                        best = replace(best, graphs_freed_bytes=graphs)
                    evaluations += 1
            results.append(best)

    run([fixed.get("pipeline_parallel_size", 1)])
    # PP only when TP alone cannot fit (vLLM: pipeline stages cost latency, TP is preferred within a node); across
    # nodes, also when one node serves the peak only with a loss of fidelity (the nodes were given to keep the model)
    enough = (lambda c: c.feasible and c.rank_cost == 0) if topology else (lambda c: c.feasible)
    if not any(enough(c) for c in results) and "pipeline_parallel_size" not in fixed:
        run(list(topology.pipeline_sizes()) if topology else [pp for pp in (2, 4, 8, 16) if pp <= gpu_count])
    ranked = rank(results, objective, workload)
    return SearchResult(tuple(ranked), evaluations, objective)


def _key(candidate: Candidate, objective: str, workload: Workload):
    tps = candidate.speed.decode_tokens_per_s if candidate.speed else 0.0
    eager = bool(candidate.config.enforce_eager)
    if objective == "keep-model":
        return (candidate.rank_cost, eager, candidate.gpus, candidate.config.gpu_memory_utilization, -tps)
    if objective == "fewest-gpus":
        return (candidate.gpus, candidate.rank_cost, eager, -tps)
    if objective == "most-headroom":
        return (-candidate.held / workload.peak_concurrency, candidate.rank_cost, candidate.gpus, -tps)
    return (eager, -tps, candidate.gpus, candidate.rank_cost)   # eager decode is slower than the roofline says


def rank(candidates: list[Candidate], objective: str, workload: Workload) -> list[Candidate]:
    """Feasible candidates in objective order, each with its one-line reason; then misses, closest first."""
    feasible = sorted((c for c in candidates if c.feasible), key=lambda c: _key(c, objective, workload))
    misses = sorted((c for c in candidates if not c.feasible),
                    key=lambda c: (not c.report.starts, -c.held, c.gpus, c.rank_cost))
    out = []
    for i, c in enumerate(feasible):
        out.append(_with_reason(c, objective, workload, feasible[0] if i else None))
    return out + misses


def _with_reason(c: Candidate, objective: str, workload: Workload, leader: Candidate | None) -> Candidate:
    ratio = c.held / workload.peak_concurrency
    tps = c.speed.decode_tokens_per_s if c.speed else 0
    gpus = f"{c.gpus} GPU{'s' if c.gpus > 1 else ''}"
    prec = c.checkpoint.label + (", fp8 KV" if c.config.kv_cache_dtype == "fp8" else "")
    if objective in ("keep-model", "fewest-gpus"):
        head = f"{gpus} ({prec})" if leader is None else f"{gpus} vs {leader.gpus}" if c.gpus > leader.gpus else \
            f"same {gpus}, {prec}"
    elif objective == "most-headroom":
        head = f"KV holds {ratio:.1f}x your peak"
    else:
        head = f"~{tps:,.0f} tok/s decode at peak"
    tail = [f"KV holds {ratio:.1f}x the peak"] if objective != "most-headroom" else [gpus, prec]
    if objective != "max-throughput":
        tail.append(f"~{tps:,.0f} tok/s")
    if c.config.enforce_eager:
        tail.append("eager (no CUDA graphs: slower decode)")
    return replace(c, reason=f"{head}; " + ", ".join(tail))
