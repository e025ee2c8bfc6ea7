"""When a plan fails: the nearest configuration that starts, found by planning changes one at a time, then two.

Changes are tried from the least to the most intrusive: use more of the GPUs given (a larger tensor-parallel size),
ask for more of the GPU, a float8 KV cache, fewer or narrower LoRA slots, n-gram speculation instead of a drafter on
the GPU, the context vLLM estimates it can hold, float8 weights, fewer sequences
at once, eager mode (no CUDA graphs), and less of the GPU when other processes hold part of it. Every candidate is
planned by the same memory model; nothing here is a rule of thumb.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from oomguard.engines.vllm.memory import EngineConfig, MemoryReport, predict
from oomguard.engines.vllm.quantization import runs_on
from oomguard.engines.vllm.versions import Version
from oomguard.errors import UsageError
from oomguard.gpus.spec import GpuSpec
from oomguard.models.spec import ModelSpec
from oomguard.failures import FailureClass


@dataclass(frozen=True)
class NearestStart:
    changes: dict             # vLLM dest -> the value that makes it start
    report: MemoryReport

    def to_dict(self) -> dict:
        return {"changes": self.changes, "verdict": self.report.verdict,
                "kv_cache_gib": round(self.report.kv_cache_bytes / 2**30, 2),
                "kv_cache_tokens": self.report.kv_cache_tokens, "max_model_len": self.report.max_model_len,
                "max_concurrency": round(self.report.max_concurrency, 2)}


def _moves(model: ModelSpec, gpu: GpuSpec, cfg: EngineConfig, report: MemoryReport, gpu_count: int) -> list[dict]:
    c = report.config
    moves: list[dict] = []
    for tp in range(cfg.tensor_parallel_size + 1, gpu_count // cfg.pipeline_parallel_size + 1):
        if model.num_heads % tp == 0:
            moves.append({"tensor_parallel_size": tp})
    if c["gpu_memory_utilization"] < 0.95 and report.error_class != FailureClass.GPU_MEMORY_IN_USE:
        moves.append({"gpu_memory_utilization": 0.95})
    if cfg.kv_cache_dtype == "auto":
        moves.append({"kv_cache_dtype": "fp8"})
    if cfg.lora and cfg.lora.max_loras > 1:          # fewer adapter slots in every layer
        moves.append({"max_loras": cfg.lora.max_loras // 2})
    if cfg.lora and cfg.lora.max_lora_rank > 8:
        moves.append({"max_lora_rank": cfg.lora.max_lora_rank // 2})
    spec = cfg.speculative
    if spec and spec.method not in ("ngram", "suffix", "ngram_gpu") and report.first.speculative_weights_bytes:
        # speculation without a drafter on the GPU: n-gram lookup over the prompt
        moves.append({"speculative_config": {"method": "ngram", "num_speculative_tokens": spec.num_speculative_tokens
                                             or 2, "prompt_lookup_max": 4}})
    if report.estimated_max_model_len:   # vLLM's estimate sits on the limit; a round length below it has margin
        rounded = report.estimated_max_model_len * 95 // 100 // 1024 * 1024
        moves += [{"max_model_len": n} for n in (rounded, report.estimated_max_model_len) if n > 0]
    if model.quant is None and cfg.quantization is None and runs_on("fp8", gpu.compute_capability):
        moves.append({"quantization": "fp8"})
    if c["max_num_seqs"] > 1:
        moves.append({"max_num_seqs": max(1, c["max_num_seqs"] // 2)})
    if not cfg.enforce_eager and report.cuda_graphs_in_budget:
        moves.append({"enforce_eager": True})
    if report.error_class == FailureClass.GPU_MEMORY_IN_USE:
        free = report.total_memory_bytes - report.start_used_bytes
        moves.append({"gpu_memory_utilization": math.floor((free / report.total_memory_bytes - 0.01) * 100) / 100})
    return moves


def nearest_start(model: ModelSpec, gpu: GpuSpec, cfg: EngineConfig, version: Version, gpu_count: int,
                  report: MemoryReport, free_memory_bytes: int | None = None) -> NearestStart | None:
    """The first configuration, in the order above, with which vLLM starts (and is not at risk); None if no single
    change or pair of changes gets there."""
    if report.error_class == FailureClass.DTYPE_CAPABILITY:
        return None   # the GPU cannot run this build, dtype or method: no memory setting changes that
    moves = _moves(model, gpu, cfg, report, gpu_count)
    for size in (1, 2):
        for combo in itertools.combinations(moves, size):
            changes = {k: v for move in combo for k, v in move.items()}
            if len(changes) < sum(len(m) for m in combo):
                continue   # two values for one setting
            tried = cfg.with_flags(changes)
            used = tried.tensor_parallel_size * tried.pipeline_parallel_size * tried.data_parallel_size
            try:
                result = predict(model, gpu, tried, version, gpu_count=max(gpu_count, used),
                                 free_memory_bytes=free_memory_bytes)
            except UsageError:
                continue   # a combination vLLM refuses outright (e.g. fewer batched tokens than sequences)
            if result.verdict == "starts":
                return NearestStart(changes, result)
    return None
