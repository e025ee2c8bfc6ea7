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
from oomguard.failures import FailureClass

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
    FailureClass.KV_CACHE_TOO_SMALL, True,
    "vLLM 0.14-0.16 checks one request's KV need against all pipeline stages' layers at once, so with pipeline "
    "parallelism the check is about pp times stricter than the allocation (fixed in 0.17): upgrade rather than cut "
    "max_model_len.", fixed_in="0.17")
_V2_GRAPHS_UNBUDGETED = KnownRegression(
    FailureClass.OOM_PROFILING_OR_GRAPH, False,
    "Model runner V2 (the default for dense models from vLLM 0.25, for some architectures from 0.22) reserves no "
    "memory for CUDA graphs before 0.29 (its profile_cudagraph_memory returns 0), so capture can run past the budget "
    "the KV cache was sized to; 0.29 estimates them. Upgrade, or VLLM_USE_V2_MODEL_RUNNER=0, or lower "
    "--gpu-memory-utilization by the graphs' size.", fixed_in="0.29")
_ESTIMATE_DROPPED = KnownRegression(
    FailureClass.KV_CACHE_TOO_SMALL, False,
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
    swap_space_flag: bool                # --swap-space exists (V0's CPU swap; V1 ignores it)
    # --- LoRA (vllm/config/lora.py, vllm/lora/) ---
    lora_ranks: tuple[int, ...]          # --max-lora-rank choices
    lora_extra_vocab: bool               # --lora-extra-vocab-size and its extra embedding rows
    lora_wraps_moe: bool                 # FusedMoE experts get LoRA stacks
    lora_embedding_model_types: frozenset[str]  # models declaring embedding_modules (embed and logits wrapped)
    lora_graph_cases: int                # CUDA graphs captured with and without adapters (x2)
    lora_in_weights: bool                # the stacks are allocated inside load_model's profiler (0.8+)
    # --- speculative decoding (config/speculative.py, v1/spec_decode/, v1/worker/gpu_model_runner.py) ---
    speculative_config_flag: bool        # --speculative-config (else --speculative-model / --num-speculative-tokens)
    v1_draft_model: bool                 # V1 runs a separate draft model (DraftModelProposer)
    mtp_shares_lm_head: bool             # DeepSeek-style MTP layers reuse the target's lm_head
    rejection_warmup: str                # "early", "late" or "none": model runner V1's rejection-sampler dummy run
    # --- model runner V2 (config/vllm.py VllmConfig.use_v2_model_runner): the default for some models ---
    v2_runner_archs: frozenset[str]      # DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES
    v2_runner_plain_only: bool           # ... and only unquantized dense ones (0.22-0.23)
    v2_runner_dense: bool                # any model neither MoE nor hybrid (0.25+)
    v2_runner_everywhere: bool           # every model (0.29+)
    v2_spec_methods: frozenset[str]      # speculative methods V2 runs (others fall back to V1)
    v2_estimates_graphs: bool            # V2's profile_cudagraph_memory estimates the pool (before: returns 0)
    v2_sampler_plain_warmup: bool        # V2's sampler warm-up runs default parameters only: the logits and their
                                         # float32 copy, no top-k/top-p, logprobs or penalties (0.33 adds a pass
                                         # with SamplingParams.for_sampler_warmup)
    mamba_spec_blocks: bool              # a hybrid keeps 1 + k recurrent-state pages a request
    graph_sizes_scale_with_spec: bool    # capture sizes up to max_num_seqs x (1 + k) x 2
    kv_offloading_flags: bool            # --kv-offloading-size / --kv-offloading-backend
    # --- memory accounting (v1/worker/gpu_worker.py determine_available_memory, v1/worker/utils.py) ---
    requested_rounds_up: bool            # requested memory = ceil(total x utilization), else int()
    free_memory_check: bool              # V1 refuses to start with less free memory than requested
    cuda_graphs_in_budget: bool          # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1
    graph_estimate_in_window: bool       # profile_cudagraph_memory runs inside memory_profiling (CUDA, graphs on)
    budget_counts_consumed: bool         # the budget subtracts all the process consumed since its start (free
                                         # memory before - after the profile run), torch tensors made outside the
                                         # profile run included (model runner V2's sampling state)
    nccl_before_snapshot: bool           # Worker.init_device sets up NCCL before the initial MemorySnapshot
    ep_group_for_every_model: bool       # parallel_state builds the expert-parallel group (a second NCCL
                                         # communicator under TP) for every model, not only MoE ones
    non_torch_includes_baseline: bool    # V1 counts everything but live torch tensors (CUDA context, other processes)
    v0_counts_cuda_context: bool         # 0.6.x V0 worker counted the CUDA context as non-torch memory
    sampler_sorts: bool                  # the sampler warm-up's top-k/top-p runs torch.sort over [reqs, vocab]
    flashinfer_sampler_if_installed: bool  # ... unless FlashInfer is installed (then its kernels, no sort)
    flashinfer_allreduce_fusion: bool    # TP > 1 on Hopper/Blackwell NVLink allocates the fusion workspace
    allreduce_fusion_single_dp_pp: bool  # ... only without data or pipeline parallelism
    allreduce_fusion_multicast_pages: bool  # ... each of its three buffers a multicast page (FlashInfer 0.6.3-0.6.8)
    moe_workspace_persists: bool         # fused-MoE scratch is kept by the WorkspaceManager after the forward pass
    # --- CUDA graphs (config/vllm.py _set_cudagraph_sizes, config/compilation.py, gpu_model_runner.capture_model) ---
    graph_sizes_follow_max_num_seqs: bool  # capture up to min(2 x max_num_seqs, 512) tokens (else a fixed 512)
    graph_sizes_step_16_above_256: bool    # sizes 256..M step 16 (else step 8 all the way)
    full_and_piecewise_graphs: bool        # cudagraph_mode FULL_AND_PIECEWISE: full decode graphs too
    graph_sizes_add_batched_tokens: bool   # max_num_batched_tokens appended when it is a capture size candidate
    graph_sizes_add_max_num_seqs: bool     # max_num_seqs itself appended
    performance_mode: bool                 # --performance-mode (interactivity: sizes 1-32; throughput: 2x batch)
    graph_cap_1024_on_blackwell: bool      # the capture cap is 1024 on data-centre Blackwell
    graph_pool_measured: bool              # "Graph capturing finished ... took X" follows empty_cache (not a net delta)
    # --- hybrid linear-attention models (models/config.py HybridAttentionMambaModelConfig, kv_cache_interface.py) ---
    hybrid_model_types: frozenset[str]   # Gated DeltaNet / Mamba2 hybrids this release runs on V1 by default
    hybrid_prefix_caching_default: bool  # prefix caching on for hybrids by default ("align" mode: 2 state pages)
    hybrid_prefix_caching_possible: bool  # --enable-prefix-caching works on Gated DeltaNet hybrids
    gdn_flashinfer_checkpoint: bool      # GDN prefill on FlashInfer (Hopper): align 64, one more checkpoint page
    hybrid_groups_max_if_close: bool     # layer groups take the larger count when within 1.5x
    nemotron_h_ssm_dtype: str | None     # Nemotron-H's temporal state when config.json does not pin it
    mamba2_prefill_checkpoint: bool      # a Mamba2 mixer keeps one more state page a request in "align" mode
    attention_only_hybrid_is_hybrid: bool  # a hybrid architecture whose layer_types are all attention (Granite-4.0
                                           # micro) still gets the hybrid block size from its config's Mamba state
    # --- model types added late (model_executor/models/registry.py: the first release listing the architecture) ---
    late_model_types: frozenset[str]     # of the model types (or architectures) oomguard knows were added late, those
                                         # this release runs
    removed_model_types: frozenset[str]  # of the model types oomguard knows vLLM dropped, those this release no
                                         # longer runs
    gemma4_kv_shared_q_only: bool        # gemma4.py: a KV-shared layer builds q_proj only (else a full qkv_proj)
    gemma3n_kv_shared_q_only: bool       # gemma3n.py: the same for Gemma 3n
    mistral_format_first: bool           # a repo with params.json + consolidated*.safetensors loads in Mistral's format
    gemma3n_multimodal: bool             # Gemma3nForConditionalGeneration is gemma3n_mm.py (towers, PLE buffer), else
                                         # gemma3n.py's text-only class
    # --- DeepSeek-V3.2 / GLM-5 sparse attention (models/deepseek_v2.py Indexer, models/deepseek_v32/ from 0.30) ---
    dsa_indexer_wk_fused: bool           # wk + weights_proj fused into one unquantized wk_weights_proj
    dsa_indexer_rope: bool               # the indexer builds its own RoPE (a second cos/sin cache)
    dsa_indexer_rope_follows_interleave: bool  # ... NeoX-style unless indexer_rope_interleave (then the MLA one)
    dsa_index_group_buffers: bool        # each index-producing layer allocates its own top-k index workspace
    dsa_index_share: str                 # which layers reuse an earlier layer's top-k (IndexShare / IndexCache):
                                         # "none" (every layer computes its own), "opt_in" (index_topk_freq /
                                         # index_topk_pattern only with use_index_cache, the offset fixed at 2),
                                         # "config" (always, index_skip_topk_offset read, default 2)
    dsa_indexer_only_where_topk: bool    # only layers computing their own top-k (and MTP layers) build an indexer
                                         # (its weights and its K cache); else every layer builds one
    fp8_kv_becomes_ds_mla: bool          # --kv-cache-dtype fp8 on FlashMLA-sparse becomes fp8_ds_mla (656 B a token)
    olmo3_transformers_backend: bool     # registry.py maps Olmo3ForCausalLM to the Transformers backend (HF RoPE)
    ernie_score_bias: bool               # ernie45_moe.py: the router's e_score_correction_bias [experts]
    ernie_router_fp32: bool              # ernie45_moe.py: router weight and score bias in float32
    # --- KV cache (v1/core/kv_cache_utils.py, v1/core/kv_cache_manager.py) ---
    packed_kv_cache_dtypes: frozenset[str]  # --kv-cache-dtype values with packed scales (config/cache.py CacheDType)
    hybrid_kv_manager: bool              # V1 groups layers of different attention kinds
    chunked_local_disables_hybrid: bool  # chunked local attention turns the hybrid manager off
    concurrency_per_request_blocks: bool  # concurrency = blocks / blocks per request (else tokens / max len)
    kv_tokens_from_concurrency: bool     # "GPU KV cache size" = concurrency x max_model_len (else blocks x size)
    unified_page_check: bool             # the fit check sizes hybrid groups by the unified page
    fit_reserves_one_block: bool         # the fit check keeps one block back (the null block)
    async_scheduling: bool               # in-flight tokens doubled (async scheduling on by default)
    v0_tokens_divided_by_pp: bool        # V0's max-tokens check divides blocks over pipeline stages
    v0_mla_without_chunked_prefill: bool  # V0 does not turn chunked prefill on by itself for MLA models
    block_sizes: tuple[int, ...] | None  # --block-size choices; None: any multiple of 16 (the CUDA attention kernels')
    flashmla_block_64: bool              # FlashMLA's 64-token blocks on Hopper
    cutlass_mla_block_128: bool          # CUTLASS MLA's 128-token blocks on data-centre Blackwell
    mxfp4_triton_on_hopper: bool         # the wheel bundles triton_kernels for MXFP4 MoE on Hopper
    mxfp4_triton_frees_loaded_scales: bool  # ... and drops the loaded block scales once swizzled
    # --- GPUs (the PyPI wheels' kernels, engine/arg_utils.py, config/model.py; docs/research/vllm-gpu-support.md) ---
    cuda_toolkit: str                    # the CUDA the PyPI wheel was built with (nvcc strings in _C, libcudart.so.N)
    cuda_archs: tuple[tuple[int, int], ...]  # SASS targets of the PyPI wheel's _C (its .nv_fatbin), compute capability
    aarch64_wheels: bool                 # PyPI carries manylinux aarch64 wheels (Grace hosts: GH200, GB10)
    v1_needs_ampere: bool                # V1 falls back to V0 below compute capability 8.0 (_is_v1_supported_oracle)
    auto_dtype_avoids_bf16: bool         # dtype auto serves bfloat16 checkpoints in float16 below 8.0, with a warning
    fp8_min_capability: int              # quantization/fp8.py get_min_capability (x 10): Marlin weight-only below 8.9
    rocm_archs: frozenset[str]           # the gfx targets vLLM's ROCm install docs list
    # --- ROCm (platforms/rocm.py and the quantization methods' ROCm branches; engines/vllm/platform.py) ---
    rocm_weights_device_wide: bool       # "Model loading took" is total - free (mem_get_info), not torch-allocated
    rocm_mxfp4_triton: bool              # MXFP4 MoE on ROCm runs OpenAI's Triton kernels (padded, strided layout)
    rocm_fp8_padding: bool               # VLLM_ROCM_FP8_PADDING (default on): per-tensor/block FP8 rows + 256 bytes
    rocm_moe_padding: bool               # VLLM_ROCM_MOE_PADDING (default on): unquantized MoE rows + 256 bytes
    rocm_wna16_moe_keeps_g_idx: bool     # int4/int8 compressed-tensors MoE on ROCm keeps its g_idx buffers
    # --- multimodal profiling (v1/worker/gpu_model_runner.py profile_run, v1/core/encoder_cache_manager.py,
    #     multimodal/registry.py, the model files; read by engines/vllm/multimodal.py) ---
    mm_default_limit: int                # items per prompt of a modality --limit-mm-per-prompt leaves out (V1; V0: 1)
    mm_counts_are_limits: bool           # max tokens per item and the dummy computed with the limits as item counts
    mm_encoder_budget_fixed: int | None  # the encoder budget hard-coded (else max(max_num_batched_tokens, T))
    mm_items_rule: str                   # N items profiled: "fixed" budget // T, "ceil" cdiv, "floor" max(1, //),
                                         # "per_prompt" (MultiModalBudget.get_max_items: max_items_per_prompt too)
    mm_dummy_seq_len: str                # seq_len the encoded dummy is built for: "batched", "max_tokens", "model_len"
    mm_contiguous_tokens: bool           # T counts the whole placeholder (break / boi / eoi tokens), not embeddings
    mm_pad_outputs: str                  # dummy outputs padded: "none", "budget" (to the encoder budget), "item" (to T)
    mm_inputs_model_dtype: bool          # dummy pixel inputs cast to the model dtype (else as the processor made them)
    mm_tiebreak_by_name: bool            # equal T: the later modality name wins (else the first listed)
    skip_mm_profiling_flag: bool         # --skip-mm-profiling exists
    mrv2_default_for_vl: str             # VL models on Model Runner V2 by default: "never", "dense", "all"
    mrv2_profiles_encoder: bool          # Model Runner V2's profile_run runs the encoder (else LM only)
    qwen_vl_max_frames: int              # qwen2_vl.py _MAX_FRAMES_PER_VIDEO (Qwen2-VL / Qwen2.5-VL video T)
    qwen_vl_factorized_size: bool        # largest image = max_pixels factorized (else smart_resize of 9999999^2)
    qwen_video_frames_after_images: bool  # video frames from seq_len minus the images' tokens
    qwen3_vl_video_rule: str             # "frames_x12.5", "frames" (by seq_len, <= 24576), "two_frames"
    internvl_video_text_types: frozenset[str]  # InternVL takes video with these language models
    mllama_runs: bool                    # Llama 3.2 Vision (mllama.py, V0 only) is still served
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

    def runs_cuda(self, compute_capability: tuple[int, int]) -> bool:
        """The PyPI wheel has kernels for a GPU of this compute capability: a SASS target of the same major at or
        below its minor (CUDA's binary compatibility; the PTX it also carries is no older than 8.0)."""
        major, minor = compute_capability
        return any(a == major and b <= minor for a, b in self.cuda_archs)


# model type (or, where a type's architectures arrived apart, the architecture) -> the first release whose
# models/registry.py lists its architecture
_LATE_MODEL_TYPES: dict[str, Version] = {
    "ernie4_5_moe": (0, 9, 2), "deepseek_v32": (0, 11, 0), "olmo3": (0, 11, 0), "glm_moe_dsa": (0, 16, 0),
    "gemma4": (0, 19, 0), "gemma4_text": (0, 19, 0), "exaone4": (0, 10, 0),
    # registry.py: Gemma3nForConditionalGeneration from 0.9.2 (gemma3n.py, text only; gemma3n_mm.py from 0.10.1),
    # Gemma3nForCausalLM (a text-only checkpoint) from 0.10.1
    "Gemma3nForConditionalGeneration": (0, 9, 2), "Gemma3nForCausalLM": (0, 10, 1),
    # models/minicpmv.py _SUPPORT_VERSION: MiniCPMV4_0 from 0.10.1, MiniCPMV4_5 from 0.10.2 (2.6 before 0.6.6)
    "MiniCPMV4_0": (0, 10, 1), "MiniCPMV4_5": (0, 10, 2),
}
LATE_MODEL_TYPES = frozenset(_LATE_MODEL_TYPES)
# model type -> the first release whose models/registry.py no longer lists its architectures: BaichuanForCausalLM and
# BaiChuanForCausalLM (models/baichuan.py) are last in 0.24.0; 0.25.0 lists them in _PREVIOUSLY_SUPPORTED_MODELS
# ("supported in vLLM until v0.23.0", though the 0.24.0 wheel still has them)
_REMOVED_MODEL_TYPES: dict[str, Version] = {"baichuan": (0, 25, 0)}
REMOVED_MODEL_TYPES = frozenset(_REMOVED_MODEL_TYPES)
# the hybrids V1 runs by default from 0.10.2 (hybrid_model_types)
_HYBRIDS_0_10_2 = frozenset({"qwen3_next", "nemotron_h", "granitemoehybrid", "jamba", "falcon_h1"})
_LORA_EMBEDDING_TYPES = frozenset({"llama", "mistral", "mixtral", "granite", "granitemoe", "exaone", "exaone4",
                                   "nemotron", "minicpm", "phimoe", "jamba", "bamba", "solar", "falcon_h1"})


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
        swap_space_flag=_since(v, True, ((0, 20, 0), False)),               # config/cache.py swap_space
        lora_ranks=_since(v, (8, 16, 32, 64, 128, 256), ((0, 8, 0), (8, 16, 32, 64, 128, 256, 320, 512)),
                          ((0, 11, 1), (1, 8, 16, 32, 64, 128, 256, 320, 512))),   # config/lora.py MaxLoRARanks
        lora_extra_vocab=_since(v, True, ((0, 12, 0), False)),              # lora/layers/vocal_parallel_embedding.py
        lora_wraps_moe=_since(v, False, ((0, 11, 1), True)),                # lora/layers/fused_moe.py
        # models/*.py embedding_modules: the Llama family always; qwen3 and qwen3_moe from 0.16, qwen3_5 from 0.29
        lora_embedding_model_types=_LORA_EMBEDDING_TYPES | _since(
            v, frozenset(), ((0, 16, 0), frozenset({"qwen3", "qwen3_moe"})),
            ((0, 29, 0), frozenset({"qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe", "qwen3_5_text",
                                    "qwen3_5_moe_text"}))),
        lora_graph_cases=_since(v, 1, ((0, 11, 1), 2)),                     # v1/cudagraph_dispatcher.py lora_cases
        lora_in_weights=_since(v, False, ((0, 8, 0), True)),                # worker/model_runner.py load_model
        speculative_config_flag=_since(v, False, ((0, 8, 5), True)),        # engine/arg_utils.py (0.8.0: old flags)
        v1_draft_model=_since(v, False, ((0, 15, 0), True)),                # v1/spec_decode/draft_model.py
        mtp_shares_lm_head=_since(v, False, ((0, 16, 0), True)),            # spec_decode _maybe_share_lm_head
        # gpu_model_runner._dummy_sampler_run: [N, V] random logits (0.8.5), [2N, V] with the bonus rows' logprobs
        # (0.11.1); model runner V2 (the default for every model from 0.29) warms up no rejection sampler
        rejection_warmup=_since(v, "none", ((0, 8, 5), "early"), ((0, 11, 1), "late")),
        v2_runner_archs=_since(v, frozenset(), ((0, 22, 0), frozenset({"Qwen3ForCausalLM"})),
                               ((0, 24, 0), frozenset({"Qwen3ForCausalLM", "DeepseekV2ForCausalLM",
                                                       "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM",
                                                       "LlamaForCausalLM", "MistralForCausalLM"})),
                               ((0, 25, 0), frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM",
                                                       "GraniteMoeForCausalLM"}))),
        v2_runner_plain_only=(0, 22, 0) <= v < (0, 24, 0),
        v2_runner_dense=_since(v, False, ((0, 25, 0), True)),
        v2_runner_everywhere=_since(v, False, ((0, 29, 0), True)),
        # _get_v2_model_runner_unsupported_features: the speculative methods V2 takes
        v2_spec_methods=_since(v, frozenset(), ((0, 22, 0), frozenset({"eagle", "eagle3", "mtp"})),
                               ((0, 25, 0), frozenset({"eagle", "eagle3", "mtp", "dflash"})),
                               ((0, 31, 0), frozenset({"eagle", "eagle3", "mtp", "dflash", "draft_model"})),
                               ((0, 32, 0), frozenset({"eagle", "eagle3", "mtp", "dflash", "draft_model", "ngram",
                                                       "ngram_gpu"}))),
        v2_estimates_graphs=_since(v, False, ((0, 29, 0), True)),   # v1/worker/gpu/model_runner.py
        # v1/worker/gpu/model_runner.py _dummy_sampler_run; 0.33 adds a pass with SamplingParams.for_sampler_warmup
        v2_sampler_plain_warmup=(0, 22, 0) <= v < (0, 33, 0),
        mamba_spec_blocks=_since(v, False, ((0, 10, 2), True)),             # MambaSpec.num_speculative_blocks
        graph_sizes_scale_with_spec=_since(v, False, ((0, 13, 0), True)),   # config/vllm.py _set_cudagraph_sizes
        kv_offloading_flags=_since(v, False, ((0, 12, 0), True)),           # config/cache.py kv_offloading_size
        requested_rounds_up=_since(v, False, ((0, 14, 0), True)),           # v1/worker/utils.request_memory
        free_memory_check=_since(v, False, ((0, 9, 0), True)),              # gpu_worker.init_device
        cuda_graphs_in_budget=_since(v, False, ((0, 20, 0), True)),         # envs.py ESTIMATE_CUDAGRAPHS
        graph_estimate_in_window=(0, 18, 0) <= v < (0, 27, 0),              # gpu_worker.determine_available_memory
        budget_counts_consumed=_since(v, False, ((0, 27, 0), True)),        # utils/mem_utils.py total_consumed
        nccl_before_snapshot=_since(v, False, ((0, 11, 0), True)),          # gpu_worker.init_device
        ep_group_for_every_model=(0, 9, 0) <= v < (0, 14, 0),               # initialize_model_parallel
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
        allreduce_fusion_single_dp_pp=_since(v, True, ((0, 22, 0), False)),   # config/vllm.py
        # the pinned FlashInfer (0.6.4 in 0.17, 0.6.6 in 0.18-0.19, 0.6.8 in 0.20-0.21) builds the workspace from
        # SymmDeviceMemory, which rounds each buffer up to the recommended multicast granularity and fails where the GPUs
        # have no multicast; 0.6.11+ (vLLM 0.22+) allocates the buffers at their size (comm/trtllm_ar.py, mnnvl.py)
        allreduce_fusion_multicast_pages=(0, 17, 0) <= v < (0, 22, 0),
        moe_workspace_persists=_since(v, False, ((0, 13, 0), True)),        # fused_moe/modular_kernel.py
        graph_sizes_follow_max_num_seqs=_since(v, False, ((0, 10, 0), True)),  # scheduler.py cuda_graph_sizes
        graph_sizes_step_16_above_256=_since(v, False, ((0, 11, 1), True)),
        full_and_piecewise_graphs=_since(v, False, ((0, 11, 0), True)),      # compilation.py default mode
        graph_sizes_add_batched_tokens=_since(v, False, ((0, 21, 0), True)),
        graph_sizes_add_max_num_seqs=_since(v, False, ((0, 31, 0), True)),
        performance_mode=_since(v, False, ((0, 17, 0), True)),   # config/vllm.py, engine/arg_utils.py
        graph_cap_1024_on_blackwell=_since(v, False, ((0, 28, 0), True)),
        graph_pool_measured=_since(v, False, ((0, 18, 0), True)),          # gpu_model_runner.capture_model
        # registry.py lists GraniteMoeHybridForCausalLM and FalconH1ForCausalLM from 0.9.0, NemotronHForCausalLM from
        # 0.9.1 and JambaForCausalLM before 0.6.6, V0-only (models/jamba.py SupportsV0Only to 0.10.0, falcon_h1.py to
        # 0.9.1) or V1 opt-in (engine/arg_utils.py _is_v1_supported_oracle: "if model_config.has_inner_state" falls
        # back to V0 in 0.9.2-0.10.1) until 0.10.2 made V1 the default for Mamba hybrids, Mamba (v1) mixers included
        # (models/config.py HybridAttentionMambaModelConfig sizes their pages); all still registered IsHybrid in 0.33
        hybrid_model_types=_since(v, frozenset(),
                                  ((0, 10, 2), _HYBRIDS_0_10_2),
                                  ((0, 12, 0), _HYBRIDS_0_10_2 | {"nemotron_h_moe"}),
                                  ((0, 17, 0), _HYBRIDS_0_10_2 | {"nemotron_h_moe", "qwen3_5_text", "qwen3_5_moe_text"})),
        nemotron_h_ssm_dtype=_since(v, None, ((0, 13, 0), "float16"), ((0, 20, 0), "float32")),
        # layers/mamba/mamba_mixer2.py MambaMixer2.get_kv_cache_spec: num_prefill_checkpoint_blocks=1 (0.32+)
        mamba2_prefill_checkpoint=_since(v, False, ((0, 32, 0), True)),
        # config/model.py ModelConfig.is_hybrid: "Handle granite-4.0-micro case" (all-attention layer_types) from 0.11.1
        attention_only_hybrid_is_hybrid=_since(v, True, ((0, 11, 1), False)),
        # registry.py: Ernie4_5_MoeForCausalLM from 0.9.2; DeepseekV32ForCausalLM and Olmo3ForCausalLM from 0.11.0;
        # GlmMoeDsaForCausalLM from 0.16.0; Gemma4ForCausalLM / Gemma4ForConditionalGeneration from 0.19.0
        late_model_types=frozenset(t for t, since in _LATE_MODEL_TYPES.items() if v >= since),
        removed_model_types=frozenset(t for t, gone in _REMOVED_MODEL_TYPES.items() if v >= gone),
        gemma4_kv_shared_q_only=_since(v, False, ((0, 30, 0), True)),     # models/gemma4.py Gemma4Attention
        gemma3n_kv_shared_q_only=_since(v, False, ((0, 30, 0), True)),    # models/gemma3n.py Gemma3nAttention
        mistral_format_first=_since(v, False, ((0, 12, 0), True)),          # transformers_utils/config.py get_config
        gemma3n_multimodal=_since(v, False, ((0, 10, 1), True)),          # registry.py -> gemma3n_mm.py
        dsa_indexer_wk_fused=_since(v, False, ((0, 20, 0), True)),        # deepseek_v2.py Indexer.wk_weights_proj
        dsa_indexer_rope=_since(v, False, ((0, 12, 0), True)),            # deepseek_v2.py indexer_rope_emb
        dsa_indexer_rope_follows_interleave=_since(v, False, ((0, 30, 0), True)),  # deepseek_v32/attention.py
        dsa_index_group_buffers=_since(v, False, ((0, 33, 0), True)),     # v1/attention/backends/mla/index_group.py
        # models/deepseek_v2.py DeepseekV2MLAAttention.__init__ "IndexCache config" (_skip_topk)
        dsa_index_share=_since(v, "none", ((0, 21, 0), "opt_in"), ((0, 23, 0), "config")),
        # deepseek_v2.py DeepseekV2MLAAttention.__init__ "if self.is_v32 and (not _skip_topk or is_mtp_layer)"
        # (models/deepseek_v32/attention.py DeepseekV32Attention.__init__ from 0.29)
        dsa_indexer_only_where_topk=_since(v, False, ((0, 24, 0), True)),
        fp8_kv_becomes_ds_mla=_since(v, False, ((0, 18, 0), True)),       # layers/attention/mla_attention.py
        olmo3_transformers_backend=_since(v, False, ((0, 30, 0), True)),  # models/registry.py
        ernie_score_bias=_since(v, False, ((0, 11, 0), True)),            # models/ernie45_moe.py Ernie4_5_MoeMoE
        ernie_router_fp32=_since(v, False, ((0, 11, 1), True)),           # models/ernie45_moe.py Ernie4_5_MoeMoE
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
        packed_kv_cache_dtypes=frozenset(name for name, since in _PACKED_KV_CACHE_DTYPES.items() if v >= since),
        async_scheduling=_since(v, False, ((0, 26, 0), True)),              # config/scheduler.py
        v0_tokens_divided_by_pp=_since(v, False, ((0, 10, 0), True)),       # worker/worker.py
        v0_mla_without_chunked_prefill=_since(v, False, ((0, 8, 0), True)),  # engine/arg_utils.py _set_default_args_v0
        block_sizes=_since(v, (8, 16, 32, 64, 128), ((0, 9, 0), (1, 8, 16, 32, 64, 128)),   # config/cache.py BlockSize
                           ((0, 12, 0), (1, 8, 16, 32, 64, 128, 256)), ((0, 18, 0), None)),
        flashmla_block_64=(0, 8, 0) <= v < (0, 18, 0),                       # platforms/cuda.py
        cutlass_mla_block_128=_since(v, False, ((0, 10, 0), True)),         # platforms/cuda.py
        mxfp4_triton_on_hopper=_since(v, False, ((0, 12, 0), True)),        # quantization/mxfp4.py get_mxfp4_backend
        mxfp4_triton_frees_loaded_scales=_since(v, False, ((0, 25, 0), True)),  # oracle/mxfp4.py TRITON_BACKENDS
        # the PyPI x86_64 wheels: "release 12.8" / "release 12.9" / "release 13.0" in _C.abi3.so (none readable before
        # 0.9: CUDA 12 before 12.8, it has no sm_100), libcudart.so.12 up to 0.19.1, libcudart.so.13 from 0.20.0
        cuda_toolkit=_since(v, "12", ((0, 9, 0), "12.8"), ((0, 12, 0), "12.9"), ((0, 20, 0), "13.0")),
        # the SASS targets in the .nv_fatbin of vllm/_C.abi3.so (_C_stable_libtorch.abi3.so from 0.24), read in every
        # wheel 0.6.6 ... 0.33.0: Blackwell from 0.9 (sm_100) and 0.9.2 (sm_120); Volta dropped with CUDA 13 in 0.20
        # (vllm#39878: TORCH_CUDA_ARCH_LIST "7.0 7.5 8.0 8.9 9.0 10.0 12.0" -> "7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX")
        cuda_archs=_since(v, ((7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0)),
                          ((0, 9, 0), ((7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0))),
                          ((0, 9, 1), ((7, 0), (7, 5), (8, 0), (8, 7), (8, 9), (9, 0), (10, 0))),
                          ((0, 9, 2), ((7, 0), (7, 5), (8, 0), (8, 7), (8, 9), (9, 0), (10, 0), (12, 0))),
                          ((0, 11, 1), ((7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (12, 0))),
                          ((0, 20, 0), ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)))),
        aarch64_wheels=_since(v, False, ((0, 10, 2), True)),                # PyPI's vllm files (manylinux_*_aarch64)
        v1_needs_ampere=(0, 8, 0) <= v < (0, 10, 2),                         # engine/arg_utils._is_v1_supported_oracle
        auto_dtype_avoids_bf16=_since(v, False, ((0, 9, 0), True)),         # config _get_and_verify_dtype fallback
        fp8_min_capability=_since(v, 80, ((0, 14, 0), 75)),                 # quantization/fp8.py get_min_capability
        # docs/getting_started/installation (amd-installation.rst up to 0.6, gpu/rocm.inc.md after) "GPU:" list, as
        # read in the 0.6.0, 0.7.2, 0.9.0, 0.11.0 and 0.14.0 docs (a change is dated by the first of those naming it)
        rocm_archs=_since(v, frozenset({"gfx90a", "gfx942", "gfx1100"}),
                          ((0, 9, 0), frozenset({"gfx90a", "gfx942", "gfx1100", "gfx1101", "gfx1200", "gfx1201"})),
                          ((0, 11, 0), frozenset({"gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200",
                                                  "gfx1201"})),
                          ((0, 14, 0), frozenset({"gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200",
                                                  "gfx1201", "gfx1150", "gfx1151"}))),
            # platforms/rocm.py RocmPlatform.get_current_memory_usage: torch.cuda.mem_get_info's total - free (0.8.5-0.20,
        # no empty_cache first), torch.cuda.max_memory_allocated from 0.21 (as platforms/cuda.py)
        rocm_weights_device_wide=_since(v, True, ((0, 21, 0), False)),
        # quantization/mxfp4.py get_mxfp4_backend: "elif current_platform.is_rocm() and has_triton_kernels()" from
        # 0.10.2 (read to 0.18; fused_moe/oracle/mxfp4.py keeps a ROCm branch from 0.20)
        rocm_mxfp4_triton=_since(v, False, ((0, 10, 2), True)),
        # quantization/utils/fp8_utils.py _maybe_pad_fp8_weight (fp8.py in 0.8.0, the first wheel read that has it)
        rocm_fp8_padding=_since(v, False, ((0, 8, 0), True)),
        # fused_moe/layer.py UnquantizedFusedMoEMethod._maybe_pad_weight (0.8.5; unquantized_fused_moe_method.py later)
        rocm_moe_padding=_since(v, False, ((0, 8, 5), True)),
        # compressed_tensors_moe.py get_moe_method: "or current_platform.is_rocm()" -> CompressedTensorsWNA16MoEMethod
        # from 0.11.1; 0.20 moved the choice into fused_moe/oracle/int_wna16.py, not read: not counted from there
        rocm_wna16_moe_keeps_g_idx=(0, 11, 1) <= v < (0, 20, 0),
        # multimodal/registry.py init_mm_limits_per_prompt (.get(key, 1)) to 0.8.0; config MultiModalConfig
        # .get_limit_per_prompt "999 if envs.VLLM_USE_V1 else 1" from 0.8.5 (the 0.8.1-0.8.4 wheels unread), 999 in
        # config/multimodal.py from 0.12 (no V0 left)
        mm_default_limit=_since(v, 1, ((0, 8, 5), 999)),
        mm_counts_are_limits=_since(v, True, ((0, 8, 5), False)),        # registry.get_max_tokens_per_item_by_modality
        mm_encoder_budget_fixed=_since(v, 16384, ((0, 7, 3), None)),     # config.py SchedulerConfig (0.6.6), ECM
        # gpu_model_runner.profile_run: min(budget, cache) // T (0.6.6), cdiv (0.7.3-0.9.2), max(1, //) (0.10.0);
        # v1/worker/utils.py MultiModalBudget.get_max_items (0.10.1-0.15), multimodal/encoder_budget.py (0.16+)
        mm_items_rule=_since(v, "fixed", ((0, 7, 3), "ceil"), ((0, 10, 0), "floor"), ((0, 10, 1), "per_prompt")),
        # gpu_model_runner: dummy_data_for_profiling / get_decoder_dummy_data(seq_len=self.max_num_tokens) to
        # 0.9.2, seq_len=max_tokens_per_mm_item in 0.10.0, _get_mm_dummy_batch max_num_tokens 0.10.1-0.10.2,
        # max_model_len from 0.11.0
        mm_dummy_seq_len=_since(v, "batched", ((0, 10, 0), "max_tokens"), ((0, 10, 1), "batched"),
                                ((0, 11, 0), "model_len")),
        mm_contiguous_tokens=(0, 10, 1) <= v < (0, 13, 0),               # registry get_mm_max_contiguous_tokens
        # gpu_model_runner.profile_run: output.new_zeros((encoder_budget, ...)) 0.11.0-0.11.2, to
        # max_mm_tokens_per_item in 0.12.0, no expansion before or after
        mm_pad_outputs=_since(v, "none", ((0, 11, 0), "budget"), ((0, 12, 0), "item"), ((0, 13, 0), "none")),
        mm_inputs_model_dtype=(0, 9, 0) <= v < (0, 9, 1),                 # MultiModalKwargs.as_kwargs(dtype=...)
        mm_tiebreak_by_name=_since(v, False, ((0, 17, 0), True)),        # encoder_budget.py key=(x[1], x[0])
        skip_mm_profiling_flag=_since(v, False, ((0, 10, 1), True)),      # config MultiModalConfig.skip_mm_profiling
        # config/vllm.py _is_default_v2_model_runner_model: "or not model_config.is_moe" (not hybrid) from 0.25;
        # use_v2_model_runner for every model from 0.29
        mrv2_default_for_vl=_since(v, "never", ((0, 25, 0), "dense"), ((0, 29, 0), "all")),
        mrv2_profiles_encoder=_since(v, False, ((0, 27, 0), True)),      # gpu/mm/encoder_runner.profile_encoder_cache
        # models/qwen2_vl.py: one grid in 0.6.6 (get_max_qwen2_vl_mm_tokens), then _MAX_FRAMES_PER_VIDEO
        qwen_vl_max_frames=_since(v, 1, ((0, 7, 3), 16), ((0, 11, 0), 14)),
        qwen_vl_factorized_size=_since(v, False, ((0, 13, 0), True)),    # qwen2_vl.py closest_factor_pair
        qwen_video_frames_after_images=_since(v, True, ((0, 10, 2), False)),  # qwen2_vl get_num_frames_with_most_...
        # models/qwen3_vl.py get_max_video_tokens: frames by seq_len times 12.5 (timestamp text) 0.11-0.12, without it
        # 0.13-0.14, two frames of video_processor longest_edge / temporal_patch_size from 0.15
        qwen3_vl_video_rule=_since(v, "frames_x12.5", ((0, 13, 0), "frames"), ((0, 15, 0), "two_frames")),
        # models/internvl.py ctx_video_token / supports_video
        internvl_video_text_types=_since(v, frozenset(), ((0, 9, 0), frozenset({"qwen2"})),
                                         ((0, 10, 2), frozenset({"qwen2", "qwen3", "qwen3_moe", "gpt_oss"}))),
        mllama_runs=_since(v, True, ((0, 11, 0), False)),                # registry.py: Mllama last in 0.10.2
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
                                                    (_ESTIMATE_DROPPED, (0, 8, 0), (0, 9, 0)),
                                                    (_V2_GRAPHS_UNBUDGETED, (0, 22, 0), (0, 29, 0)))
                          if first <= v < fixed),
    )


def oldest() -> VllmRelease:
    return release(OLDEST)


def nearest_cuda_release(compute_capability: tuple[int, int], version: Version) -> tuple[Version, bool] | None:
    """For a refusal's advice: the modelled release nearest to `version` whose PyPI wheel has kernels for this compute
    capability (a newer one as the first that has, an older one as its minor's first patch) and whether it is newer;
    None when no release's wheel does."""
    from oomguard.engines.vllm.versions import NEWEST
    running = [(0, minor, patch) for minor in range(OLDEST[1], NEWEST[1] + 1) for patch in range(0, 10)
               if release((0, minor, patch)).runs_cuda(compute_capability)]
    if not running:
        return None
    newer = [r for r in running if r > version]
    return (newer[0], True) if newer else ((0, running[-1][1], 0), False)


# --kv-cache-dtype values whose pages carry scales beside the values (kv.KV_CACHE_DTYPES), and the first release whose
# config/cache.py CacheDType lists each
_PACKED_KV_CACHE_DTYPES = {"nvfp4": (0, 20, 0), "int8_per_token_head": (0, 20, 0), "fp8_per_token_head": (0, 20, 0),
                           "int4_per_token_head": (0, 25, 0), "nvfp4_4over6": (0, 28, 0)}


def first_release_with_kv_cache_dtype(name: str) -> Version | None:
    return _PACKED_KV_CACHE_DTYPES.get(name)


def first_release_where(holds) -> Version | None:
    """The oldest modelled release for which `holds(release)` is true (for a refusal's advice)."""
    from oomguard.engines.vllm.versions import NEWEST
    for minor in range(OLDEST[1], NEWEST[1] + 1):
        for patch in range(0, 10):
            if holds(release((0, minor, patch))):
                return (0, minor, patch)
    return None


def last_release_running(family: str) -> Version | None:
    """The newest modelled release that still runs a model type vLLM dropped (None: not one it dropped)."""
    from oomguard.engines.vllm.versions import NEWEST
    if family not in _REMOVED_MODEL_TYPES:
        return None
    running = [(0, minor, 0) for minor in range(OLDEST[1], NEWEST[1] + 1)
               if family not in release((0, minor, 0)).removed_model_types]
    return running[-1] if running else None


def default_release_for(model_type: str) -> Version:
    """The release a plan models when none is named: the newest, or for a model type vLLM dropped the last that runs
    it."""
    from oomguard.engines.vllm.versions import NEWEST
    return last_release_running(model_type) or NEWEST if model_type in _REMOVED_MODEL_TYPES else NEWEST


def first_release_running(family: str) -> Version | None:
    """The oldest modelled release whose hybrid_model_types or late_model_types include `family` (for a refusal's
    advice)."""
    from oomguard.engines.vllm.versions import NEWEST
    for minor in range(OLDEST[1], NEWEST[1] + 1):
        for patch in range(0, 10):
            rel = release((0, minor, patch))
            if family in rel.hybrid_model_types or family in rel.late_model_types:
                return (0, minor, patch)
    return None
