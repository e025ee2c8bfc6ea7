"""What each vLLM release does differently, in one place: the only module that compares versions.

`release(version)` gives one frozen `VllmRelease`: the defaults, memory accounting, KV accounting, error texts,
startup-log lines and metric names of that version. Every fact below is written once, as its history: the value
from the oldest modelled release, then each release that changed it, with the vLLM file it was read in (the wheels
0.6.6 ... 0.33.0). Everything else in oomguard asks the release object; tests/test_releases.py fails when a module
compares versions itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

from oomguard.engines.vllm.versions import OLDEST, Version

T = TypeVar("T")


def _since(version: Version, first: T, *changes: tuple[Version, T]) -> T:
    """The value of a fact at `version`: `first`, replaced by each (release, value) change reached, in order."""
    value = first
    for since, changed in changes:
        if version >= since:
            value = changed
    return value


@dataclass(frozen=True)
class KnownRegression:
    """Misbehaviour of vLLM itself that a finding of `failure_class` should mention."""

    failure_class: str
    needs_pipeline_parallel: bool
    text: str
    fixed_in: str | None = None     # a real misbehaviour (not a cosmetic one), fixed in this release


_PP_CHECK_TOO_STRICT = KnownRegression(
    "kv_cache_too_small", True,
    "vLLM 0.14-0.16 checks one request's KV need against all pipeline stages' layers at once, so with pipeline "
    "parallelism the check is about pp times stricter than the allocation (fixed in 0.17): upgrade rather than cut "
    "max_model_len.", fixed_in="0.17")
_ESTIMATE_DROPPED = KnownRegression(
    "kv_cache_too_small", False,
    "vLLM 0.8.x drops the estimated maximum model length from this message (a misplaced f-string); oomguard "
    "computes it from the GiB figures instead.")


@dataclass(frozen=True)
class VllmRelease:
    version: Version
    default_engine: str                  # "v0" or "v1": VLLM_USE_V1's default (vllm/envs.py)
    has_v0: bool                         # the V0 engine still ships
    # --- defaults (vllm/engine/arg_utils.py, vllm/config/cache.py) ---
    gpu_memory_utilization: float
    large_gpu_tier_gib: int | None       # a >= this GiB tier of batch defaults (get_batch_defaults)
    a100_in_large_tier: bool             # A100s get the >= 70 GiB batch defaults
    multimodal_min_batched_tokens: int   # V1 raises max_num_batched_tokens to this for multimodal models
    max_model_len_auto: bool             # --max-model-len -1/auto fits the KV cache
    kv_cache_memory_bytes_flag: bool     # --kv-cache-memory-bytes replaces the profile
    prefetch_offload: bool               # --offload-group-size / --offload-num-in-group
    # --- memory accounting (v1/worker/gpu_worker.py determine_available_memory, v1/worker/utils.py) ---
    requested_rounds_up: bool            # requested memory = ceil(total x utilization), else int()
    free_memory_check: bool              # V1 refuses to start with less free memory than requested
    cuda_graphs_in_budget: bool          # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1
    nccl_before_snapshot: bool           # Worker.init_device sets up NCCL before the initial MemorySnapshot
    non_torch_includes_baseline: bool    # V1 counts everything but live torch tensors (CUDA context, other processes)
    v0_counts_cuda_context: bool         # 0.6.x V0 worker counted the CUDA context as non-torch memory
    sampler_sorts: bool                  # the sampler warm-up's top-k/top-p runs torch.sort over [reqs, vocab]
    flashinfer_sampler_if_installed: bool  # ... unless FlashInfer is installed (then its kernels, no sort)
    flashinfer_allreduce_fusion: bool    # TP > 1 on Hopper/Blackwell NVLink allocates the fusion workspace
    moe_workspace_persists: bool         # fused-MoE scratch is kept by the WorkspaceManager after the forward pass
    # --- CUDA graphs (config/vllm.py _set_cudagraph_sizes, config/compilation.py, gpu_model_runner.capture_model) ---
    graph_sizes_follow_max_num_seqs: bool  # capture up to min(2 x max_num_seqs, 512) tokens (else a fixed 512)
    graph_sizes_step_16_above_256: bool    # sizes 256..M step 16 (else step 8 all the way)
    full_and_piecewise_graphs: bool        # cudagraph_mode FULL_AND_PIECEWISE: full decode graphs too
    graph_sizes_add_batched_tokens: bool   # max_num_batched_tokens appended when it is a capture size candidate
    graph_sizes_add_max_num_seqs: bool     # max_num_seqs itself appended
    graph_cap_1024_on_blackwell: bool      # the capture cap is 1024 on data-centre Blackwell
    graph_pool_measured: bool              # "Graph capturing finished ... took X" follows empty_cache (not a net delta)
    # --- hybrid linear-attention models (models/config.py HybridAttentionMambaModelConfig, kv_cache_interface.py) ---
    hybrid_model_types: frozenset[str]   # Gated DeltaNet hybrids this release runs (qwen3_next.py, qwen3_5.py)
    hybrid_prefix_caching_default: bool  # prefix caching on for hybrids by default ("align" mode: 2 state pages)
    hybrid_prefix_caching_possible: bool  # --enable-prefix-caching works on Gated DeltaNet hybrids
    gdn_flashinfer_checkpoint: bool      # GDN prefill on FlashInfer (Hopper): align 64, one more checkpoint page
    hybrid_groups_max_if_close: bool     # layer groups take the larger count when within 1.5x
    nemotron_h_ssm_dtype: str | None     # Nemotron-H's temporal state when config.json does not pin it
    # --- KV cache (v1/core/kv_cache_utils.py, v1/core/kv_cache_manager.py) ---
    hybrid_kv_manager: bool              # V1 groups layers of different attention kinds
    chunked_local_disables_hybrid: bool  # chunked local attention turns the hybrid manager off
    concurrency_per_request_blocks: bool  # concurrency = blocks / blocks per request (else tokens / max len)
    kv_tokens_from_concurrency: bool     # "GPU KV cache size" = concurrency x max_model_len (else blocks x size)
    unified_page_check: bool             # the fit check sizes hybrid groups by the unified page
    fit_reserves_one_block: bool         # the fit check keeps one block back (the null block)
    async_scheduling: bool               # in-flight tokens doubled (async scheduling on by default)
    v0_tokens_divided_by_pp: bool        # V0's max-tokens check divides blocks over pipeline stages
    block_sizes: tuple[int, ...] | None  # --block-size choices; None: any multiple of 16 (the CUDA attention kernels')
    flashmla_block_64: bool              # FlashMLA's 64-token blocks on Hopper
    cutlass_mla_block_128: bool          # CUTLASS MLA's 128-token blocks on data-centre Blackwell
    mxfp4_triton_on_hopper: bool         # the wheel bundles triton_kernels for MXFP4 MoE on Hopper
    # --- error texts (v1/core/kv_cache_utils.py, v1/worker/utils.py, engine/arg_utils.py) ---
    gib_rounded: bool                    # format_gib (round to 2) instead of "%.2f"
    docs_link_in_errors: bool
    cpu_backend_wording: bool            # "(which also controls CPU memory on the CPU backend)"; "model's"
    estimate_dropped: bool               # 0.8.x lost the estimated max model length to a stray statement
    device_in_free_memory_error: bool    # "on device cuda:0"
    openai_error_envelope: bool          # {"error": {...}} bodies instead of {"object": "error", ...}
    context_error_era: int               # which "maximum context length" wording the server uses (0..3)
    # --- startup log (gpu_model_runner.py, gpu_worker.py, kv_cache_utils.py) ---
    engine_core_prefix: bool             # "(EngineCore_DP0 pid=N)" on engine lines
    weights_line: str                    # "Model loading took ..." template ({gib}, {secs})
    blocks_word: str                     # V0: "# GPU blocks" / "# CUDA blocks"
    available_kv_line: bool              # "Available KV cache memory: X GiB"
    kv_size_and_concurrency_one_line: bool
    num_gpu_blocks_logged: bool          # "vllm cache_config_info with initialization after num_gpu_blocks is"
    # --- metrics (v1/metrics/loggers.py, engine/metrics.py) ---
    kv_usage_metrics: tuple[str, ...]
    engine_label: bool                   # the "engine" label on every metric
    swapped_gauge: bool                  # vllm:num_requests_swapped (V0)
    prefix_cache_metrics: tuple[str, ...]
    itl_metrics: tuple[str, ...]
    request_tpot_histogram: bool
    cache_config_kv_tokens: bool         # kv_cache_size_tokens / kv_cache_max_concurrency labels
    num_cpu_blocks_label_zero: bool      # V1 reports 0 CPU blocks, V0 "None"
    regressions: tuple[KnownRegression, ...]

    @property
    def is_v1_default(self) -> bool:
        return self.default_engine == "v1"


@lru_cache(maxsize=None)
def release(version: Version) -> VllmRelease:
    v = version
    return VllmRelease(
        version=v,
        default_engine=_since(v, "v0", ((0, 8, 0), "v1")),                  # envs.py VLLM_USE_V1
        has_v0=_since(v, True, ((0, 11, 0), False)),                         # V0 removed in 0.11
        gpu_memory_utilization=_since(v, 0.9, ((0, 20, 0), 0.92)),           # config/cache.py
        large_gpu_tier_gib=_since(v, None, ((0, 28, 0), 160)),               # arg_utils.get_batch_defaults
        a100_in_large_tier=_since(v, True, ((0, 9, 0), False)),              # arg_utils: A100 kept at 256 seqs
        multimodal_min_batched_tokens=_since(v, 5120, ((0, 20, 0), 0)),     # arg_utils._set_default_args
        max_model_len_auto=_since(v, False, ((0, 14, 0), True)),            # config/model.py, auto-fit
        kv_cache_memory_bytes_flag=_since(v, False, ((0, 11, 0), True)),    # config/cache.py
        prefetch_offload=_since(v, False, ((0, 17, 0), True)),              # model_executor/offloader/prefetch.py
        requested_rounds_up=_since(v, False, ((0, 14, 0), True)),           # v1/worker/utils.request_memory
        free_memory_check=_since(v, False, ((0, 9, 0), True)),              # gpu_worker.init_device
        cuda_graphs_in_budget=_since(v, False, ((0, 20, 0), True)),         # envs.py ESTIMATE_CUDAGRAPHS
        nccl_before_snapshot=_since(v, False, ((0, 11, 0), True)),          # gpu_worker.init_device
        # v1/worker/gpu_worker.py determine_available_memory, 0.8.0-0.9.0: (total - free) - allocated; memory_profiling
        # (the increase since the initial snapshot) from 0.9.1
        non_torch_includes_baseline=(0, 8, 0) <= v < (0, 9, 1),
        v0_counts_cuda_context=_since(v, True, ((0, 7, 0), False)),         # worker/worker.py memory profiling
        # v1/sample/ops/topk_topp_sampler.py: PyTorch's sort until 0.17 brought topk_topp_triton.py (batches >= 8);
        # FlashInfer's sampler was used when importable up to 0.11, opt-in (VLLM_USE_FLASHINFER_SAMPLER) from 0.12
        sampler_sorts=_since(v, True, ((0, 17, 0), False)),
        flashinfer_sampler_if_installed=_since(v, True, ((0, 12, 0), False)),
        # compilation/pass_config.py enable_fi_allreduce_fusion, created in the profiling window
        flashinfer_allreduce_fusion=_since(v, False, ((0, 17, 0), True)),
        moe_workspace_persists=_since(v, False, ((0, 13, 0), True)),        # fused_moe/modular_kernel.py
        graph_sizes_follow_max_num_seqs=_since(v, False, ((0, 10, 0), True)),  # scheduler.py cuda_graph_sizes
        graph_sizes_step_16_above_256=_since(v, False, ((0, 11, 1), True)),
        full_and_piecewise_graphs=_since(v, False, ((0, 11, 0), True)),      # compilation.py default mode
        graph_sizes_add_batched_tokens=_since(v, False, ((0, 21, 0), True)),
        graph_sizes_add_max_num_seqs=_since(v, False, ((0, 31, 0), True)),
        graph_cap_1024_on_blackwell=_since(v, False, ((0, 28, 0), True)),
        graph_pool_measured=_since(v, False, ((0, 18, 0), True)),          # gpu_model_runner.capture_model
        hybrid_model_types=_since(v, frozenset(), ((0, 10, 2), frozenset({"qwen3_next", "nemotron_h"})),
                                  ((0, 12, 0), frozenset({"qwen3_next", "nemotron_h", "nemotron_h_moe"})),
                                  ((0, 17, 0), frozenset({"qwen3_next", "nemotron_h", "nemotron_h_moe", "qwen3_5_text",
                                                          "qwen3_5_moe_text"}))),
        nemotron_h_ssm_dtype=_since(v, None, ((0, 13, 0), "float16"), ((0, 20, 0), "float32")),
        hybrid_prefix_caching_default=_since(v, False, ((0, 28, 0), True)),  # config/cache.py mamba_cache_mode
        hybrid_prefix_caching_possible=_since(v, False, ((0, 15, 0), True)),
        gdn_flashinfer_checkpoint=_since(v, False, ((0, 33, 0), True)),     # v1/attention/backends/gdn_attn.py
        hybrid_groups_max_if_close=_since(v, False, ((0, 18, 0), True)),    # _get_kv_cache_groups_uniform_page_size
        hybrid_kv_manager=_since(v, False, ((0, 9, 0), True)),              # v1/core/kv_cache_coordinator.py
        chunked_local_disables_hybrid=_since(v, False, ((0, 11, 0), True)),  # config/vllm.py
        concurrency_per_request_blocks=_since(v, False, ((0, 9, 0), True)),  # get_max_concurrency_for_kv_cache_config
        kv_tokens_from_concurrency=_since(v, False, ((0, 21, 0), True)),    # kv_cache_utils._report_kv_cache_config
        unified_page_check=_since(v, False, ((0, 17, 0), True)),            # check_enough_kv_cache_memory
        fit_reserves_one_block=_since(v, False, ((0, 30, 0), True)),        # kv_cache_utils null block
        async_scheduling=_since(v, False, ((0, 26, 0), True)),              # config/scheduler.py
        v0_tokens_divided_by_pp=_since(v, False, ((0, 10, 0), True)),       # worker/worker.py
        block_sizes=_since(v, (8, 16, 32, 64, 128), ((0, 9, 0), (1, 8, 16, 32, 64, 128)),   # config/cache.py BlockSize
                           ((0, 12, 0), (1, 8, 16, 32, 64, 128, 256)), ((0, 18, 0), None)),
        flashmla_block_64=(0, 8, 0) <= v < (0, 18, 0),                       # platforms/cuda.py
        cutlass_mla_block_128=_since(v, False, ((0, 10, 0), True)),         # platforms/cuda.py
        mxfp4_triton_on_hopper=_since(v, False, ((0, 12, 0), True)),        # quantization/mxfp4.py get_mxfp4_backend
        gib_rounded=_since(v, False, ((0, 14, 0), True)),                   # utils format_gib
        docs_link_in_errors=_since(v, False, ((0, 13, 0), True)),
        cpu_backend_wording=_since(v, False, ((0, 22, 0), True)),
        estimate_dropped=(0, 8, 0) <= v < (0, 9, 0),
        device_in_free_memory_error=_since(v, False, ((0, 14, 0), True)),
        openai_error_envelope=_since(v, False, ((0, 10, 0), True)),         # entrypoints/openai/protocol.py
        context_error_era=_since(v, 0, ((0, 10, 0), 1), ((0, 18, 0), 2), ((0, 31, 0), 3)),
        engine_core_prefix=_since(v, False, ((0, 11, 0), True)),
        weights_line=_since(v, "Loading model weights took {gib:.4f} GB",
                            ((0, 7, 4), "Model loading took {gib:.4f} GiB and {secs:.6f} seconds"),
                            ((0, 12, 0), "Model loading took {gib:.4f} GiB memory and {secs:.6f} seconds"),
                            ((0, 14, 0), "Model loading took {gib_rounded} GiB memory and {secs:.6f} seconds")),
        blocks_word=_since(v, "GPU", ((0, 7, 0), "CUDA")),
        available_kv_line=_since(v, False, ((0, 9, 0), True)),
        kv_size_and_concurrency_one_line=_since(v, False, ((0, 28, 0), True)),
        num_gpu_blocks_logged=(0, 11, 0) <= v < (0, 12, 0),
        kv_usage_metrics=_since(v, ("vllm:gpu_cache_usage_perc",),
                                ((0, 9, 0), ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
                                ((0, 11, 0), ("vllm:kv_cache_usage_perc",))),
        engine_label=_since(v, False, ((0, 8, 0), True)),
        swapped_gauge=_since(v, True, ((0, 8, 0), False)),
        prefix_cache_metrics=_since(v, ("vllm:gpu_prefix_cache",),
                                    ((0, 9, 0), ("vllm:prefix_cache", "vllm:gpu_prefix_cache")),
                                    ((0, 11, 0), ("vllm:prefix_cache",))),
        itl_metrics=_since(v, ("vllm:time_per_output_token_seconds",),
                           ((0, 11, 0), ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds")),
                           ((0, 12, 0), ("vllm:inter_token_latency_seconds",))),
        request_tpot_histogram=_since(v, False, ((0, 11, 0), True)),
        cache_config_kv_tokens=_since(v, False, ((0, 24, 0), True)),
        num_cpu_blocks_label_zero=_since(v, False, ((0, 8, 0), True)),
        regressions=tuple(r for r, first, fixed in ((_PP_CHECK_TOO_STRICT, (0, 14, 0), (0, 17, 0)),
                                                    (_ESTIMATE_DROPPED, (0, 8, 0), (0, 9, 0)))
                          if first <= v < fixed),
    )


def oldest() -> VllmRelease:
    return release(OLDEST)


def first_release_running(family: str) -> Version | None:
    """The oldest modelled release whose hybrid_model_types include `family` (for a refusal's advice)."""
    from oomguard.engines.vllm.versions import NEWEST
    for minor in range(OLDEST[1], NEWEST[1] + 1):
        for patch in range(0, 10):
            if family in release((0, minor, patch)).hybrid_model_types:
                return (0, minor, patch)
    return None
