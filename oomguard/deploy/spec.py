"""`Deployment`: one planned vLLM replica as the deployment targets need it, and the numbers they share.

Every figure comes from the plan that emitted it: the flags are those of the `vllm serve` line the plan printed,
the KV tokens vLLM's "GPU KV cache size", the concurrency the requests the KV cache holds (never more than
`max_num_seqs`). What a router may put on one replica is `KV_SAFETY_MARGIN` of those, the share at which
oomguard's own proxy pauses an engine (proxy/admission.py `Limits.high_watermark`, resuming below 80%).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from oomguard.engines.vllm.flags import set_flags, vllm_args
from oomguard.errors import UsageError
from oomguard.plan.topology import Topology
from oomguard.proxy.admission import Limits
from oomguard.units import GiB

KV_SAFETY_MARGIN = Limits().high_watermark   # 0.90: pause at 90% KV, resume below 80%

# The startup probe: the engine's own start after the weights are read (imports, the profile run, torch.compile
# without a warm cache, CUDA graph capture: minutes on large models), plus the weights read at a conservative rate.
ENGINE_START_SECONDS = 300
LOAD_BYTES_PER_SECOND = 250e6   # per node: a network volume or a SATA SSD (local NVMe reads several GB/s)
PROBE_PERIOD_SECONDS = 10

# `vllm serve` options the deployment targets set themselves (the port they probe, the name they route by) or that
# must come from a secret: a pasted command's values for them are left out of the manifests
ENGINE_OWNED = ("--host", "--port", "--served-model-name", "--api-key", "--model", "--config", "--uds")

GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}   # the device plugins' resource names

# Host resources of a pod (a rule of thumb, stated as one): CPUs for the API server, the engine core and a worker
# process per GPU; memory for the engine's processes, the plan's host memory for offloading (swap space, KV
# offloading) and the weights kept in CPU memory (--cpu-offload-gb, per GPU). The safetensors the loader maps are
# page cache, reclaimable, not counted.
CPUS_PER_GPU = 4
ENGINE_HOST_MEMORY_BYTES = 16 * GiB


@dataclass(frozen=True)
class Deployment:
    model_id: str                   # the checkpoint to serve (the name clients use)
    flags: Mapping[str, Any]        # vLLM flags by dest the plan's `vllm serve` line carries, TP and PP included
    extra_args: tuple[str, ...]     # the pasted command's other options, verbatim (ENGINE_OWNED ones removed)
    nodes: int                      # nodes one replica spans (pipeline stages across them)
    gpus_per_node: int              # GPUs the replica takes on each of them
    kv_cache_tokens: int            # vLLM's "GPU KV cache size" for this configuration, per replica
    max_concurrency: int            # requests the replica holds at once without preempting (<= max_num_seqs)
    weights_bytes: int              # the replica's weights over all its GPUs
    host_memory_bytes: int          # CPU memory the plan gives offloading (swap space, KV offloading), all GPUs
    vllm_version: str
    gpu_key: str                    # the GPU catalog's key, e.g. "h100-sxm-80gb"
    gpu_vendor: str                 # "nvidia" / "amd"

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.flags.get("tensor_parallel_size") or 1)

    @property
    def pipeline_parallel_size(self) -> int:
        return int(self.flags.get("pipeline_parallel_size") or 1)

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpu_resource(self) -> str:
        return GPU_RESOURCES.get(self.gpu_vendor, GPU_RESOURCES["nvidia"])

    @property
    def admit_kv_tokens(self) -> int:
        """KV tokens a router may have in flight on one replica: the safety margin of the planned KV cache."""
        return max(1, math.floor(self.kv_cache_tokens * KV_SAFETY_MARGIN))

    @property
    def admit_concurrency(self) -> int:
        """Requests a router may have in flight on one replica: the safety margin of the planned concurrency."""
        return max(1, math.floor(self.max_concurrency * KV_SAFETY_MARGIN))

    @property
    def startup_seconds(self) -> int:
        """A conservative bound on how long the replica takes to answer /health: engine start plus the weights of
        the busiest node read at LOAD_BYTES_PER_SECOND."""
        return math.ceil(ENGINE_START_SECONDS + self.weights_bytes / self.nodes / LOAD_BYTES_PER_SECOND)

    @property
    def startup_failure_threshold(self) -> int:
        """Probes `PROBE_PERIOD_SECONDS` apart that fit in `startup_seconds`."""
        return math.ceil(self.startup_seconds / PROBE_PERIOD_SECONDS)

    @property
    def pod_cpus(self) -> int:
        return CPUS_PER_GPU * self.gpus_per_node

    @property
    def pod_memory_gib(self) -> int:
        """Host memory of one pod, in whole GiB (CPUS_PER_GPU's comment says what it covers)."""
        offloaded = float(self.flags.get("cpu_offload_gb") or 0) * GiB * self.gpus_per_node
        return math.ceil((ENGINE_HOST_MEMORY_BYTES + self.host_memory_bytes / self.nodes + offloaded) / GiB)

    def pod_resources(self) -> dict:
        """A Kubernetes container's resources: the node's GPUs, and the host CPUs and memory above."""
        requests = {"cpu": str(self.pod_cpus), "memory": f"{self.pod_memory_gib}Gi",
                    self.gpu_resource: str(self.gpus_per_node)}
        return {"limits": {"memory": requests["memory"], self.gpu_resource: str(self.gpus_per_node)},
                "requests": requests}

    @property
    def name(self) -> str:
        return k8s_name(self.model_id)

    def args(self, *, without: tuple[str, ...] = ()) -> list[str]:
        """The `vllm serve` words after the model, less the flags (by dest) a target sets from its own fields."""
        return vllm_args({k: v for k, v in self.flags.items() if k not in without}, self.extra_args)


def k8s_name(model_id: str) -> str:
    """A DNS-1123 label from a model id: 'meta-llama/Llama-3.1-8B-Instruct' -> 'llama-3-1-8b-instruct'."""
    base = model_id.rstrip("/").rsplit("/", 1)[-1].lower()
    name = re.sub(r"[^a-z0-9]+", "-", base).strip("-")[:63].rstrip("-")
    return name or "model"


def portable_extra(extra: tuple[str, ...]) -> tuple[str, ...]:
    """A pasted command's other options less those the deployment targets own (and their values)."""
    out: list[str] = []
    skip_value = False
    for word in extra:
        if skip_value:
            skip_value = False
            if not word.startswith("-"):
                continue
        name = word.split("=", 1)[0].replace("_", "-")
        if name in ENGINE_OWNED:
            skip_value = "=" not in word
            continue
        out.append(word)
    return tuple(out)


def deployment(model_id: str, flags: Mapping[str, Any], report, gpu, *, topology: Topology | None = None,
               concurrency: int, extra: tuple[str, ...] = ()) -> Deployment:
    """The Deployment of a plan that starts: `report` its MemoryReport, `flags` its `vllm serve` flags by dest,
    `concurrency` the requests it holds at once (the workload's peak, or what the KV cache holds at max_model_len)."""
    flags = set_flags(flags)   # exactly what the `vllm serve` line carries
    if int(flags.get("data_parallel_size") or 1) > 1:
        raise UsageError("data parallel replicas are the deployment's replica count: plan one engine "
                         "(drop --data-parallel-size) and scale the replicas in the manifest")
    tp, pp = int(flags.get("tensor_parallel_size") or 1), int(flags.get("pipeline_parallel_size") or 1)
    topology = topology or Topology(1, tp * pp)
    nodes = topology.nodes_for(tp, pp)
    weights = sum(w.weights_bytes for w in report.workers) * tp   # every stage's ranks alike (memory.WorkerMemory)
    return Deployment(
        model_id=model_id, flags=MappingProxyType(flags), extra_args=portable_extra(tuple(extra)), nodes=nodes,
        gpus_per_node=tp * pp // nodes, kv_cache_tokens=report.kv_cache_tokens,
        max_concurrency=max(1, min(concurrency, report.config["max_num_seqs"])), weights_bytes=weights,
        host_memory_bytes=report.host_memory_bytes, vllm_version=report.vllm_version, gpu_key=gpu.key,
        gpu_vendor=gpu.vendor)
