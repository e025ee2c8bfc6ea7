"""The numbers inside an out-of-memory message (PyTorch's caching allocator, old and new formats; ggml-cuda).

PyTorch >= 2.1 (c10/cuda/CUDACachingAllocator.cpp):
  "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.24 GiB is
   free. Process 4242 has 10.00 GiB memory in use. Including non-PyTorch memory, this process has 12.40 GiB memory
   in use. Of the allocated memory 11.80 GiB is allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but
   unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=..."
  ("Process N has X memory in use" is another process; "this process has" is the one that failed.)
PyTorch < 2.1:
  "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 3.44 MiB free;
   14.68 GiB reserved in total by PyTorch)"
"""

from __future__ import annotations

import re

_UNIT = {"b": 1 / (1 << 30), "kib": 1 / (1 << 20), "kb": 1 / (1 << 20), "mib": 1 / 1024, "mb": 1 / 1024,
         "gib": 1.0, "gb": 1.0, "tib": 1024.0, "tb": 1024.0, "bytes": 1 / (1 << 30)}
# the look-behind starts a number only at its first digit: without it a long run of digits is quadratic
_SIZE = r"(?<![\d.])(\d+(?:\.\d+)?)\s*(bytes|[KMGT]i?B|B)\b"

_PATTERNS = {
    "tried_gib": re.compile(r"Tried to allocate " + _SIZE, re.I),
    "total_gib": re.compile(r"(?:has a total capac(?:i)?ty of |;\s*)" + _SIZE + r"(?: total capac(?:i)?ty)?(?= of which|;)", re.I),
    "free_gib": re.compile(r"(?:of which |;\s*)" + _SIZE + r" (?:is )?free", re.I),
    "self_gib": re.compile(r"this process has " + _SIZE + r" memory in use", re.I),
    "allocated_gib": re.compile(r"(?:Of the allocated memory |;\s*)" + _SIZE + r" (?:is )?(?:already )?allocated", re.I),
    "reserved_unallocated_gib": re.compile(_SIZE + r" is reserved by PyTorch but unallocated", re.I),
    "reserved_gib": re.compile(_SIZE + r" reserved in total by PyTorch", re.I),
    "tried_mib_ggml": re.compile(r"allocating (\d+(?:\.\d+)?) (MiB) on device", re.I),
}
_GPU = re.compile(r"GPU (\d+)(?: has a total capac|;)", re.I)
_OTHER = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use", re.I)


def gib(value: str, unit: str) -> float:
    return float(value) * _UNIT.get(unit.lower(), 1.0)


_ANY_SIZE = re.compile(_SIZE, re.I)


def sizes_gib(text: str) -> list[float]:
    """Every size written in `text` ("11.4 GiB", "512 MiB", "0 B"), in GiB."""
    return [gib(value, unit) for value, unit in _ANY_SIZE.findall(text)]


def parse(text: str) -> dict:
    """Numbers of one OOM message, all in GiB: tried, total, free, self, other processes (pid -> GiB)."""
    out: dict = {}
    for key, regex in _PATTERNS.items():
        match = regex.search(text)
        if match:
            name = "tried_gib" if key == "tried_mib_ggml" else key
            out.setdefault(name, round(gib(match.group(1), match.group(2)), 4))
    gpu = _GPU.search(text)
    if gpu:
        out["gpu_index"] = int(gpu.group(1))
    others = {}
    for pid, value, unit in _OTHER.findall(text):
        others[pid] = round(gib(value, unit), 4)
    if others and "self_gib" not in out:
        # In a container NVML reports host pids, so PyTorch lists the failing process itself as "Process N": the
        # one that holds at least what PyTorch allocated (else the largest) is this process, not another.
        allocated = out.get("allocated_gib", 0.0)
        holders = [pid for pid, used in others.items() if used >= allocated] or list(others)
        me = max(holders, key=lambda pid: others[pid]) if not allocated else min(holders, key=lambda p: others[p])
        out["self_gib"] = others.pop(me)
    if others:
        out["other_processes_gib"] = others
        out["other_total_gib"] = round(sum(others.values()), 4)
    return out
