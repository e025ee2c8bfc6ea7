"""Figures a vLLM start printed about its own memory, kept so that the next plan of the same setup uses them.

Every start prints the weights ("Model loading took") and the KV budget ("Available KV cache memory", V0's "reserved
for KV Cache is"); most print the CUDA-graph pool; V0's profiling summary, V1's DEBUG profile line and, from 0.26 at
INFO, "Actual usage is ..." add the activation peak and non-torch memory. Where those two are not printed, their sum
is what the budget left: requested - weights - KV [- the graph estimate, where graphs are in the budget]
(v1/worker/gpu_worker.py determine_available_memory, worker/worker.py determine_num_available_blocks), split in the
proportion the model predicts. The figures depend on the model, the GPU, the release and the settings that shape the
profile run and the graphs; not on the utilization or the context length, which move only the KV budget: a start at
0.85 tells what 0.92 will give, exactly.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields, replace
from typing import Mapping

from oomguard.units import GiB

# identical starts on one NVIDIA GPU repeat these figures to within the log's 0.01 GiB in most collected startup logs
# (llm-d-planner's sweep: 5 runs each of two models on an H100; 3 runs on an RTX A6000), and to 0.08 GiB in two starts
# of one A100 setup an evening apart (collected_a 009/010)
REPEAT_GIB = 0.1

# resolved settings that move only the KV budget or how it is cut into blocks, not the figures measured (not the KV
# cache dtype: it can pick another attention backend, whose buffers the profile run sees; two 0.24 H100 starts of one
# EAGLE-3 setup, fp8 and auto, differ by 0.49 GiB)
KV_ONLY_SETTINGS = frozenset({"gpu_memory_utilization", "max_model_len", "kv_cache_memory_bytes", "block_size",
                              "enable_prefix_caching"})


@dataclass(frozen=True)
class WorkerFigures:
    """One worker's memory figures, in bytes, as the model predicts them or a start measured them."""
    weights: int
    activation_peak: int
    non_torch: int
    cuda_graph: int
    cuda_graph_estimate: int


@dataclass(frozen=True)
class MeasuredFigures:
    """What one start's log stated, in bytes (None where it did not say)."""
    weights_bytes: int
    kv_cache_bytes: int | None = None
    activation_peak_bytes: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    cuda_graph_estimate_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    measured_at: str = ""

    @classmethod
    def from_log_facts(cls, facts: Mapping, gpu_memory_utilization: float | None,
                       measured_at: str = "") -> "MeasuredFigures | None":
        """From the facts diagnose reads in a startup log (oomguard/engines/vllm/startup_log.py); None without the
        weights line (nothing to learn)."""
        def gib(name: str) -> int | None:
            v = facts.get(name)
            return int(round(float(v) * GiB)) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        weights = gib("weights_gib")
        if weights is None:
            return None
        util = facts.get("gpu_memory_utilization")
        util = float(util) if isinstance(util, (int, float)) and not isinstance(util, bool) else gpu_memory_utilization
        return cls(weights, gib("available_kv_gib"), gib("activation_peak_gib"), gib("non_torch_gib"),
                   gib("cuda_graph_gib"), gib("cuda_graph_estimated_gib"), util, measured_at)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping) -> "MeasuredFigures | None":
        try:
            values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
            figures = cls(**values)
        except (TypeError, KeyError):
            return None
        ints = (figures.weights_bytes, figures.kv_cache_bytes, figures.activation_peak_bytes,
                figures.non_torch_bytes, figures.cuda_graph_bytes, figures.cuda_graph_estimate_bytes)
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in ints):
            return None
        return figures

    def applied(self, predicted: WorkerFigures, requested_then: int | None,
                graphs_in_budget: bool) -> tuple[WorkerFigures, frozenset[str]]:
        """The worker's figures with what was measured put in, and the names of the figures that now come from
        the log. `requested_then`: the memory vLLM requested at the measured start's utilization."""
        got = replace(predicted, weights=self.weights_bytes)
        measured = {"weights"}
        if self.cuda_graph_bytes is not None:
            got = replace(got, cuda_graph=self.cuda_graph_bytes)
            measured.add("cuda_graph")
        if self.cuda_graph_estimate_bytes is not None:
            got = replace(got, cuda_graph_estimate=self.cuda_graph_estimate_bytes)
            measured.add("cuda_graph_estimate")
        if self.activation_peak_bytes is not None and self.non_torch_bytes is not None:
            got = replace(got, activation_peak=self.activation_peak_bytes, non_torch=self.non_torch_bytes)
            measured |= {"activation_peak", "non_torch"}
        elif self.kv_cache_bytes is not None and requested_then is not None:
            left = requested_then - got.weights - self.kv_cache_bytes - \
                (got.cuda_graph_estimate if graphs_in_budget else 0)
            predicted_sum = predicted.activation_peak + predicted.non_torch
            if left >= 0 and predicted_sum > 0:
                activation = round(left * predicted.activation_peak / predicted_sum)
                got = replace(got, activation_peak=activation, non_torch=left - activation)
                measured |= {"activation_peak", "non_torch"}
        return got, frozenset(measured)


def setup_key(model_id: str, gpu_name: str, vllm_version: str, resolved_config: Mapping) -> str:
    """The setup measured figures belong to: the model, the GPU, the release, and every resolved setting but those
    that move only the KV budget."""
    settings = {k: v for k, v in resolved_config.items() if k not in KV_ONLY_SETTINGS}
    text = json.dumps([model_id, gpu_name, vllm_version, settings], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]
