"""KV cache layout: per-layer specs, grouping, blocks, tokens, concurrency and the fit check, per vLLM version.

One small spec per attention kind (as vllm/v1/kv_cache_interface.py), each answering two questions:
bytes per block page, and worst-case bytes one request of max_model_len needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import Version
from oomguard.errors import NotSupportedError
from oomguard.units import cdiv


@dataclass(frozen=True)
class KvElement:
    """How a --kv-cache-dtype stores one head's K (or V) of one token: bytes per element, and the scale each (token,
    head) carries in the per-token-head modes (kv_cache_interface.py AttentionSpec.page_size_bytes, 0.20+)."""

    bytes: float
    scale_bytes: int = 0


# --kv-cache-dtype -> storage; None: the model's dtype. Which packed names a release accepts: releases.py
# packed_kv_cache_dtypes
KV_CACHE_DTYPES: dict[str, KvElement | None] = {
    "auto": None, "bfloat16": KvElement(2), "float16": KvElement(2), "half": KvElement(2), "float": KvElement(4),
    "float32": KvElement(4), "int8": KvElement(1), "fp8": KvElement(1), "fp8_e4m3": KvElement(1),
    "fp8_e5m2": KvElement(1), "fp8_inc": KvElement(1), "fp8_ds_mla": KvElement(1),
    # utils/torch_utils.py nvfp4_kv_cache_full_dim: two fp4 values a byte and one fp8 scale per 16 (head_size // 2 +
    # head_size // 16); nvfp4_4over6 is the same layout
    "nvfp4": KvElement(0.5 + 1 / 16), "nvfp4_4over6": KvElement(0.5 + 1 / 16),
    # AttentionSpec.page_size_bytes: one fp32 scale per token and head for each of K and V
    "int8_per_token_head": KvElement(1, 4), "fp8_per_token_head": KvElement(1, 4),
    "int4_per_token_head": KvElement(0.5, 4),   # real_page_size_bytes: head_size // 2
}
# --kv-cache-dtype values vLLM accepts whose slot size each attention backend sets itself (turboquant_attn.py,
# rocm_octave_attn.py, ultraquant_attn.py, FlashMLA-sparse's nvfp4_ds_mla): not modelled
KV_CACHE_DTYPES_NOT_MODELLED = ("turboquant_", "octave_", "ultraquant_", "nvfp4_ds_mla")


@dataclass(frozen=True)
class FullAttentionSpec:
    """Full attention: K and V pages for every token (kv_cache_interface.FullAttentionSpec)."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype_bytes: float
    scale_bytes: int = field(default=0, kw_only=True)   # per token, head and side (KvElement.scale_bytes)

    @property
    def page_size_bytes(self) -> int:
        """AttentionSpec.page_size_bytes: K and V."""
        return 2 * self.block_size * self.num_kv_heads * (int(self.head_size * self.dtype_bytes) + self.scale_bytes)

    def max_memory_usage_bytes(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Worst-case bytes one request needs: every token of max_model_len."""
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes

    def as_full_attention(self) -> FullAttentionSpec:
        """The spec without its window (unify_hybrid_kv_cache_specs, when the hybrid manager is off)."""
        return FullAttentionSpec(self.block_size, self.num_kv_heads, self.head_size, self.dtype_bytes,
                                 scale_bytes=self.scale_bytes)


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    window: int = 0

    def max_memory_usage_bytes(self, max_model_len: int, in_flight_tokens: int) -> int:
        """SlidingWindowSpec: the window plus the tokens in flight, and one more block because the window's
        start need not sit on a block boundary."""
        tokens = min(self.window - 1 + in_flight_tokens, max_model_len)
        return (cdiv(tokens, self.block_size) + 1) * self.page_size_bytes


@dataclass(frozen=True)
class ChunkedLocalAttentionSpec(FullAttentionSpec):
    window: int = 0   # attention_chunk_size

    def max_memory_usage_bytes(self, max_model_len: int, in_flight_tokens: int) -> int:
        """ChunkedLocalAttentionSpec: one chunk plus the tokens in flight."""
        tokens = min(self.window + in_flight_tokens, max_model_len)
        return cdiv(tokens, self.block_size) * self.page_size_bytes


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    """MLA: one latent tensor (kv_lora_rank + rope dim) per token, shared by all heads."""

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * int(self.head_size * self.dtype_bytes)

    def as_full_attention(self) -> MLAAttentionSpec:
        return self


@dataclass(frozen=True)
class UniformTypeSpec:
    """Layers of one attention type and block size but different pages (kv_cache_interface.UniformTypeKVCacheSpecs,
    0.11+): one group whose block holds a page of every layer (DeepSeek-V3.2: the MLA latent and the indexer's K)."""

    specs: tuple[FullAttentionSpec, ...]

    @property
    def block_size(self) -> int:
        return self.specs[0].block_size

    @property
    def page_size_bytes(self) -> int:
        return sum(s.page_size_bytes for s in self.specs)

    def max_memory_usage_bytes(self, max_model_len: int, in_flight_tokens: int) -> int:
        """The most pages any layer needs, times the summed page."""
        pages = max(cdiv(s.max_memory_usage_bytes(max_model_len, in_flight_tokens), s.page_size_bytes)
                    for s in self.specs)
        return pages * self.page_size_bytes

    def as_full_attention(self) -> UniformTypeSpec:
        return self


@dataclass(frozen=True)
class MambaSpec:
    """A linear-attention (Gated DeltaNet) or Mamba layer's recurrent state (kv_cache_interface.MambaSpec): a fixed
    number of pages per request whatever its length, each padded to the attention page so all layers share blocks."""

    block_size: int              # mamba_block_size: max_model_len without prefix caching
    state_bytes: int             # conv + temporal state of one request on this rank
    page_size_bytes: int         # the state padded to the attention page (mamba_page_size_padded)
    pages_per_request: int       # 1 without prefix caching; 2 in "align" mode (+1 prefill checkpoint where used)

    def max_memory_usage_bytes(self, max_model_len: int, in_flight_tokens: int) -> int:
        return self.pages_per_request * self.page_size_bytes

    def as_full_attention(self) -> MambaSpec:
        return self


KvSpec = FullAttentionSpec | MambaSpec | UniformTypeSpec   # each answers page_size_bytes and max_memory_usage_bytes


@dataclass(frozen=True)
class KvGroup:
    spec: KvSpec
    num_layers: int


@dataclass(frozen=True)
class KvLayout:
    """The KV cache groups of one worker, as vllm/v1/core/kv_cache_utils.py:get_kv_cache_groups builds them."""

    groups: tuple[KvGroup, ...]
    group_size: int          # layers per group; each block holds group_size pages of every group
    padding_layers: int = 0

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs across all groups (num_blocks = available // this)."""
        return self.group_size * self.groups[0].spec.page_size_bytes if len(self.groups) > 1 else \
            self.groups[0].num_layers * self.groups[0].spec.page_size_bytes

    @property
    def block_size(self) -> int:
        return min(g.spec.block_size for g in self.groups)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks one max-length request needs summed over groups (get_max_concurrency_for_kv_cache_config)."""
        return sum(cdiv(g.spec.max_memory_usage_bytes(max_model_len, in_flight_tokens), g.spec.page_size_bytes)
                   for g in self.groups)

    def needed_bytes(self, max_model_len: int, in_flight_tokens: int, version: Version) -> int:
        """KV bytes one request of max_model_len needs on this worker (check_enough_kv_cache_memory)."""
        if release(version).unified_page_check and len(self.groups) > 1:
            return self.group_size * self.groups[0].spec.page_size_bytes * self.blocks_per_request(
                max_model_len, in_flight_tokens)
        return sum(g.num_layers * g.spec.max_memory_usage_bytes(max_model_len, in_flight_tokens)
                   for g in self.groups if g.num_layers)


def _uniform_type(specs: list[KvSpec]) -> bool:
    """UniformTypeKVCacheSpecs.is_uniform_type: one block size, and all full attention (MLA included) or all sliding
    windows of one width or all chunks of one size."""
    if len({getattr(s, "block_size", None) for s in specs}) != 1 or not all(isinstance(s, FullAttentionSpec)
                                                                             for s in specs):
        return False
    kinds = {(type(s) if type(s) in (SlidingWindowSpec, ChunkedLocalAttentionSpec) else FullAttentionSpec,
              getattr(s, "window", 0)) for s in specs}
    return len(kinds) == 1


def unify_page_size(specs: list[KvSpec]) -> list[KvSpec]:
    """kv_cache_utils.unify_kv_cache_spec_page_size: layers whose page is smaller than the largest get a block size
    that many times larger, so every page is equal (Gemma 4: full-attention layers with fewer, wider heads)."""
    attention = [s for s in specs if isinstance(s, FullAttentionSpec)]
    sizes = {s.page_size_bytes for s in specs}
    if len(sizes) <= 1 or len(attention) != len(specs):
        return specs
    largest = max(sizes)
    if any(largest % size for size in sizes):
        # vLLM raises NotImplementedError with this text at startup
        raise NotSupportedError("The page size of the layer is not divisible by the maximum page size. Cannot "
                                "unify by adjusting block_size.")
    return [s if s.page_size_bytes == largest else replace(s, block_size=s.block_size * (largest // s.page_size_bytes))
            for s in specs]


def build_layout(specs: list[KvSpec], hybrid_manager: bool = True, close_counts_share: bool = False) -> KvLayout:
    """Group per-layer specs: one group if all equal, else groups of equal size per kind (uniform page size).
    `close_counts_share` (0.18+): when the largest kind has under 1.5x the layers of the smallest, groups take the
    largest count and the smaller kinds are padded."""
    if not hybrid_manager:  # unify_hybrid_kv_cache_specs: windows become full attention
        specs = [s.as_full_attention() for s in specs]
    by_spec: dict[KvSpec, int] = {}
    for spec in specs:
        by_spec[spec] = by_spec.get(spec, 0) + 1
    if len(by_spec) == 1:
        (spec, count), = by_spec.items()
        return KvLayout(groups=(KvGroup(spec, count),), group_size=count)
    if _uniform_type(list(by_spec)):
        # get_kv_cache_groups: UniformTypeKVCacheSpecs.from_specs puts every layer in one group
        return KvLayout(groups=(KvGroup(UniformTypeSpec(tuple(specs)), 1),), group_size=1)
    specs = unify_page_size(specs)
    by_spec = {}
    for spec in specs:
        by_spec[spec] = by_spec.get(spec, 0) + 1
    # _get_kv_cache_groups_uniform_page_size: group_size = fewest layers of any kind; split each kind
    group_size = min(by_spec.values())
    if close_counts_share and max(by_spec.values()) < 1.5 * group_size:
        group_size = max(by_spec.values())
    groups: list[KvGroup] = []
    padding = 0
    for spec, count in by_spec.items():
        n_groups = cdiv(count, group_size)
        padding += n_groups * group_size - count
        groups.extend(KvGroup(spec, group_size) for _ in range(n_groups))
    return KvLayout(groups=tuple(groups), group_size=group_size, padding_layers=padding)


def num_blocks(layout: KvLayout, available_bytes: int) -> int:
    """get_kv_cache_config_from_groups: blocks that fit in the available memory."""
    return max(int(available_bytes // layout.bytes_per_block), 0)


def max_concurrency(layout: KvLayout, blocks: int, max_model_len: int, in_flight_tokens: int,
                    version: Version) -> float:
    """'Maximum concurrency for L tokens per request: Xx' (get_max_concurrency_for_kv_cache_config)."""
    if not release(version).concurrency_per_request_blocks:
        return blocks * layout.block_size / max_model_len
    return blocks / max(layout.blocks_per_request(max_model_len, in_flight_tokens), 1)


def kv_cache_tokens(layout: KvLayout, blocks: int, concurrency: float, max_model_len: int,
                    version: Version) -> int:
    """'GPU KV cache size: N tokens' (kv_cache_utils.py: blocks x block size up to 0.20, concurrency x L after)."""
    rel = release(version)
    if rel.kv_tokens_from_concurrency:
        return int(concurrency * max_model_len)
    if rel.hybrid_kv_manager:
        return blocks // len(layout.groups) * layout.block_size
    return blocks * layout.block_size


def estimate_max_model_len(layout: KvLayout, available_bytes: int, max_model_len: int, in_flight: int,
                           version: Version) -> int:
    """estimate_max_model_len: binary search for the longest request that fits (0 if none)."""
    lo, hi, best = 1, max_model_len, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if layout.needed_bytes(mid, min(in_flight, mid), version) <= available_bytes:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best
