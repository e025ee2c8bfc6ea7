"""Topology: the machines one vLLM replica may span, and how vLLM and Ray lay a TP x PP world out on them.

Tensor parallelism stays within a node (its all-reduce runs every layer, over NVLink or PCIe); pipeline stages go
across nodes (one activation send per stage boundary and step), as vLLM's multi-node guide and Ray's PACK placement
do: `--nodes N --gpus-per-node G` plans TP = G and one pipeline stage per node, on the fewest nodes that start it,
unless told otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oomguard.errors import UsageError


@dataclass(frozen=True)
class Topology:
    nodes: int = 1
    gpus_per_node: int = 1

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def fits(self, tensor_parallel_size: int, pipeline_parallel_size: int) -> bool:
        """TP within a node, and a replica that spans nodes takes whole nodes."""
        gpus = tensor_parallel_size * pipeline_parallel_size
        return tensor_parallel_size <= self.gpus_per_node and gpus <= self.gpus and (
            gpus <= self.gpus_per_node or gpus % self.gpus_per_node == 0)

    def pipeline_sizes(self) -> tuple[int, ...]:
        """Pipeline sizes worth searching when one node is not enough: one stage per node, 2 to N nodes."""
        return tuple(range(2, self.nodes + 1))

    def nodes_for(self, tensor_parallel_size: int, pipeline_parallel_size: int) -> int:
        """Nodes a TP x PP replica takes; refuses a layout that splits a TP group or leaves a node part used."""
        gpus = tensor_parallel_size * pipeline_parallel_size
        if tensor_parallel_size > self.gpus_per_node:
            raise UsageError(f"--tensor-parallel-size {tensor_parallel_size} would span nodes of "
                             f"{self.gpus_per_node} GPUs: tensor parallelism stays within a node and pipeline stages "
                             f"go across nodes (-tp {self.gpus_per_node} -pp {self.nodes})")
        if gpus > self.gpus:
            raise UsageError(f"tensor x pipeline parallel = {gpus} GPUs but {self.nodes} node(s) of "
                             f"{self.gpus_per_node} have {self.gpus}")
        if not self.fits(tensor_parallel_size, pipeline_parallel_size):
            raise UsageError(f"tensor x pipeline parallel = {gpus} GPUs do not fill whole nodes of "
                             f"{self.gpus_per_node}: a replica across nodes takes the same GPUs on each")
        return math.ceil(gpus / self.gpus_per_node)

    def assumption(self, tensor_parallel_size: int, pipeline_parallel_size: int, interconnect: str) -> str | None:
        """What a plan across nodes assumes about the links, for its assumptions (None on one node)."""
        nodes = math.ceil(tensor_parallel_size * pipeline_parallel_size / self.gpus_per_node)
        if nodes <= 1:
            return None
        return (f"{nodes} nodes of {self.gpus_per_node} GPUs: tensor parallelism ({tensor_parallel_size}) within a "
                f"node over {interconnect}, {pipeline_parallel_size} pipeline stages across nodes over the network "
                "between them, not NVLink (Ethernet or InfiniBand: each stage boundary sends one step's activations); "
                "memory per GPU planned as on one node: NCCL's buffers for the inter-node links are not modelled and "
                "no multi-node startup log is in the fitted data")
