"""What the simulated vLLM looks like: its KV blocks and batch limits (from the planner) and its roofline.

`plan_simulation(...)` is the one place that calls `oomguard.plan.api.predict`. Explicit settings
(`num_gpu_blocks`, like vLLM's --num-gpu-blocks-override) win over the planner's; when the planner cannot
resolve the model or GPU and `num_gpu_blocks` is given, generic figures stand in (an 8B bf16 model on an
H100), and the plan says so in `assumptions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import NEWEST, Version, fmt, parse_version
from oomguard.errors import UsageError
from oomguard.units import GiB, cdiv

# Stand-ins when no planner report is available (Llama-3.1-8B in bf16 on one H100 SXM)
GENERIC = {
    "weights_bytes": 16_060_522_496, "params": 8.03e9, "kv_bytes_per_token": 131_072,
    "peak_flops": 989e12, "bandwidth": 3.35e12, "total_memory_bytes": int(79.19 * GiB), "gpu_name": "NVIDIA H100 80GB HBM3",
}


@dataclass(frozen=True)
class SimPlan:
    model: str
    vllm_version: Version
    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    enable_chunked_prefill: bool
    weights_bytes: int              # per GPU
    kv_bytes_per_token: int         # per GPU
    flops_per_token: float          # per GPU
    peak_flops: float
    bandwidth: float
    gpu_name: str
    total_memory_bytes: int
    kv_cache_bytes: int             # per GPU
    tensor_parallel_size: int = 1
    starts: bool = True
    error: str | None = None
    source: str = "planner"
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    @property
    def engine(self) -> str:
        return release(self.vllm_version).default_engine

    @property
    def max_concurrency(self) -> float:
        if not release(self.vllm_version).concurrency_per_request_blocks:
            return self.num_gpu_blocks * self.block_size / self.max_model_len
        return self.num_gpu_blocks / cdiv(self.max_model_len, self.block_size)

    @property
    def kv_cache_tokens(self) -> int:
        """The token count vLLM prints in 'GPU KV cache size: N tokens' for this version."""
        if release(self.vllm_version).kv_tokens_from_concurrency:
            return int(self.max_concurrency * self.max_model_len)
        return self.num_gpu_blocks * self.block_size

    def cache_config_labels(self) -> dict[str, object]:
        labels: dict[str, object] = {
            "block_size": self.block_size, "cache_dtype": self.kv_cache_dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization, "num_gpu_blocks": self.num_gpu_blocks,
            "num_cpu_blocks": 0 if release(self.vllm_version).num_cpu_blocks_label_zero else "None",
            "enable_prefix_caching": False, "swap_space": 4, "sliding_window": "None",
            "num_gpu_blocks_override": self.num_gpu_blocks if self.source != "planner" else "None",
        }
        if release(self.vllm_version).cache_config_kv_tokens:
            labels["kv_cache_size_tokens"] = self.kv_cache_tokens
            labels["kv_cache_max_concurrency"] = round(self.max_concurrency, 2)
        labels["max_model_len"] = self.max_model_len  # not a real label: removed by the metrics module
        return labels


def _predict(model, gpu, gpu_count, version, flags, model_config):
    """The planner call (kept in one function: the planner's API is the contract in PLANNER_API.md)."""
    from oomguard.plan.api import predict
    return predict(model, gpu, gpu_count=gpu_count, vllm_version=version, flags=flags, model_config=model_config)


def _gpu_figures(gpu: str | None) -> tuple[float, float, str, int] | None:
    if not gpu:
        return None
    try:
        from oomguard.plan.api import resolve_gpu
        spec = resolve_gpu(gpu)
    except Exception:  # noqa: BLE001 - the catalog may not know it; generic figures then
        return None
    return spec.bf16_dense_flops, spec.memory_bandwidth_bytes_per_s, spec.name, spec.total_memory_bytes


def plan_simulation(model: str, gpu: str | None = None, *, gpu_count: int | None = None,
                    vllm_version: str | None = None, flags: dict | None = None, model_config: str | None = None,
                    num_gpu_blocks: int | None = None, enable_chunked_prefill: bool = True) -> SimPlan:
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    version = parse_version(vllm_version) if vllm_version else NEWEST
    tp = int(flags.get("tensor_parallel_size", 1))
    world = tp * int(flags.get("pipeline_parallel_size", 1))
    notes: list[str] = []
    report = None
    planner_error = None
    try:
        report = _predict(model, gpu, gpu_count or world, fmt(version), flags, model_config)
    except (UsageError, ImportError, FileNotFoundError, KeyError, ValueError) as exc:
        planner_error = str(exc)
        if num_gpu_blocks is None:
            raise UsageError(f"the planner cannot size the KV cache for {model!r} on {gpu or 'this GPU'}: "
                             f"{planner_error} (or give --num-gpu-blocks N to simulate without it)") from exc

    if report is not None:
        cfg = report.config
        worker = report.workers[0]
        figures = _gpu_figures(gpu)
        peak, bandwidth = (figures[0], figures[1]) if figures else (GENERIC["peak_flops"], GENERIC["bandwidth"])
        quant = cfg.get("quantization")
        bytes_per_param = 2 if cfg.get("dtype") in ("bfloat16", "float16") else 4 if cfg.get("dtype") == "float32" else 2
        if quant:
            notes.append(f"FLOPs estimated from weight bytes at {bytes_per_param} bytes/parameter ({quant} ignored)")
        blocks = num_gpu_blocks if num_gpu_blocks is not None else report.num_gpu_blocks
        if num_gpu_blocks is not None:
            notes.append(f"num_gpu_blocks={num_gpu_blocks} given (the planner predicts {report.num_gpu_blocks})")
        return SimPlan(
            model=model, vllm_version=version, num_gpu_blocks=blocks, block_size=report.block_size,
            max_model_len=report.max_model_len, max_num_seqs=int(cfg["max_num_seqs"]),
            max_num_batched_tokens=int(cfg["max_num_batched_tokens"]),
            gpu_memory_utilization=float(cfg["gpu_memory_utilization"]), kv_cache_dtype=str(cfg["kv_cache_dtype"]),
            enable_chunked_prefill=enable_chunked_prefill, weights_bytes=worker.weights_bytes,
            kv_bytes_per_token=max(1, worker.bytes_per_block // report.block_size),
            flops_per_token=2.0 * worker.weights_bytes / bytes_per_param, peak_flops=peak, bandwidth=bandwidth,
            gpu_name=report.gpu_name, total_memory_bytes=report.total_memory_bytes,
            kv_cache_bytes=blocks * worker.bytes_per_block, tensor_parallel_size=tp,
            starts=report.starts or num_gpu_blocks is not None, error=None if num_gpu_blocks is not None else report.error,
            source="planner" if num_gpu_blocks is None else "planner+override",
            assumptions=tuple(notes) + tuple(report.assumptions))

    # no planner: explicit blocks and generic hardware figures
    notes.append(f"planner unavailable ({planner_error}); generic 8B-bf16-on-H100 figures for timing")
    figures = _gpu_figures(gpu)
    peak, bandwidth, gpu_name, total = figures if figures else (
        GENERIC["peak_flops"], GENERIC["bandwidth"], GENERIC["gpu_name"], GENERIC["total_memory_bytes"])
    block_size = int(flags.get("block_size") or 16)
    max_model_len = int(flags.get("max_model_len") or 8192)
    if max_model_len == -1:
        max_model_len = 8192
    max_num_seqs = int(flags.get("max_num_seqs") or 256)
    mnbt = int(flags.get("max_num_batched_tokens") or (8192 if enable_chunked_prefill else max(max_model_len, 2048)))
    kv_per_token = GENERIC["kv_bytes_per_token"] // tp
    return SimPlan(
        model=model, vllm_version=version, num_gpu_blocks=int(num_gpu_blocks), block_size=block_size,
        max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt,
        gpu_memory_utilization=float(flags.get("gpu_memory_utilization") or 0.9),
        kv_cache_dtype=str(flags.get("kv_cache_dtype") or "auto"), enable_chunked_prefill=enable_chunked_prefill,
        weights_bytes=GENERIC["weights_bytes"] // tp, kv_bytes_per_token=kv_per_token,
        flops_per_token=2.0 * GENERIC["params"] / tp, peak_flops=peak, bandwidth=bandwidth, gpu_name=gpu_name,
        total_memory_bytes=total, kv_cache_bytes=int(num_gpu_blocks) * block_size * kv_per_token,
        tensor_parallel_size=tp, source="explicit", assumptions=tuple(notes))


def fits_one_request(plan: SimPlan) -> bool:
    """Whether one request of max_model_len fits the usable blocks (all but the null block).

    vLLM >= 0.30 checks exactly this at startup; older versions counted the null block too, so a cache within one
    block of the limit starts there but is refused here (it could never finish a max_model_len request)."""
    return plan.num_gpu_blocks - 1 >= cdiv(plan.max_model_len, plan.block_size)
