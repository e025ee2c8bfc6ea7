"""How fast a planned configuration can go, from a roofline of its GPUs (an upper bound, never a promise).

Decode is bandwidth-bound: every step reads the weights a GPU holds (for MoE, only the experts the batch
touches) plus the KV cache of every running request. Prefill is compute-bound: 2 FLOPs per active parameter
per token. Weights offloaded to the CPU cross the host link (PCIe) on every forward pass: with UVA
(`--cpu-offload-gb`) the GPU reads them over the link while it computes, so their time adds; with prefetch
offloading (vLLM >= 0.17) the copy overlaps the other layers' work, so the slower of the two sets the pace.
Assumed: no kernel inefficiency, no TP communication cost, no speed-up from pipeline parallelism at decode
(its stages run one after another for a step). Figures are per replica.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.engines.vllm.memory import MemoryReport
from oomguard.gpus.roofline import Roofline
from oomguard.gpus.spec import GpuSpec
from oomguard.models.params import parameter_counts
from oomguard.models.spec import ModelSpec


@dataclass(frozen=True)
class Speed:
    decode_tokens_per_s: float      # all running requests together, every request at the stated context
    per_request_tokens_per_s: float
    prefill_tokens_per_s: float
    step_seconds: float
    bound: str                      # "memory bandwidth", "compute" or "PCIe (offloaded weights)"
    offload_seconds_per_step: float = 0.0

    def to_dict(self) -> dict:
        return {"decode_tokens_per_s": round(self.decode_tokens_per_s, 1),
                "per_request_tokens_per_s": round(self.per_request_tokens_per_s, 2),
                "prefill_tokens_per_s": round(self.prefill_tokens_per_s), "step_ms": round(self.step_seconds * 1e3, 2),
                "bound": self.bound, "offload_ms_per_step": round(self.offload_seconds_per_step * 1e3, 2)}


def decode_speed(model: ModelSpec, report: MemoryReport, gpu: GpuSpec, batch: int, context: int,
                 offload_backend: str = "uva") -> Speed:
    """Decode and prefill rates of `batch` requests of `context` tokens each on the planned configuration."""
    total_params, active_params, expert_share = parameter_counts(model)
    tp = report.config["tensor_parallel_size"]
    touched = 1.0
    if model.moe:  # expected share of experts at least one of the batch's tokens is routed to
        touched = 1 - (1 - model.moe.top_k / model.moe.num_experts) ** batch
    step = compute = offload = 0.0
    for worker in report.workers:  # pipeline stages run one after another within a step
        share = worker.layers / model.num_layers
        roofline = Roofline(flops_per_token=2 * active_params * share / tp,
                            weight_bytes=worker.weights_bytes * (1 - expert_share * (1 - touched)),
                            kv_bytes_per_token=worker.bytes_per_block / report.block_size,
                            peak_flops=gpu.bf16_dense_flops, bandwidth=gpu.memory_bandwidth_bytes_per_s)
        step += roofline.gpu_seconds(batch, batch * context)
        compute += roofline.compute_seconds(batch)
    offloaded = report.config.get("cpu_offload_gb") or 0.0
    bound = "compute" if compute >= step else "memory bandwidth"
    if offloaded:
        offload = offloaded * (1 << 30) * len(report.workers) / gpu.pcie_bandwidth_bytes_per_s
        step = step + offload if offload_backend == "uva" else max(step, offload)
        if offload > step / 2:
            bound = "PCIe (offloaded weights)"
    prefill = gpu.bf16_dense_flops * tp / (2 * active_params)
    return Speed(decode_tokens_per_s=batch / step, per_request_tokens_per_s=1 / step, prefill_tokens_per_s=prefill,
                 step_seconds=step, bound=bound, offload_seconds_per_step=offload)
