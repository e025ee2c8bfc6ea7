"""GpuSpec: what the planner needs to know about one GPU."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    total_memory_bytes: int
    compute_capability: tuple[int, int]
    supports_bf16: bool
    supports_fp8: bool
    memory_bandwidth_bytes_per_s: float
    bf16_dense_flops: float
    pcie_bandwidth_bytes_per_s: float
    interconnect: str
    source_url: str
