"""Host memory that vLLM's offloading options take, and what they buy. None of them adds GPU KV capacity: the GPU
blocks are counted from the GPU budget alone (v1/core/kv_cache_utils.py), whatever sits behind them in CPU memory.

- --swap-space GiB (vllm/config/cache.py, default 4): V0 allocates that much pinned CPU memory per GPU as CPU KV blocks
  (worker/worker.py determine_num_available_blocks: num_cpu_blocks = swap_space_bytes // block bytes) and swaps
  preempted sequences there instead of recomputing them. V1 never swaps (a preempted request is recomputed); it keeps
  the flag only for a CPU-memory warning (CacheConfig.verify_with_parallel_config) until 0.20 removes it.
- --kv-offloading-size GiB with --kv-offloading-backend native|lmcache (vllm/config/cache.py, from 0.12): a CPU buffer,
  the size summed over TP ranks, that keeps evicted prefix blocks so a later hit loads them instead of recomputing.
- --kv-transfer-config with an offloading connector (OffloadingConnector, LMCacheConnectorV1): the same idea, sized in
  the connector's own settings (kv_connector_extra_config).
"""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.engines.vllm.releases import VllmRelease
from oomguard.engines.vllm.versions import fmt
from oomguard.units import GiB

V0_SWAP_DEFAULT_GIB = 4.0     # CacheConfig.swap_space's default
# KV connectors that offload to CPU (or further) rather than move KV between instances
OFFLOADING_CONNECTORS = ("OffloadingConnector", "LMCacheConnectorV1", "LMCacheConnector", "LMCacheMPConnector")


@dataclass(frozen=True)
class OffloadConfig:
    swap_space_gib: float | None = None        # --swap-space, per GPU
    kv_offloading_gib: float | None = None     # --kv-offloading-size, all TP ranks together
    kv_offloading_backend: str | None = None   # --kv-offloading-backend
    kv_connector: str | None = None            # --kv-transfer-config's kv_connector
    kv_connector_cpu_gib: float | None = None  # OffloadingConnector's cpu_bytes_to_use, per engine, in GiB

    kv_connector_rank_gib: float | None = None  # LMCache's lmcache.max_local_cpu_size, per rank

    @classmethod
    def from_flags(cls, flags: dict) -> OffloadConfig | None:
        transfer = flags.get("kv_transfer_config") or {}
        extra = transfer.get("kv_connector_extra_config") or {}
        # config/vllm.py VllmConfig._post_init_kv_transfer_config writes these two for --kv-offloading-size
        engine_bytes, rank_gib = extra.get("cpu_bytes_to_use"), extra.get("lmcache.max_local_cpu_size")
        config = cls(flags.get("swap_space"), flags.get("kv_offloading_size"), flags.get("kv_offloading_backend"),
                     transfer.get("kv_connector"), _number(engine_bytes) / GiB if engine_bytes else None,
                     _number(rank_gib))
        return config if config != cls() else None


@dataclass(frozen=True)
class HostMemory:
    """CPU memory the engine takes for offloading on this machine, and what the user should know about it."""

    bytes: int
    notes: tuple[str, ...]
    error: str | None = None   # vLLM refuses the flags


def _number(value) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def host_memory(cfg: OffloadConfig | None, rel: VllmRelease, engine: str, world_size: int,
                ranks_per_engine: int) -> HostMemory:
    """Host memory for offloading, for all `world_size` GPUs, as this release sizes it."""
    engines = max(world_size // ranks_per_engine, 1)
    cfg = cfg or OffloadConfig()
    notes: list[str] = []
    total = 0.0
    swap = cfg.swap_space_gib
    if swap is not None and not rel.swap_space_flag:
        return HostMemory(0, (), f"vLLM {fmt(rel.version)} has no --swap-space (removed in 0.20: V1 "
                                 "recomputes preempted requests instead of swapping them): drop it")
    if engine == "v0":
        swap = V0_SWAP_DEFAULT_GIB if swap is None else swap
        total += swap * world_size
        notes.append(f"swap space: {swap:g} GiB of pinned CPU memory per GPU for preempted sequences (V0 swaps them "
                     "out instead of recomputing); it adds no GPU KV capacity")
    elif swap:
        notes.append(f"--swap-space {swap:g} is ignored by the V1 engine: it never swaps (a preempted request is "
                     "recomputed) and takes no CPU memory for it; it adds no GPU KV capacity")
    if cfg.kv_offloading_gib is not None or cfg.kv_offloading_backend is not None:
        if not rel.kv_offloading_flags:
            return HostMemory(0, (), f"vLLM {fmt(rel.version)} has no --kv-offloading-size (native KV offloading "
                                     "came in 0.12): drop it, or plan --vllm-version 0.12.0 or later")
        if cfg.kv_offloading_gib is None or cfg.kv_offloading_backend is None:
            return HostMemory(0, (), "--kv-offloading-size and --kv-offloading-backend go together "
                                     "(vllm/config/cache.py): give both")
        total += cfg.kv_offloading_gib * engines   # the size is summed over one engine's TP x PP ranks
        notes.append(f"KV offloading ({cfg.kv_offloading_backend}): {cfg.kv_offloading_gib:g} GiB of CPU memory per "
                     "engine keeps evicted prefix blocks, so a later prefix hit or a preempted request reloads them "
                     "instead of recomputing; the GPU KV capacity is unchanged")
    if cfg.kv_connector:
        if cfg.kv_connector in OFFLOADING_CONNECTORS:
            engine_gib = cfg.kv_connector_cpu_gib or (cfg.kv_connector_rank_gib or 0) * ranks_per_engine
            size = f"{engine_gib:g} GiB per engine" if engine_gib else "the size its own settings give"
            if cfg.kv_offloading_gib is None:   # else --kv-offloading-size wrote this config and is counted above
                total += engine_gib * engines
            notes.append(f"{cfg.kv_connector}: {size} of CPU memory for offloaded KV blocks (less recomputation after "
                         "preemption or eviction); the GPU KV capacity is unchanged")
        else:
            notes.append(f"{cfg.kv_connector} moves KV between instances (disaggregated serving); its buffers are not "
                         "counted here")
    return HostMemory(int(total * GiB), tuple(notes))
