"""The GPU catalog (catalog.json, read on first use), forgiving name lookup, and custom GPUs for --gpu-memory."""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import replace
from functools import lru_cache
from importlib import resources

from oomguard.errors import UsageError
from oomguard.gpus.spec import GpuSpec
from oomguard.units import GiB

# Usable host-link bandwidth per direction (about 80% of the PCIe line rate), for offload estimates.
HOST_LINKS = {
    "gen3x16": 12e9,
    "gen4x8": 12.5e9,
    "gen4x16": 25e9,
    "gen5x8": 25e9,
    "gen5x16": 50e9,
    "c2c": 450e9,  # GH200 NVLink-C2C between Grace and Hopper, 900 GB/s both ways
}

# Words that only decorate a name: "NVIDIA GeForce RTX 4090" and "4090" are the same GPU.
_NOISE = {"nvidia", "geforce", "tesla", "amd", "instinct", "rtx", "gpu", "graphics"}

# --gpu-memory GIB: a GPU we know nothing else about. Modern enough for bf16 (cc 8.0) so dtype "auto" resolves as on
# any current card; bandwidth, compute and host link at the low end of the catalog (L4-class, PCIe gen3) so time and
# offload estimates err on the slow side.
CUSTOM_COMPUTE_CAPABILITY = (8, 0)
CUSTOM_BANDWIDTH = 300e9
CUSTOM_BF16_FLOPS = 60e12
CUSTOM_HOST_LINK = HOST_LINKS["gen3x16"]
MAX_CUSTOM_GIB = 1024.0


def normalize(text: str) -> str:
    """Lower case, no spaces/dashes/punctuation, no vendor or brand words: ' NVIDIA GeForce RTX-4090 ' -> '4090'."""
    words = [w for w in re.findall(r"[a-z0-9]+", str(text).lower()) if w not in _NOISE]
    joined = "".join(words)
    return joined[3:] if joined.startswith("rtx") and len(joined) > 3 else joined


def _spec(entry: dict) -> GpuSpec:
    cc = tuple(entry["compute_capability"])
    return GpuSpec(
        key=entry["key"],
        name=entry["name"],
        total_memory_bytes=int(round(entry["total_memory_gib"] * GiB)),
        compute_capability=cc,
        supports_bf16=cc >= (8, 0),
        supports_fp8=entry.get("supports_fp8", cc >= (8, 9)),
        memory_bandwidth_bytes_per_s=entry["memory_bandwidth_gb_s"] * 1e9,
        bf16_dense_flops=entry["bf16_dense_tflops"] * 1e12,
        pcie_bandwidth_bytes_per_s=HOST_LINKS[entry["host_link"]],
        interconnect=entry["interconnect"],
        source_url=entry["source_url"],
        vendor=entry.get("vendor", "nvidia"),
        total_memory_source_url=entry.get("total_memory_source_url", ""),
        total_memory_note=entry.get("total_memory_note", ""),
        multiprocessors=entry.get("multiprocessors", 0),
        unified_memory=entry.get("unified_memory", False),
        free_at_start_low_bytes=int(entry.get("free_at_start_low_gib", 0) * GiB),
        gfx_arch=entry.get("gfx_arch", ""),
        arm_host=entry.get("arm_host", False),
        nvlink_multicast=entry.get("nvlink_multicast", False),
    )


@lru_cache(maxsize=1)
def _load() -> tuple[tuple[dict, ...], dict[str, GpuSpec], dict[str, str]]:
    text = resources.files("oomguard.gpus").joinpath("catalog.json").read_text(encoding="utf-8")
    entries = tuple(json.loads(text)["gpus"])
    specs = {e["key"]: _spec(e) for e in entries}
    aliases: dict[str, str] = {}  # normalized spelling -> key
    for e in entries:
        for spelling in (e["key"], e["name"], *e.get("aliases", ())):
            owner = aliases.setdefault(normalize(spelling), e["key"])
            if owner != e["key"]:
                raise ValueError(f"catalog.json: {spelling!r} names both {owner} and {e['key']}")
    return entries, specs, aliases


def catalog_entries() -> list[dict]:
    """The raw catalog records (board size, provenance notes) for listings and tests."""
    return [dict(e) for e in _load()[0]]


def list_gpus() -> list[GpuSpec]:
    """Every catalog GPU, in catalog order (for `oomguard plan --list-gpus`)."""
    return list(_load()[1].values())


def _spellings() -> dict[str, str]:
    """normalized -> the spelling to suggest (the shortest alias of each GPU reads best)."""
    out: dict[str, str] = {}
    for e in _load()[0]:
        for spelling in (*e.get("aliases", ()), e["key"]):
            out.setdefault(normalize(spelling), spelling)
    return out


# What the vendor tools print around a name: `nvidia-smi -L` ("GPU 0: NAME (UUID: GPU-...)"), `rocm-smi
# --showproductname` ("GPU[0] : Card Series: NAME"); rocm-smi's "GFX Version" and torch's gcnArchName give the
# architecture ("gfx942", "gfx90a:sramecc+:xnack-").
_TOOL_PREFIX = re.compile(r"^\s*(?:GPU\s*\[?\d+\]?\s*:\s*)?(?:card\s+(?:series|model)\s*:\s*)?", re.IGNORECASE)
_UUID_SUFFIX = re.compile(r"\s*\(UUID:[^)]*\)\s*$", re.IGNORECASE)
_GFX = re.compile(r"(?:gfx\s*version\s*:\s*)?(gfx[0-9a-f]+)(?::[\w+-]+)*", re.IGNORECASE)
# nvidia-smi's table cuts a name longer than its column to the first 24 characters and "..." ("NVIDIA RTX 6000 Ada
# Gene...", "NVIDIA GeForce RTX 4070 ..."): the full name is longer than what is left
_TRUNCATED = re.compile(r"^(.+?)(?:\.\.\.|\u2026)\s*$")


# An NVIDIA vGPU reports its profile, not its board: "GRID A100-40C", "NVIDIA L40S-48Q", "NVIDIA H100XM-80C",
# "NVIDIA RTX Pro 6000 Blackwell DC-4-96Q". The type is board + "-" + [GPU instances "-" when MIG-backed] +
# framebuffer in GiB (40C = 40960 MiB) + series A/B/C/Q [+ a MIG attribute ME/NOME/MEALL/GFX], the form
# NVIDIA/vgpu-device-manager parses (pkg/types/vgpu_type.go); nvidia-smi prefixes "NVIDIA " or "GRID ".
_VGPU = re.compile(r"^(?:grid\s+)?(?P<board>.+?)-(?:(?P<instances>\d+)-)?(?P<fb>\d+)[abcq](?:meall|nome|me|gfx)?$",
                   re.IGNORECASE)
# What CUDA's total lacks from the profile's framebuffer inside the guest. nvidia-smi there prints the profile's size
# (98304 MiB for DC-4-96Q); 12 vLLM 0.13 logs on DC-4-96Q imply a total of 95.66 GiB (median, 94.8-96.1) when the
# planner's other figures are taken as right: 96 - 0.34 GiB, what an RTX 4090 loses between nvidia-smi's 24564 MiB
# and CUDA's 23.65 GiB. It is more than the bare board's 94.97 GiB: the profile, not the board's total, sets it.
VGPU_GUEST_RESERVED_GIB = 0.34


def _vgpu(text: str) -> GpuSpec | None:
    """The spec an NVIDIA vGPU profile name stands for: its board's, with the total taken from the profile's
    framebuffer (all a vGPU sees), or None when the name is no profile of a catalog board."""
    text = text.strip()
    match = _VGPU.match(text)
    if not match:
        return None
    entries, specs, aliases = _load()
    key = aliases.get(normalize(match.group("board")))
    entry = next((e for e in entries if e["key"] == key), None)
    framebuffer = int(match.group("fb"))
    # a profile larger than its board means the board part named some other GPU
    if entry is None or entry.get("vendor", "nvidia") != "nvidia" or not 0 < framebuffer <= entry["board_memory_gib"]:
        return None
    board = specs[key]
    profile = re.sub(r"^(?:nvidia|grid)[\s-]+", "", text, flags=re.IGNORECASE).split()[-1]
    mig = f" (MIG-backed, {match.group('instances')} GPU instances)" if match.group("instances") else ""
    note = (f"NVIDIA vGPU profile {profile}{mig} on the {board.name}: the guest sees only the profile's "
            f"{framebuffer} GiB framebuffer ({framebuffer * 1024} MiB in its nvidia-smi; the board has "
            f"{entry['board_memory_gib']} GB), so total = {framebuffer} - {VGPU_GUEST_RESERVED_GIB} GiB, the CUDA "
            "reservation fitted to vLLM logs on DC-4-96Q. Bandwidth and compute are the board's")
    return replace(board, key=f"{board.key}/{profile.lower()}", name=text, total_memory_source_url="",
                   total_memory_bytes=int(round((framebuffer - VGPU_GUEST_RESERVED_GIB) * GiB)), total_memory_note=note)


def _one_of(keys: list[str], what: str, hint: str) -> GpuSpec:
    if len(keys) == 1:
        return _load()[1][keys[0]]
    raise UsageError(f"{what} names several catalog GPUs: {', '.join(keys)}; {hint}")


def resolve_gpu(text: str) -> GpuSpec:
    """A catalog GPU from a forgiving name: 'h100', 'A100-40GB', 'rtx4090', 'NVIDIA GeForce RTX 4090', 'l40s' ...,
    also as nvidia-smi and rocm-smi print it (a line of `nvidia-smi -L`, a name cut short by nvidia-smi's table, a
    rocm-smi "Card Series" line, an NVIDIA vGPU profile such as 'GRID A100-40C', or an AMD architecture such as
    'gfx950' when one catalog GPU has it)."""
    entries, specs, aliases = _load()
    text = _UUID_SUFFIX.sub("", _TOOL_PREFIX.sub("", str(text)))
    cut = _TRUNCATED.match(text)
    if cut and cut.group(1).strip():
        start = cut.group(1).lower()
        keys = [e["key"] for e in entries if any(n.lower().startswith(start) and len(n) > len(start)
                                                 for n in (e["name"], *e.get("aliases", ())))]
        if keys:
            return _one_of(keys, f"'{text.strip()}'", "nvidia-smi --query-gpu=name --format=csv,noheader prints the "
                                                       "whole name; give it, or one of these keys, with --gpu")
    key = aliases.get(normalize(text))
    if key is not None:
        return specs[key]
    vgpu = _vgpu(text)
    if vgpu is not None:
        return vgpu
    gfx = _GFX.fullmatch(text.strip())
    if gfx:
        arch = gfx.group(1).lower()
        keys = [e["key"] for e in entries if e.get("gfx_arch") == arch]
        if keys:
            return _one_of(keys, arch, "give the GPU's name (rocm-smi --showproductname) or one of these keys")
    spellings = _spellings()
    close = difflib.get_close_matches(normalize(text), list(spellings), n=3, cutoff=0.6)
    hint = f": did you mean {', '.join(spellings[c] for c in close)}?" if close else "."
    raise UsageError(f"unknown GPU '{text}'{hint} Use --gpu-memory GIB for a GPU not in the catalog "
                     "(list: oomguard plan --list-gpus)")


def find_gpu(name: str, total_bytes: int | None = None) -> GpuSpec | None:
    """The catalog GPU for a device name as NVML/torch report it, or None. With `total_bytes` (any total: NVML's or
    CUDA's), a GPU whose memory is more than 10% away is not a match (an 8 GB RTX 4060 Ti is not the 16 GB one)."""
    key = _load()[2].get(normalize(name))
    spec = _load()[1][key] if key is not None else _vgpu(name)
    if spec is None:
        return None
    if total_bytes and abs(total_bytes - spec.total_memory_bytes) > 0.1 * spec.total_memory_bytes:
        return None
    return spec


def custom_gpu(total_gib: float, name: str = "custom") -> GpuSpec:
    """A GPU known only by the total memory CUDA reports (--gpu-memory GIB). Other figures are the conservative
    defaults above: cc 8.0 (bf16, no FP8), 300 GB/s, 60 TFLOPS, PCIe gen3 host link."""
    if isinstance(total_gib, bool) or not isinstance(total_gib, (int, float)) or not math.isfinite(total_gib):
        raise UsageError(f"--gpu-memory must be a number of GiB, e.g. --gpu-memory 23.6 (got {total_gib!r})")
    if total_gib <= 0 or total_gib > MAX_CUSTOM_GIB:
        raise UsageError(f"--gpu-memory {total_gib:g} is not a plausible GPU: give the total in GiB as CUDA reports "
                         f"it (e.g. 79.19 for an H100 80GB), between 0 and {MAX_CUSTOM_GIB:g}")
    return GpuSpec(
        key=f"custom-{total_gib:g}gib",
        name=name,
        total_memory_bytes=int(round(total_gib * GiB)),
        compute_capability=CUSTOM_COMPUTE_CAPABILITY,
        supports_bf16=True,
        supports_fp8=False,
        memory_bandwidth_bytes_per_s=CUSTOM_BANDWIDTH,
        bf16_dense_flops=CUSTOM_BF16_FLOPS,
        pcie_bandwidth_bytes_per_s=CUSTOM_HOST_LINK,
        interconnect="pcie",
        source_url="",
        vendor="unknown",
        total_memory_note="given with --gpu-memory",
    )
