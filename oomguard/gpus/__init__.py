"""GPU knowledge: GpuSpec, the catalog with CUDA-reported totals, NVML detection."""

from oomguard.gpus.spec import GpuSpec

__all__ = ["GpuSpec"]
