"""Which GPUs this machine has, through NVML (`pip install oomguard[nvml]` brings the `pynvml` module)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from oomguard.gpus.catalog import find_gpu
from oomguard.gpus.spec import GpuSpec


@dataclass(frozen=True)
class DetectedGpu:
    index: int                 # NVML index (CUDA_VISIBLE_DEVICES, when a list of indices, selects among these)
    name: str
    total_bytes: int           # NVML's total: the board size nvidia-smi shows, a little MORE than CUDA's total
    free_bytes: int
    used_bytes: int
    spec: GpuSpec | None       # the catalog entry (its total is CUDA's), None for a GPU not in the catalog


def _visible(count: int) -> list[int]:
    """NVML indices CUDA would use: CUDA_VISIBLE_DEVICES when it lists indices, else all (UUIDs: all)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return list(range(count))
    try:
        wanted = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        return list(range(count))
    return [i for i in wanted if 0 <= i < count]


def detect_gpus() -> list[DetectedGpu]:
    """The visible GPUs with their memory right now; [] without the pynvml module or a driver. Never raises."""
    try:
        import pynvml
    except Exception:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    found = []
    try:
        for i in _visible(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(DetectedGpu(index=i, name=name, total_bytes=int(mem.total), free_bytes=int(mem.free),
                                     used_bytes=int(mem.used), spec=find_gpu(name, int(mem.total))))
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return found
