"""vLLM's startup memory, predicted per GPU as vLLM computes it, for a given version.

Reads top to bottom like vLLM's own startup (vllm/v1/worker/gpu_worker.py, vllm/v1/core/kv_cache_utils.py):
  requested = total x gpu_memory_utilization
  available KV = requested - weights - activation peak - non-torch increase [- CUDA graphs, from 0.20]
  blocks = available // bytes per block (min over workers); tokens and concurrency from the blocks
  then the checks vLLM makes, in its order, each with vLLM's own error text.
Pure: no I/O. Every figure carries its provenance (exact arithmetic, fitted estimate, or given).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from oomguard.engines.vllm import defaults, messages, profile
from oomguard.engines.vllm.flags import ENGINE_DESTS, FEATURE_DESTS
from oomguard.engines.vllm.kv import (KV_CACHE_DTYPES, KV_CACHE_DTYPES_NOT_MODELLED, ChunkedLocalAttentionSpec,
                                      FullAttentionSpec, KvElement, KvLayout, KvSpec, MambaSpec, MLAAttentionSpec,
                                      SlidingWindowSpec, build_layout, estimate_max_model_len, kv_cache_tokens,
                                      max_concurrency, num_blocks)
from oomguard.engines.vllm import lora as lora_slots
from oomguard.engines.vllm.lora import LoraConfig
from oomguard.engines.vllm.measured import REPEAT_GIB, MeasuredFigures, WorkerFigures
from oomguard.engines.vllm.platform import platform_of
from oomguard.engines.vllm.multimodal import MultimodalConfig, encoder_profile
from oomguard.engines.vllm.offload import OffloadConfig, host_memory
from oomguard.engines.vllm import speculative as spec_decode
from oomguard.engines.vllm.speculative import SpeculativeConfig
from oomguard.engines.vllm.releases import (LATE_MODEL_TYPES, REMOVED_MODEL_TYPES, VllmRelease,
                                            first_release_running, first_release_where,
                                            first_release_with_kv_cache_dtype, last_release_running, release)
from oomguard.engines.vllm.versions import Version, fmt
from oomguard.engines.vllm.weights import (Parallel, builds_indexer, indexer_skips_topk, mxfp4_backend, padded_vocab,
                                           served_spec, stage_weight_bytes)
from oomguard.errors import UsageError
from oomguard.gpus.spec import GpuSpec
from oomguard.models.spec import DTYPE_BYTES, LinearAttentionSpec, MambaMixerSpec, ModelSpec, QuantSpec
from oomguard.units import GiB, cdiv
from oomguard.failures import FailureClass

FP8_DS_MLA_BYTES = 656   # flashmla_sparse.py: 512 fp8 latent values, 4 fp32 scales, 64 bf16 RoPE values
_DTYPES = {"auto": None, "half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
           "float32": "float32"}
# --quantization values that load a matching pre-quantized checkpoint
_SAME_METHOD = {"awq": "awq", "awq_marlin": "awq", "gptq": "gptq", "gptq_marlin": "gptq", "fp8": "fp8",
                "compressed-tensors": "compressed-tensors", "mxfp4": "mxfp4", "modelopt_fp4": "modelopt_fp4",
                "modelopt": "modelopt", "bitsandbytes": "bitsandbytes", "moe_wna16": None}


@dataclass(frozen=True)
class EngineConfig:
    """vLLM engine settings, by vLLM's own argparse names. None means 'not given: vLLM's default applies'."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None          # -1: auto-fit (>= 0.14)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    enforce_eager: bool = False
    enable_prefix_caching: bool | None = None
    cpu_offload_gb: float = 0.0
    kv_cache_memory_bytes: int | None = None
    enable_expert_parallel: bool = False
    performance_mode: str = "balanced"        # "interactivity" / "throughput" (0.17+)
    usage_context: str = "serve"              # "serve" (vllm serve) or "llm" (the LLM class)
    lora: LoraConfig | None = None            # --enable-lora and its sizes
    speculative: SpeculativeConfig | None = None  # --speculative-config (or the older separate flags)
    multimodal: MultimodalConfig | None = None    # --limit-mm-per-prompt, --mm-processor-kwargs, --skip-mm-profiling
    offload: OffloadConfig | None = None      # --swap-space, --kv-offloading-*, an offloading KV connector
    feature_flags: dict = field(default_factory=dict)   # the flags the typed configs above came from, as given

    @classmethod
    def from_flags(cls, flags: dict) -> EngineConfig:
        """From vLLM flag dests (None values dropped); the feature flags become their typed configs."""
        flags = {k: v for k, v in flags.items() if v is not None}
        given = {k: v for k, v in flags.items() if k in FEATURE_DESTS}
        plain = {k: v for k, v in flags.items() if k not in FEATURE_DESTS}
        return cls(**plain, lora=LoraConfig.from_flags(given), speculative=SpeculativeConfig.from_flags(given),
                   multimodal=MultimodalConfig.from_flags(given), offload=OffloadConfig.from_flags(given),
                   feature_flags=given)

    def flags(self, changed_only: bool = False) -> dict:
        """vLLM flag dests again (the feature flags as given); `changed_only`: those differing from vLLM's defaults."""
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name in ENGINE_DESTS
                 and not (changed_only and getattr(self, f.name) == f.default)}
        return {**plain, **self.feature_flags}

    def with_flags(self, changes: dict) -> EngineConfig:
        """This configuration with some flags changed (a draft model's loaded config kept unless its flag changes)."""
        changed = EngineConfig.from_flags({**self.flags(), **changes})
        if "speculative_config" not in changes and self.speculative:
            changed = replace(changed, speculative=self.speculative)
        return changed


@dataclass(frozen=True)
class WorkerMemory:
    """One GPU of one pipeline stage (all TP ranks of a stage are alike)."""

    stage: int
    layers: int
    weights_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int                 # what capture takes
    cuda_graph_estimate_bytes: int        # vLLM's estimate before capture (subtracted from the budget from 0.20)
    kv_cache_bytes: int          # available for the KV cache on this worker
    num_blocks: int              # blocks this worker alone could hold
    bytes_per_block: int
    # the parts of the figures above that LoRA, speculative decoding and multimodal inputs take (0 when unused)
    lora_bytes: int = 0                  # LoRA slots, in weights_bytes
    speculative_weights_bytes: int = 0   # the drafter's weights, in weights_bytes
    speculative_kv_bytes: int = 0        # the drafter's layers' share of the KV cache
    encoder_cache_bytes: int = 0         # encoder outputs and inputs held through the profile run, in the peak
    sampling_state_bytes: int = 0        # model runner V2's per-request sampling state (in the budget from 0.27)


@dataclass(frozen=True)
class MemoryReport:
    model_id: str
    gpu_name: str
    gpu_count: int
    vllm_version: str
    engine: str
    config: dict                 # the resolved settings (every default filled in)
    total_memory_bytes: int
    requested_memory_bytes: int
    start_used_bytes: int
    workers: tuple[WorkerMemory, ...]
    cuda_graphs_in_budget: bool
    num_gpu_blocks: int
    block_size: int
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len: int
    starts: bool                 # vLLM's checks pass at the predicted figures
    verdict: str                 # "starts", "fails", or "at_risk" when the uncertainty straddles a limit
    risks: tuple[str, ...]       # which limit the uncertainty straddles, and by how much
    kv_cache_low_bytes: int      # the range the available KV memory falls in, given the estimates' uncertainty
    kv_cache_high_bytes: int
    error: str | None
    error_class: str | None
    estimated_max_model_len: int | None
    needed_kv_bytes: int
    headroom_bytes: int          # free on the tightest GPU once vLLM is up (KV, graphs, warm-up done)
    assumptions: tuple[str, ...]
    provenance: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    kv_layout: KvLayout | None = field(default=None, repr=False)   # the tightest worker's, for workload checks
    in_flight_tokens: int = 0
    host_memory_bytes: int = 0   # CPU memory for offloading (swap space, KV offloading), all GPUs together
    sampling_state_in_budget: bool = False   # model runner V2's sampling state is subtracted from the budget

    @property
    def first(self) -> WorkerMemory:
        """The worker whose numbers vLLM prints ('Available KV cache memory' comes from the first rank)."""
        return self.workers[0]

    @property
    def kv_cache_bytes(self) -> int:
        return self.first.kv_cache_bytes

    def requests_held(self, tokens: int, shared_tokens: int = 0) -> float:
        """Requests of `tokens` each the KV cache holds at once; `shared_tokens` of each stored once (prefix cache)."""
        if self.kv_layout is None or self.num_gpu_blocks <= 0:
            return 0.0
        per_request = self.kv_layout.blocks_per_request(tokens, self.in_flight_tokens)
        shared = self.kv_layout.blocks_per_request(shared_tokens, self.in_flight_tokens) if shared_tokens else 0
        # kv_cache_utils.get_max_concurrency_for_kv_cache_config, with the shared blocks counted once
        return max(self.num_gpu_blocks - shared, 0) / max(per_request - shared, 1)

    def to_dict(self) -> dict:
        w = self.first
        out = {
            "model": self.model_id, "gpu": self.gpu_name, "gpu_count": self.gpu_count,
            "vllm_version": self.vllm_version, "engine": self.engine,
            "total_memory_gib": _gib(self.total_memory_bytes), "requested_memory_gib": _gib(self.requested_memory_bytes),
            "weights_gib": _gib(w.weights_bytes), "activation_peak_gib": _gib(w.activation_peak_bytes),
            "non_torch_gib": _gib(w.non_torch_bytes), "cuda_graph_gib": _gib(w.cuda_graph_bytes),
            "cuda_graph_estimate_gib": _gib(w.cuda_graph_estimate_bytes),
            "cuda_graphs_in_budget": self.cuda_graphs_in_budget,
            "lora_gib": _gib(w.lora_bytes), "speculative_weights_gib": _gib(w.speculative_weights_bytes),
            "speculative_kv_gib": _gib(w.speculative_kv_bytes), "encoder_cache_gib": _gib(w.encoder_cache_bytes),
            "sampling_state_gib": _gib(w.sampling_state_bytes),
            "host_memory_gib": _gib(self.host_memory_bytes),
            "kv_cache_gib": _gib(w.kv_cache_bytes), "kv_cache_tokens": self.kv_cache_tokens,
            "num_gpu_blocks": self.num_gpu_blocks, "block_size": self.block_size,
            "max_concurrency": round(self.max_concurrency, 2), "max_model_len": self.max_model_len,
            "starts": self.starts, "verdict": self.verdict, "risks": list(self.risks),
            "kv_cache_gib_low": _gib(self.kv_cache_low_bytes),
            "kv_cache_gib_high": _gib(self.kv_cache_high_bytes),
            "estimated_max_model_len": self.estimated_max_model_len,
            "error": self.error, "error_class": self.error_class, "headroom_gib": _gib(self.headroom_bytes),
            "config": self.config, "assumptions": list(self.assumptions), "warnings": list(self.warnings),
            "provenance": self.provenance,
            "per_gpu": [{k: (_gib(v) if k.endswith("_bytes") and k != "bytes_per_block" else v)
                         for k, v in asdict(x).items()} for x in self.workers],
        }
        return out


def _requested(total: int, util: float, rel: VllmRelease) -> int:
    """The memory vLLM requests: total x gpu_memory_utilization (v1/worker/gpu_worker.py
    determine_available_memory; worker/worker.py in V0), rounded as the release rounds it."""
    return math.ceil(total * util) if rel.requested_rounds_up else int(total * util)


def _estimate_margin(figures: tuple[str, ...], measured: frozenset[str]) -> int:
    """What the figures may be off by, in bytes: the fitted ones' 90th-percentile residual, the measured ones' repeat
    allowance (once)."""
    fitted = sum(profile.ESTIMATE_P90_GIB[k] for k in figures if k not in measured)
    return int((fitted + (REPEAT_GIB if measured & set(figures) else 0.0)) * GiB)


def _gib(n: float) -> float:
    return round(n / GiB, 2)


def resolve_dtype(model: ModelSpec, cfg: EngineConfig, gpu: GpuSpec,
                  rel: VllmRelease | None = None) -> tuple[str, list[str]]:
    """ModelConfig dtype resolution (_resolve_auto_dtype): auto -> checkpoint dtype; fp32 is served in 16 bits; from
    0.9 a bfloat16 checkpoint on a GPU without bfloat16 is served in float16 (vLLM warns, where it used to refuse)."""
    if cfg.dtype not in _DTYPES:
        raise UsageError(f"unknown --dtype {cfg.dtype!r}: use auto, half, float16, bfloat16 or float32")
    notes = []
    dtype = _DTYPES[cfg.dtype] or model.dtype
    if cfg.dtype == "auto" and dtype == "float32":
        dtype = "bfloat16" if gpu.supports_bf16 else "float16"
        notes.append(f"dtype auto: float32 (config.json's dtype, or transformers' default when it names none) "
                     f"is served in {dtype}")
    if cfg.dtype == "auto" and dtype == "bfloat16" and not gpu.supports_bf16 and rel and rel.auto_dtype_avoids_bf16:
        dtype = "float16"
        cc = gpu.compute_capability
        notes.append(f"dtype auto: the bfloat16 checkpoint is served in float16 on compute capability {cc[0]}.{cc[1]} "
                     f"(vLLM {fmt(rel.version)} warns \"doesn't support torch.bfloat16. Falling back to "
                     "torch.float16\")")
    if cfg.dtype == "auto" and model.quant and model.quant.method in ("awq", "gptq") and dtype == "bfloat16":
        notes.append("AWQ/GPTQ checkpoints run in float16 unless a Marlin kernel is used (it is, on cc >= 8.0)")
    return dtype, notes


def resolve_quant(model: ModelSpec, cfg: EngineConfig) -> QuantSpec | None:
    """Which quantization applies: the checkpoint's, or an online one (--quantization fp8 / bitsandbytes)."""
    wanted = cfg.quantization
    if wanted in (None, "", "none"):
        return model.quant
    if wanted not in _SAME_METHOD:
        raise UsageError(f"--quantization {wanted!r} is not modelled; use one of {', '.join(sorted(_SAME_METHOD))}")
    if model.quant:
        same = _SAME_METHOD[wanted]
        if same is None or same == model.quant.method:
            return model.quant
        raise UsageError(f"{model.model_id} is a {model.quant.method} checkpoint; --quantization {wanted} does not "
                         f"match it: drop --quantization or use --quantization {model.quant.method}")
    if wanted == "fp8":  # online dynamic FP8: weights become float8_e4m3 with one scale per tensor
        return QuantSpec(method="fp8", bits=8, scale_bytes=4, fp8_strategy="online")
    if wanted == "bitsandbytes":  # in-flight 4-bit NF4 with double quantization
        return QuantSpec(method="bitsandbytes", bits=4, group_size=64, scale_bytes=1 + 4 / 256)
    raise UsageError(f"{model.model_id} is not a checkpoint quantized with {wanted}; --quantization {wanted} needs "
                     "a pre-quantized checkpoint (pick its id, e.g. an -AWQ or -GPTQ repository) or use "
                     "--quantization fp8")


def gpu_support(gpu: GpuSpec, rel: VllmRelease, notes: list[str], warnings: list[str]) -> str | None:
    """Whether this release's official build runs on `gpu`: the error that stops it (the PyPI wheel has no kernels for
    its compute capability), or None; what only warns or needs another install goes to `warnings` / `notes`."""
    name, cc = gpu.name, gpu.compute_capability
    if gpu.vendor == "nvidia" and not rel.runs_cuda(cc):
        return messages.no_kernel_image(name, cc, rel.version)
    if gpu.vendor == "amd" and gpu.gfx_arch and gpu.gfx_arch not in rel.rocm_archs:
        warnings.append(f"vLLM {fmt(rel.version)}'s ROCm install docs do not list {gpu.gfx_arch} ({name}): its ROCm "
                        "images and wheels may carry no kernels for it; use a release that lists it, or a build with "
                        f"PYTORCH_ROCM_ARCH={gpu.gfx_arch}")
    if gpu.arm_host and not rel.aarch64_wheels:
        notes.append(f"PyPI has no aarch64 vLLM wheel before 0.10.2: on {name}'s Arm host vLLM {fmt(rel.version)} "
                     "comes from a source build or a container image")
    return None


def default_engine(gpu: GpuSpec, rel: VllmRelease, notes: list[str]) -> str:
    """The engine vLLM picks: its default, except V0 below compute capability 8.0 while V1 needed Ampere (the oracle
    warns "Compute Capability < 8.0 is not supported by the V1 Engine. Falling back to V0"; with VLLM_USE_V1=1 it
    raises instead)."""
    cc = gpu.compute_capability
    if rel.default_engine == "v1" and rel.v1_needs_ampere and gpu.vendor == "nvidia" and cc < (8, 0):
        notes.append(f"engine V0: vLLM {fmt(rel.version)} falls back from V1 to V0 on compute capability "
                     f"{cc[0]}.{cc[1]} (V1 needs 8.0 until 0.10.2)")
        return "v0"
    return rel.default_engine


def default_block_size(model: ModelSpec, gpu: GpuSpec, version: Version) -> int:
    """CudaPlatform block size: 16, or the MLA backend's (FlashMLA 64 on Hopper, CUTLASS MLA 128 on Blackwell)."""
    if model.indexer:
        # DeepSeek-V3.2 / GLM-5: platforms/cuda.py forces 64 for FlashMLASparse (0.11); its kernel and the indexer's
        # (v1/attention/backends/mla/flashmla_sparse.py, indexer.py) take only 64 after
        return 64
    if model.mla:
        rel = release(version)
        if gpu.compute_capability[0] == 10 and rel.cutlass_mla_block_128:  # data-centre Blackwell only
            return 128
        if gpu.compute_capability >= (9, 0) and rel.flashmla_block_64:
            return 64
    return 16


def recurrent_state_spec(model: ModelSpec, cfg: EngineConfig, gpu: GpuSpec, rel: VllmRelease, tp: int,
                         act_bytes: int, kv: KvElement, max_model_len: int) -> MambaSpec | None:
    """A Gated DeltaNet or Mamba layer's state page, and the attention block size that makes an attention page hold it
    (models/config.py HybridAttentionMambaModelConfig.verify_and_update_config up to 0.19,
    platforms/interface.py _align_hybrid_block_size from 0.20): block = align x cdiv(state, align x KV bytes per
    token); the state is padded to block x KV bytes per token. None where the release plans the model as a plain
    decoder (a hybrid architecture whose layer_types are all attention, Granite-4.0 micro, from 0.11.1)."""
    family = model.model_type + ("_moe" if model.model_type == "nemotron_h" and model.moe else "")
    if family not in rel.hybrid_model_types:
        first = first_release_running(family)
        since = fmt(first) if first else "a newer release"
        raise UsageError(f"vLLM {fmt(rel.version)} does not run {family} models ({model.model_id}); "
                         f"they need vLLM {since} or newer: pick --vllm-version {since} or later")
    if not model.has_recurrent_layers and not rel.attention_only_hybrid_is_hybrid:
        return None
    conv, temporal = model.recurrent.state_elements(tp)   # mamba_utils.MambaStateShapeCalculator, by the mixer's type
    ssm_dtype = model.recurrent.ssm_dtype      # Qwen3.5's config pins it (vLLM 0.17+ reads it)
    if model.model_type == "nemotron_h":       # models/config.py NemotronHForCausalLMConfig, from 0.13
        ssm_dtype = (ssm_dtype or rel.nemotron_h_ssm_dtype) if rel.nemotron_h_ssm_dtype else None
    ssm_bytes = DTYPE_BYTES[ssm_dtype] if ssm_dtype else act_bytes
    state = conv * act_bytes + temporal * ssm_bytes      # mamba_cache_dtype / mamba_ssm_cache_dtype "auto"
    per_token = _attention_bytes_per_token(model, tp, kv)
    prefix = cfg.enable_prefix_caching if cfg.enable_prefix_caching is not None else rel.hybrid_prefix_caching_default
    align_mode = prefix and rel.hybrid_prefix_caching_possible          # mamba_cache_mode "align", else "none"
    align, pages = 16, 1
    if align_mode:
        align, pages = 16, 2                                             # the running state and the last full block's
        if isinstance(model.recurrent, MambaMixerSpec) and rel.mamba2_prefill_checkpoint:
            pages = 3                                                    # MambaMixer2's prefill checkpoint block
        if isinstance(model.recurrent, LinearAttentionSpec) and rel.gdn_flashinfer_checkpoint and \
                gpu.compute_capability[0] == 9:
            align, pages = 64, 3                                         # FlashInfer GDN prefill checkpoints
    block = align * cdiv(state, align * per_token)
    if cfg.block_size and cfg.block_size > block:
        block = cfg.block_size
    return MambaSpec(block if align_mode else max_model_len, state, block * per_token, pages)


def _attention_bytes_per_token(model: ModelSpec, tp: int, kv: KvElement) -> int:
    """K and V of one token in one full-attention layer on one TP rank (FullAttentionSpec with block_size 1)."""
    return FullAttentionSpec(1, max(1, model.num_kv_heads // tp), model.head_dim, kv.bytes,
                             scale_bytes=kv.scale_bytes).page_size_bytes


def _kv_specs(model: ModelSpec, layers: range, tp: int, block_size: int, kv: KvElement,
              state: MambaSpec | None = None, ds_mla: bool = False, version: Version | None = None) -> list[KvSpec]:
    """One spec per layer, by the attention kind config.json gives it (each model's get_kv_cache_spec); `version`
    decides which DSA layers have an indexer K cache (weights.builds_indexer; None: the newest release)."""
    specs: list[KvSpec] = []
    for i in layers:
        kind = model.layer_attention[i]
        # per-layer KV heads and width where layers differ (Gemma 4: gemma4_layer_config)
        heads, head_dim = max(1, model.kv_heads_at(i) // tp), model.head_dim_at(i)
        if model.reads_shared_kv(i):
            # gpu_model_runner.get_kv_cache_spec: a layer with kv_sharing_target_layer_name gets no spec of its own
            continue
        if kind in ("linear", "mamba"):
            specs.append(state)
        elif kind == "none":
            continue
        elif kind == "mla":
            m = model.mla
            if ds_mla:  # kv_cache_interface.MLAAttentionSpec: fp8_ds_mla pages are 656 bytes a token
                specs.append(MLAAttentionSpec(block_size, 1, FP8_DS_MLA_BYTES, 1))
            else:
                specs.append(MLAAttentionSpec(block_size, 1, m.kv_lora_rank + m.qk_rope_head_dim, kv.bytes))
            if builds_indexer(model, i, version):
                # deepseek_v2.py DeepseekV32IndexerCache.get_kv_cache_spec: MLAAttentionSpec(head_size=index_head_dim
                # + index_head_dim // 128 * 4, dtype=uint8): fp8 keys and one fp32 scale per 128, whatever the KV dtype
                # (registered by each Indexer: from 0.24 only in the layers computing their own top-k)
                specs.append(_indexer_kv_spec(model, block_size))
        elif kind == "sliding":
            specs.append(SlidingWindowSpec(block_size, heads, head_dim, kv.bytes, model.sliding_window,
                                           scale_bytes=kv.scale_bytes))
        elif kind == "chunked":
            specs.append(ChunkedLocalAttentionSpec(block_size, heads, head_dim, kv.bytes,
                                                   model.attention_chunk_size, scale_bytes=kv.scale_bytes))
        else:
            specs.append(FullAttentionSpec(block_size, heads, head_dim, kv.bytes, scale_bytes=kv.scale_bytes))
        if model.mixer_beside_attention:
            # falcon_h1.py FalconH1ParallelHybrid: the layer's MambaMixer2 (registered as layer num_layers + i) has its
            # own MambaSpec beside the attention's page (MambaBase.get_kv_cache_spec)
            specs.append(state)
    return specs


def _indexer_kv_spec(model: ModelSpec, block_size: int) -> MLAAttentionSpec:
    """DeepseekV32IndexerCache.get_kv_cache_spec: the indexer's fp8 keys and one fp32 scale per 128."""
    d = model.indexer.head_dim
    return MLAAttentionSpec(block_size, 1, d + d // 128 * 4, 1)


def _draft_kv_specs(drafter, target: list[KvSpec], tp: int, block_size: int, kv: KvElement,
                    model: ModelSpec | None = None) -> list[KvSpec]:
    """The drafter's KV-bearing layers, registered beside the target's (gpu_model_runner.get_kv_cache_spec): EAGLE
    heads and MTP layers shaped like the target's full attention; a draft model's own layers. A DSA model's MTP
    layer is a decoder layer past the last one, whose indexer vLLM always builds (is_mtp_layer): its MLA latent and
    its indexer K cache."""
    if drafter is None:
        return []
    if drafter.draft_model is not None:
        d = drafter.draft_model
        return _kv_specs(d, range(d.num_layers), tp, block_size, kv)
    full = [s for s in target if isinstance(s, (FullAttentionSpec, MLAAttentionSpec))
            and not isinstance(s, (SlidingWindowSpec, ChunkedLocalAttentionSpec))]
    if model is not None and model.indexer is not None and drafter.mtp:
        indexer = _indexer_kv_spec(model, block_size)
        latent = [s for s in full if s != indexer]
        return (latent[-1:] + [indexer]) * drafter.attention_layers if latent else []
    return full[-1:] * drafter.attention_layers if full else []


def _vllm_shares_as_checkpoint(model: ModelSpec, rel: VllmRelease) -> bool:
    """The release makes exactly the layers the checkpoint declares shared reuse another layer's top-k."""
    ix = model.indexer
    return {i for i in range(model.num_layers) if indexer_skips_topk(ix, i, rel)} == set(ix.shared_layers)


def _check_index_sharing(model: ModelSpec, cfg: EngineConfig, rel: VllmRelease, warnings: list[str]) -> None:
    """A checkpoint whose indexer is shared across layers (GLM-5.2's IndexShare) carries an indexer only in the layers
    computing their own top-k. A release that reads the sharing otherwise (before 0.23: not at all without
    use_index_cache, and with it at a fixed offset of 2; deepseek_v2.py DeepseekV2MLAAttention.__init__) would run
    an indexer the checkpoint does not have: refused. 0.23 reads it but still builds an indexer in every layer, so an
    unquantized checkpoint fails the loader's check that every parameter was loaded (model_loader/default_loader.py
    DefaultModelLoader.load_weights, on for models without quantization) unless it is turned off."""
    ix = model.indexer
    if not _vllm_shares_as_checkpoint(model, rel):
        since = first_release_where(lambda r: _vllm_shares_as_checkpoint(model, r))
        advice = f"it needs vLLM {fmt(since)} or newer: pick --vllm-version {fmt(since)} or later" if since else \
            "no modelled release does"
        reuse = (f"index_topk_freq {ix.topk_freq}, index_skip_topk_offset "
                 f"{2 if ix.skip_offset is None else ix.skip_offset}") if ix.topk_pattern is None else \
            "index_topk_pattern"
        raise UsageError(f"vLLM {fmt(rel.version)} does not run {model.model_id}'s shared sparse-attention indexer "
                         f"({reuse}: {len(ix.shared_layers)} of {model.num_layers} layers reuse another layer's top-k "
                         f"and carry no indexer): it would compute top-k in layers without one; {advice}")
    if not rel.dsa_indexer_only_where_topk and model.quant is None and not cfg.quantization:
        warnings.append(f"vLLM {fmt(rel.version)} builds an indexer in all {model.num_layers} layers, and the "
                        f"{len(ix.shared_layers)} layers sharing another's carry none in the checkpoint: an "
                        "unquantized checkpoint stops at load ('Following weights were not initialized from "
                        "checkpoint: ...indexer.k_norm...') unless started with --model-loader-extra-config "
                        f"'{{\"enable_weights_track\": false}}' (the plan assumes it is), or use vLLM "
                        f"{fmt(first_release_where(lambda r: r.dsa_indexer_only_where_topk))} or newer")


def validate(model: ModelSpec, cfg: EngineConfig, gpu_count: int) -> None:
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    if tp < 1 or pp < 1 or cfg.data_parallel_size < 1:
        raise UsageError("parallel sizes must be positive integers")
    if model.num_heads % tp:
        good = [d for d in range(1, min(gpu_count, model.num_heads) + 1) if model.num_heads % d == 0]
        raise UsageError(f"{messages.tp_heads(model.num_heads, tp)} Use --tensor-parallel-size in {good}")
    if tp * pp * cfg.data_parallel_size > gpu_count:
        raise UsageError(f"tensor x pipeline x data parallel = {tp * pp * cfg.data_parallel_size} GPUs but only "
                         f"{gpu_count} given: raise --gpu-count or lower the parallel sizes")
    if pp > model.num_layers:
        raise UsageError(f"--pipeline-parallel-size {pp} exceeds the model's {model.num_layers} layers")
    util = cfg.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if cfg.max_model_len is not None and cfg.max_model_len <= 0 and cfg.max_model_len != -1:
        raise UsageError(f"--max-model-len must be positive (or -1/auto), got {cfg.max_model_len}")
    if cfg.kv_cache_dtype.startswith(KV_CACHE_DTYPES_NOT_MODELLED):
        raise UsageError(f"--kv-cache-dtype {cfg.kv_cache_dtype} sizes its pages in its attention backend, which oomguard "
                         "does not model yet: plan with nvfp4 or fp8 for comparison")
    if cfg.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise UsageError(f"unknown --kv-cache-dtype {cfg.kv_cache_dtype!r}: use auto, fp8, fp8_e4m3, fp8_e5m2, nvfp4, "
                         "int8_per_token_head, fp8_per_token_head or int4_per_token_head")
    if cfg.cpu_offload_gb < 0:
        raise UsageError("--cpu-offload-gb must be >= 0")
    if cfg.kv_cache_memory_bytes is not None and cfg.kv_cache_memory_bytes <= 0:
        raise UsageError("--kv-cache-memory-bytes must be positive")
    if cfg.usage_context not in ("serve", "llm"):
        raise UsageError("usage context must be 'serve' or 'llm'")


def predict(model: ModelSpec, gpu: GpuSpec, cfg: EngineConfig, version: Version, gpu_count: int = 1,
            engine: str | None = None, free_memory_bytes: int | None = None,
            coefficients: profile.ProfileCoefficients = profile.COEFFICIENTS,
            measured: MeasuredFigures | None = None, rocm: profile.RocmFit = profile.ROCM_FIT) -> MemoryReport:
    """What vLLM `version` does with the memory of each GPU at startup, and whether it starts. `measured`: what a
    start of the same setup printed (engines/vllm/measured.py), used in place of the estimates; `rocm`: what a ROCm
    start adds where vLLM's code gives no number (profile.RocmFit)."""
    validate(model, cfg, gpu_count)
    rel = release(version)
    model = served_spec(model, version)   # what this release builds of the checkpoint (Gemma 3n's towers)
    if cfg.block_size is not None and (cfg.block_size not in rel.block_sizes if rel.block_sizes
                                       else cfg.block_size % 16):
        allowed = ", ".join(map(str, rel.block_sizes)) if rel.block_sizes else "a multiple of 16"
        raise UsageError(f"--block-size {cfg.block_size} is not one vLLM {fmt(version)} takes: use {allowed}")
    late = next((k for k in (model.served_as, model.architecture) if k in LATE_MODEL_TYPES), model.model_type)
    if late in LATE_MODEL_TYPES and late not in rel.late_model_types:
        since = fmt(first_release_running(late))
        raise UsageError(f"vLLM {fmt(version)} does not run {late} models ({model.model_id}); they need "
                         f"vLLM {since} or newer: pick --vllm-version {since} or later")
    notes: list[str] = []
    if model.model_type in REMOVED_MODEL_TYPES:
        last = fmt(last_release_running(model.model_type))
        if model.model_type in rel.removed_model_types:
            # models/registry.py _raise_for_unsupported: "Model architecture X was supported in vLLM until v..."
            raise UsageError(f"vLLM {fmt(version)} no longer runs {model.model_type} models ({model.model_id}: "
                             f"{model.architecture} was dropped after vLLM {last}): pick --vllm-version {last} or "
                             "older")
        notes.append(f"vLLM dropped {model.model_type} models after {last}: {model.model_id} runs on vLLM {last} "
                     "or older")
    warnings: list[str] = []
    if model.indexer and model.indexer.shared_layers:
        _check_index_sharing(model, cfg, rel, warnings)
    engine = engine or default_engine(gpu, rel, notes)
    unsupported = gpu_support(gpu, rel, notes, warnings)
    tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
    par = Parallel(tp=tp, pp=pp, ep=cfg.enable_expert_parallel, dp=cfg.data_parallel_size)
    if cfg.enable_expert_parallel and model.moe and tp * cfg.data_parallel_size > 1:
        # the all-to-all kernels of expert parallelism (DeepEP, pplx) allocate their own communication buffers
        warnings.append("expert parallelism's all-to-all buffers are not counted here (several GiB per GPU with the "
                        "DeepEP and pplx kernels): keep that much headroom, or plan without --enable-expert-parallel")
    total = gpu.total_memory_bytes
    if gpu.unified_memory and free_memory_bytes is None:
        notes.append(f"{gpu.name} shares its {gpu.total_memory_bytes / GiB:.2f} GiB with the CPU: vLLM counts what the "
                     "OS and other processes use as used GPU memory, so less is free at start than the catalog "
                     "assumes; pass --free-memory GIB (what is free before launch) for a plan that accounts for it")
    if model.resolved_from:
        how = f" with {model.quant.method} {model.quant.bits}-bit weights" if model.quant else ""
        notes.append(f"{model.model_id} is not in the catalog: planned as {model.resolved_from}{how}")
    notes += model.load_notes
    host = host_memory(cfg.offload, rel, engine, tp * pp * cfg.data_parallel_size, tp * pp)
    if host.error:
        raise UsageError(host.error)
    notes += host.notes
    dtype, dtype_notes = resolve_dtype(model, cfg, gpu, rel)
    notes += dtype_notes
    act_bytes = DTYPE_BYTES[dtype]
    quant = resolve_quant(model, cfg)
    model_q = model if quant is model.quant else _with_quant(model, quant)
    platform = platform_of(gpu)
    if quant and quant.method == "mxfp4" and model.moe:
        notes.append(f"MXFP4 experts sized for vLLM's {mxfp4_backend(gpu.compute_capability, version, platform)} "
                     "MoE kernel on this GPU (its padding included)")

    util = cfg.gpu_memory_utilization
    if util is None:
        util = rel.gpu_memory_utilization
        notes.append(f"gpu_memory_utilization={util} (vLLM {fmt(version)} default)")
    requested = _requested(total, util, rel)

    # the official build's kernels stop it whatever the flags: reported before any check the flags could fix
    error, error_class = (unsupported, FailureClass.DTYPE_CAPABILITY) if unsupported else (None, None)
    max_len = cfg.max_model_len
    auto_fit = max_len == -1 and rel.max_model_len_auto
    if max_len is None or max_len == -1:
        max_len = model.derived_max_model_len
        notes.append(f"max_model_len={max_len} (derived from config.json)")
    elif max_len > model.derived_max_model_len and error is None:
        error = messages.max_len_above_derived(max_len, model.derived_max_model_len)
        error_class = FailureClass.CONTEXT_TOO_LONG
    if error is None and quant and quant.method == "fp8" and \
            gpu.compute_capability[0] * 10 + gpu.compute_capability[1] < rel.fp8_min_capability:
        # VllmConfig refuses a method below its get_min_capability (weight-only FP8 runs on Marlin down to it)
        error = messages.quantization_unsupported("fp8", rel.fp8_min_capability, gpu.compute_capability)
        error_class = FailureClass.DTYPE_CAPABILITY

    multimodal = model.vision is not None
    if cfg.performance_mode != "balanced" and not rel.performance_mode:
        raise UsageError(f"vLLM {fmt(version)} has no --performance-mode: it came in 0.17")
    chunks = defaults.v0_chunks_long_context(version, platform.rocm, model.sliding_window is not None,
                                             model.mla is not None, cfg.lora is not None, cfg.speculative is not None)
    seqs, tokens, batch_notes = defaults.resolve_batch(version, engine, gpu.name, total, cfg.usage_context, max_len,
                                                       multimodal, cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                                       cfg.performance_mode, chunks)
    notes += batch_notes
    if engine == "v1" and tokens < seqs and error is None:
        raise UsageError(f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({seqs})")
    kv = KV_CACHE_DTYPES[cfg.kv_cache_dtype] or KvElement(act_bytes)
    packed = first_release_with_kv_cache_dtype(cfg.kv_cache_dtype)
    if packed and cfg.kv_cache_dtype not in rel.packed_kv_cache_dtypes:
        raise UsageError(f"vLLM {fmt(version)} has no --kv-cache-dtype {cfg.kv_cache_dtype}: it came in {fmt(packed)}; "
                         f"pick --vllm-version {fmt(packed)} or later, or --kv-cache-dtype fp8")
    if packed and model.mla:
        raise UsageError(f"--kv-cache-dtype {cfg.kv_cache_dtype} on an MLA model ({model.model_id}) is not modelled: vLLM's "
                         "MLA backends keep their own page layouts; plan with --kv-cache-dtype fp8 or auto")
    # DeepSeek's fp8_ds_mla layout: asked for by name, or (0.18+) what an fp8 KV cache becomes on FlashMLA-sparse,
    # Hopper's sparse MLA backend (layers/attention/mla_attention.py MLAAttention.__init__)
    ds_mla = model.indexer is not None and (cfg.kv_cache_dtype == "fp8_ds_mla" or (
        cfg.kv_cache_dtype.startswith("fp8") and rel.fp8_kv_becomes_ds_mla and gpu.compute_capability[0] == 9))
    if model.indexer:
        with_indexer = sum(builds_indexer(model, i, version) for i in range(model.num_layers))
        which = "each layer also caches" if with_indexer == model.num_layers else \
            f"{with_indexer} of the {model.num_layers} layers (those computing their own top-k) also cache"
        notes.append(f"sparse attention (DSA): {which} the indexer's fp8 keys, "
                     f"{model.indexer.head_dim + model.indexer.head_dim // 128 * 4} bytes a token"
                     + (f"; the MLA latent in fp8_ds_mla, {FP8_DS_MLA_BYTES} bytes a token" if ds_mla else ""))
    block_size = cfg.block_size or default_block_size(model, gpu, version)
    if cfg.block_size is None and block_size != 16:
        notes.append(f"block_size={block_size} (the MLA attention backend's)")
    drafter = None
    if cfg.speculative:
        spec_decode.check(cfg.speculative, model, rel, engine, tp)
        drafter = spec_decode.drafter(cfg.speculative, model_q, rel, par, act_bytes, gpu.compute_capability)
        notes += drafter.notes
        warnings += drafter.warnings
    state = recurrent_state_spec(model, cfg, gpu, rel, tp, act_bytes, kv, max_len) if model.recurrent else None
    if state:
        if drafter and rel.mamba_spec_blocks and engine == "v1":
            # a request keeps the states of its k proposed tokens too (MambaSpec.num_speculative_blocks)
            state = replace(state, pages_per_request=state.pages_per_request + drafter.tokens)
        block_size = state.page_size_bytes // _attention_bytes_per_token(model, tp, kv)
        if not model.has_recurrent_layers:
            notes.append(f"attention block size {block_size} tokens: vLLM {fmt(version)} treats the hybrid "
                         f"architecture as hybrid although every layer is attention, and grows the block to hold the "
                         f"Mamba state its config describes ({state.state_bytes / 2**20:.2f} MiB; fixed in 0.11.1)")
    if state and model.has_recurrent_layers:
        notes.append(f"attention block size {block_size} tokens, so one attention page holds a "
                     f"{'linear-attention' if isinstance(model.recurrent, LinearAttentionSpec) else 'Mamba'} "
                     "layer's recurrent "
                     f"state ({state.state_bytes / 2**20:.2f} MiB a request, padded by "
                     f"{100 * (state.page_size_bytes - state.state_bytes) / state.state_bytes:.2f}%); "
                     f"{state.pages_per_request} state page(s) a request"
                     + (" (prefix caching keeps the last block's state too)" if state.pages_per_request > 1 else ""))
    # in-flight tokens bound the sliding-window worst case; async scheduling doubles them from 0.26
    in_flight = tokens * (2 if rel.async_scheduling and pp == 1 else 1)
    hybrid_manager = engine == "v1" and rel.hybrid_kv_manager and not (
        model.attention_chunk_size and rel.chunked_local_disables_hybrid)
    num_reqs = min(seqs, tokens)
    in_budget = engine == "v1" and rel.cuda_graphs_in_budget
    runner_v2 = engine == "v1" and spec_decode.runs_model_runner_v2(
        model, rel, cfg.speculative.method if cfg.speculative else None)
    # model runner V2 estimates no CUDA-graph pool before 0.29 (its profile_cudagraph_memory returns 0): nothing is
    # captured in the profiling window and nothing is charged to the budget
    graph_estimate_runs = not cfg.enforce_eager and (not runner_v2 or rel.v2_estimates_graphs)
    # model runner V2's sampler keeps per-request penalty counts on the last stage (v2_sampling_state_bytes)
    sampling_state = profile.v2_sampling_state_bytes(seqs, model.vocab_size) if runner_v2 else 0
    if runner_v2:
        notes.append(f"vLLM {fmt(version)} runs this model on model runner V2: its profile run warms the sampler up "
                     "with the logits and their float32 copy only"
                     + ("" if rel.v2_estimates_graphs or cfg.enforce_eager else
                        ", and it charges no CUDA-graph estimate to the KV budget")
                     + f"; its sampler keeps per-request penalty counts for {seqs} sequences ({_gib(sampling_state)} "
                       "GiB), "
                     + ("which the budget counts" if rel.budget_counts_consumed else
                        "outside the budget, so they come out of what stays free"))
    start_used = profile.start_used_bytes(engine, version, tp * pp, coefficients, gpu.interconnect)
    free_at_start = total - start_used if free_memory_bytes is None else free_memory_bytes
    if free_memory_bytes is not None:
        start_used = total - free_memory_bytes
    offload_left = int(cfg.cpu_offload_gb * GiB)
    if loose := lora_slots.ignored_flags(cfg.feature_flags):
        notes.append(f"{', '.join(loose)} without --enable-lora: vLLM ignores them (no adapter slots)")
    rejection = spec_decode.rejection_warmup_bytes(rel, model, cfg.speculative.method, num_reqs,
                                                   padded_vocab(model.vocab_size), act_bytes) \
        if drafter and engine == "v1" else 0
    graph_shape = profile.GraphShape.of(version, seqs, tokens, gpu.compute_capability,
                                        1 + (drafter.tokens if drafter else 0), cfg.performance_mode)
    if cfg.lora:
        lora_slots.check(cfg.lora, rel, tp)
        graph_shape = replace(graph_shape, captures=graph_shape.captures * lora_slots.graph_capture_factor(cfg.lora,
                                                                                                           rel))
    kv_given = cfg.kv_cache_memory_bytes is not None and engine == "v1" and rel.kv_cache_memory_bytes_flag
    # the vision encoder's part of the profile run, on the first pipeline stage (gpu_model_runner.profile_run)
    encoder = encoder_profile(model_q, cfg.multimodal, version, engine, max_len, seqs, tokens, act_bytes, tp)
    if encoder:
        notes += encoder.notes
        warnings += encoder.warnings

    workers: list[WorkerMemory] = []
    layouts: list[KvLayout] = []
    measured_names: frozenset[str] = frozenset()
    if measured is not None and pp > 1:
        notes.append("the measured figures of an earlier start are rank 0's, one pipeline stage's: not used for "
                     f"{pp} stages")
    for stage in range(pp):
        layers = par.stage_layers(model.num_layers, stage)
        weights = stage_weight_bytes(model_q, par, stage, act_bytes, gpu.compute_capability, version, tokens,
                                     seqs, platform)
        if platform.rocm and rel.rocm_weights_device_wide:
            # RocmPlatform.get_current_memory_usage: the load is measured as total - free, the HIP runtime's and
            # the allocator's cached blocks included (profile.RocmFit.load_residue_gib)
            weights += int(rocm.load_residue_gib * GiB)
        if offload_left:  # maybe_offload_to_cpu moves whole layers' parameters until the budget is used
            moved = min(offload_left, int(weights * 0.95))
            weights -= moved
        adapters = lora_slots.lora_bytes(model_q, cfg.lora, rel, tp, len(layers), stage == 0, stage == pp - 1,
                                         dtype, tokens, seqs) if cfg.lora else 0
        draft_weights = drafter.weights_bytes if drafter and stage == pp - 1 else 0
        weights += draft_weights   # loaded inside the same profiler: one "Model loading took" figure
        activation = profile.activation_peak_bytes(model_q, tokens, num_reqs, padded_vocab(model.vocab_size), tp, pp,
                                                   stage == pp - 1, act_bytes, version, gpu.multiprocessors,
                                                   coefficients, engine, rejection_bytes=rejection,
                                                   runner_v2=runner_v2)
        held = 0
        if encoder and stage == 0 and encoder.profiled:
            activation = int(encoder.activation_peak(activation))
            held = encoder.held_bytes
        compiled = not cfg.enforce_eager and not platform.rocm
        workspace = profile.allreduce_fusion_workspace_bytes(version, tp, pp, model.hidden_size, act_bytes, tokens,
                                                             gpu, compiled)
        non_torch = profile.non_torch_bytes(engine, version, tp, pp, coefficients, gpu.interconnect,
                                            gpu.compute_capability, graphs=compiled and graph_estimate_runs,
                                            fusion_workspace=workspace)
        if workspace and stage == 0:
            pages = " (its three buffers rounded up to 512 MiB multicast pages)" \
                if rel.allreduce_fusion_multicast_pages else ""
            notes.append(f"non-torch memory includes FlashInfer's all-reduce fusion workspace, {_gib(workspace)} GiB a "
                         f"GPU{pages}, which the profile run creates; --compilation-config "
                         "'{\"pass_config\": {\"fuse_allreduce_rms\": false}}' leaves it out")
        if rel.lora_in_weights:   # allocated inside load_model's profiler: "Model loading took" includes them
            weights += adapters
        elif rel.v0_counts_cuda_context:   # 0.6: allocated after the weights line, caught as non-torch memory
            non_torch += adapters
        if engine == "v1" and rel.non_torch_includes_baseline:  # the raw formula: all but live torch tensors
            non_torch += start_used
        graphs = profile.cuda_graph_bytes(model_q, len(layers), cfg.enforce_eager, coefficients, tp, graph_shape)
        graphs_estimate = profile.cuda_graph_estimate_bytes(model_q, len(layers), not graph_estimate_runs,
                                                            coefficients, tp, graph_shape)
        if platform.rocm and engine == "v1":
            non_torch += int(rocm.profile_gib * GiB)           # profile.RocmFit: hipBLASLt, load-time HIP memory
            if graphs:                                          # HIP graphs' pool above CUDA's
                graphs += int(rocm.graph_gib * GiB)
                graphs_estimate += int(rocm.graph_gib * GiB)
        if measured is not None and pp == 1:
            then = _requested(total, measured.gpu_memory_utilization, rel) if measured.gpu_memory_utilization else None
            figures, measured_names = measured.applied(
                WorkerFigures(weights, activation, non_torch, graphs, graphs_estimate), then, in_budget)
            weights, activation, non_torch = figures.weights, figures.activation_peak, figures.non_torch
            graphs, graphs_estimate = figures.cuda_graph, figures.cuda_graph_estimate
        state_here = sampling_state if stage == pp - 1 else 0
        if kv_given:
            available = cfg.kv_cache_memory_bytes
        else:
            available = requested - weights - activation - non_torch - (graphs_estimate if in_budget else 0) \
                - (state_here if rel.budget_counts_consumed else 0)
        specs = _kv_specs(model, layers, tp, block_size, kv, state, ds_mla, version)
        draft_specs = _draft_kv_specs(drafter, specs, tp, block_size, kv, model) if stage == pp - 1 else []
        layout = build_layout(specs + draft_specs, hybrid_manager, rel.hybrid_groups_max_if_close)
        layouts.append(layout)
        blocks_here = num_blocks(layout, int(available))
        workers.append(WorkerMemory(stage, len(layers), weights, activation, non_torch, graphs, graphs_estimate,
                                    int(available), blocks_here, layout.bytes_per_block, lora_bytes=adapters,
                                    speculative_weights_bytes=draft_weights, encoder_cache_bytes=held,
                                    sampling_state_bytes=state_here,
                                    speculative_kv_bytes=blocks_here * sum(s.page_size_bytes for s in draft_specs)))

    blocks = min(w.num_blocks for w in workers)
    tight = min(range(pp), key=lambda s: workers[s].kv_cache_bytes)
    layout, avail_min = layouts[tight], workers[tight].kv_cache_bytes
    fit_available = avail_min - (layout.bytes_per_block if rel.fit_reserves_one_block else 0)
    if auto_fit:
        fitted = estimate_max_model_len(layout, fit_available, max_len, in_flight, version)
        if fitted and fitted < max_len:
            notes.append(f"max_model_len auto-fit reduced {max_len} to {fitted}")
            max_len = fitted
    needed = max(layout.needed_bytes(max_len, in_flight, version) for layout in layouts)
    estimated = None

    # vLLM's checks, in the order it makes them
    weights_max = max(w.weights_bytes for w in workers)
    ckpt = model.checkpoint_bytes
    if ckpt and tp * pp == 1 and not model.resolved_from and abs(weights_max - ckpt) > 0.05 * ckpt:
        warnings.append(f"the checkpoint's safetensors hold {ckpt / GiB:.2f} GiB of tensors but config.json's shapes "
                        f"give {weights_max / GiB:.2f} GiB of weights: the config may not describe this checkpoint "
                        "(a quantization config missing?), so the weights figure is in doubt")
    if error is None and gpu.compute_capability < (8, 0) and dtype == "bfloat16":
        error, error_class = messages.bf16_unsupported(gpu.name, gpu.compute_capability), FailureClass.DTYPE_CAPABILITY
    if error is None and engine == "v1" and rel.free_memory_check and free_at_start < requested:
        error, error_class = messages.free_memory_too_low(version, free_at_start, total, util, requested), \
            FailureClass.GPU_MEMORY_IN_USE
    if error is None and start_used + weights_max + max(w.non_torch_bytes for w in workers) > total:
        error = messages.weights_oom(total - start_used - weights_max, total)
        error_class = FailureClass.OOM_WEIGHTS_LOAD
    if error is None and start_used + weights_max + max(w.activation_peak_bytes for w in workers) > total:
        error, error_class = "CUDA out of memory during the profile run (torch.OutOfMemoryError in profile_run)", \
            FailureClass.OOM_PROFILING_OR_GRAPH
    if error is None and avail_min <= 0:
        error, error_class = messages.no_cache_memory(version, engine), FailureClass.NO_CACHE_BLOCKS
    if error is None:
        if engine == "v0":
            v0_tokens = block_size * blocks // (pp if rel.v0_tokens_divided_by_pp else 1)
            if max_len > v0_tokens:
                error, error_class = messages.kv_too_small(version, engine, max_len, needed, avail_min, 0,
                                                           v0_tokens), FailureClass.KV_CACHE_TOO_SMALL
        elif needed > fit_available:
            estimated = estimate_max_model_len(layout, fit_available, max_len, in_flight, version)
            error = messages.kv_too_small(version, engine, max_len, needed, fit_available, estimated, 0)
            error_class = FailureClass.KV_CACHE_TOO_SMALL
    # After KV allocation: graphs are captured (outside the budget before 0.20), then the sampler warms up
    # with num_reqs dummy requests (gpu_worker.compile_or_warm_up_model) in whatever memory is left.
    # 0.7's LoRA stacks are in no figure vLLM budgets (allocated after the weights line, before the snapshot)
    uncounted = 0 if rel.lora_in_weights or rel.v0_counts_cuda_context else max(w.lora_bytes for w in workers)
    headroom = min(total - start_used - w.weights_bytes - w.non_torch_bytes - blocks * w.bytes_per_block
                   - w.cuda_graph_bytes - w.sampling_state_bytes for w in workers) - uncounted
    # V2 warms its kernels up after the KV cache with the same sampler pass (v1/worker/gpu/warmup.py warmup_kernels)
    sampler_need = max(profile.sampler_peak_bytes(padded_vocab(model.vocab_size), num_reqs, version,
                                                  gpu.multiprocessors, runner_v2=runner_v2, logits_bytes=act_bytes),
                       rejection)
    risks: list[str] = []
    # What the fitted figures may miss the memory free at the warm-up by: the warm-up's verdict is no surer than they
    # are. The budget fills to the requested memory whatever non-torch figure vLLM measures (a larger one takes it
    # from the KV cache), so only the activation peak (freed before the warm-up), the graphs and what is in use before
    # vLLM's snapshot move what is left. `less`: the free memory may be that much smaller; `more`: that much larger.
    # (on ROCm the HIP-graph figure's own miss replaces CUDA's, below)
    less = more = _estimate_margin(("activation_peak",) + (() if platform.rocm else ("cuda_graph",)), measured_names)
    if engine == "v1" and tp * pp > 1 and gpu.interconnect == "pcie" and free_memory_bytes is None:
        less += int(profile.PCIE_NCCL_SPREAD_GIB * GiB)   # NCCL's device buffers over PCIe vary by transport
    # what the platform adds to those misses: ROCm's measured on held-out R9700 runs (profile.RocmFit), below and
    # above the predicted KV memory; another vendor's the spread ROCm showed before it was modelled
    if platform.rocm:
        below, above = int(rocm.kv_below_gib * GiB), int(rocm.kv_above_gib * GiB)
        if measured_names:   # the measured start may have been one that took more: the next may take less
            above = below
        less += int(rocm.graph_margin_gib * GiB)
        # a start that takes more for its profile (the KV range's low end) frees that much more for the warm-up
        more += int(rocm.graph_margin_gib * GiB) + below
        notes.append(f"ROCm: the weights, profile and HIP-graph figures add what R9700 starts measured beyond vLLM's "
                     f"arithmetic; starts of one setup differ by up to {rocm.kv_below_gib} GiB, so the KV range "
                     f"allows {rocm.kv_below_gib} GiB below and {rocm.kv_above_gib} GiB above")
    else:
        below = above = int(profile.UNCALIBRATED_PLATFORM_GIB * GiB) if gpu.vendor != "nvidia" else 0
        less += below
        more += below
        if below:
            notes.append(f"the activation, non-torch and graph figures are fitted on NVIDIA startups; on {gpu.name} "
                         f"they may move by up to {profile.UNCALIBRATED_PLATFORM_GIB} GiB, so the KV range and the "
                         "warm-up verdict allow for that much")
    if (error is None and engine == "v1" and rel.free_memory_check and gpu.unified_memory and free_memory_bytes is None
            and requested > gpu.free_at_start_low_bytes):
        risks.append(f"the start-up free-memory check: {_gib(requested)} GiB requested, while as little as "
                     f"{_gib(gpu.free_at_start_low_bytes)} GiB has been free at start on this unified-memory GPU")
    if error is None and engine == "v1" and headroom - less < sampler_need <= headroom + more:
        risks.append(f"the sampler warm-up after the KV cache is allocated: {_gib(sampler_need)} GiB needed, "
                     f"{_gib(headroom)} GiB predicted free")
    if error is None and engine == "v1" and headroom < sampler_need:
        error, error_class = messages.sampler_warmup_oom(num_reqs), FailureClass.OOM_PROFILING_OR_GRAPH
    headroom -= sampler_need if engine == "v1" else 0
    # PyTorch's allocator holds memory vLLM's figures do not count: weights and the non-torch figure are measured as
    # allocated bytes, so free space inside partly used segments (left by weight processing after loading, and by the
    # profile run when no graph capture empties the cache) is nobody's, and the warm-up finds less than vLLM planned.
    # On the 61 vLLM 0.19 H100 startups of llm-d-planner's sweep (commit d3121e0) 0.16-2.35 GiB was held so after the
    # profile run (free at start - weights - non-torch - "Free memory after profiling"), varying between identical
    # runs, never above 98% of the activation peak; gpt-oss-20b at 0.95 OOMed warming up the sampler with about
    # 1.8 GiB short (records 059, col-d-023; 1.62 GiB "reserved but unallocated" in the second's OOM message).
    cached = max(w.activation_peak_bytes for w in workers)
    # A warning, not a verdict: no figure known before launch separates the runs that failed here from those that
    # started with less to spare (benchmarks/plan_accuracy.py, README "Accuracy on real vLLM startups").
    if error is None and engine == "v1" and headroom < cached:
        deficit = cached - headroom
        fix = (f"--kv-cache-memory-bytes {cfg.kv_cache_memory_bytes - deficit}" if cfg.kv_cache_memory_bytes else
               f"--gpu-memory-utilization {math.floor((util - deficit / total) * 100) / 100:.2f}")
        warnings.append(f"only {_gib(headroom)} GiB stays free after the sampler warm-up, while PyTorch can hold up to "
                        f"{_gib(cached)} GiB (the profile run's peak) in blocks vLLM does not count: the warm-up can "
                        f"OOM. Use {fix} or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    elif error is None and headroom < 0.5 * GiB:
        warnings.append(f"only {_gib(headroom)} GiB stays free once vLLM is up: a burst or fragmentation can OOM; "
                        "lower --gpu-memory-utilization")

    # The range of the available KV memory: the fitted figures' residuals, and in releases that use FlashInfer's
    # sampler when it is installed (not knowable before launch), its smaller warm-up peak.
    margin = 0 if kv_given else _estimate_margin(
        ("activation_peak", "non_torch") + (("cuda_graph_estimate",) if in_budget and not cfg.enforce_eager else ()),
        measured_names)
    kv_low = int(avail_min - margin - (0 if kv_given else below))
    kv_high = int(avail_min + margin + (0 if kv_given else above))
    if engine == "v1" and rel.flashinfer_sampler_if_installed and margin and tight == pp - 1 and \
            "activation_peak" not in measured_names:   # a measured peak already used the sampler that is installed
        with_flashinfer = profile.activation_peak_bytes(model_q, tokens, num_reqs, padded_vocab(model.vocab_size), tp,
                                                        pp, True, act_bytes, version, gpu.multiprocessors,
                                                        coefficients, engine, flashinfer=True, runner_v2=runner_v2)
        kv_high += max(workers[tight].activation_peak_bytes - with_flashinfer, 0)
    reserve = avail_min - fit_available
    kv_check = f"the KV cache check: {_gib(needed)} GiB needed, {_gib(kv_low)}-{_gib(kv_high)} GiB available"
    if engine == "v1" and error_class == FailureClass.KV_CACHE_TOO_SMALL and needed <= kv_high - reserve:
        risks.append(kv_check)
    elif engine == "v1" and error is None and needed > kv_low - reserve:
        risks.append(kv_check)
        shorter = estimate_max_model_len(layout, kv_low - reserve, max_len, in_flight, version)
        if shorter:
            warnings.append(f"the KV cache holds one {max_len}-token request only if the estimated figures are not "
                            f"low: --max-model-len {shorter} starts at the low end of the range")
    verdict = "at_risk" if risks else ("starts" if error is None else "fails")

    concurrency = max_concurrency(layout, blocks, max_len, in_flight, version)
    report_tokens = kv_cache_tokens(layout, blocks, concurrency, max_len, version)
    if not in_budget and engine == "v1" and not cfg.enforce_eager:
        notes.append(f"CUDA graphs (~{_gib(workers[0].cuda_graph_bytes)} GiB) are captured outside the KV budget in "
                     f"vLLM {fmt(version)}")
    estimate = "estimate (fitted to real vLLM startup logs)"
    provenance = {
        "model": model.source or model.model_id,
        "weights_gib": (f"estimate: {model.resolved_from}'s config.json, quantized as the name says"
                        if model.resolved_from else "exact arithmetic from config.json")
        + (" (vision tower estimated)" if model.vision and not model.vision.exact else ""),
        "activation_peak_gib": "estimate (the sampler warm-up from this release's code, the forward pass fitted to "
                               "real vLLM startup logs)", "non_torch_gib": estimate, "cuda_graph_gib": estimate,
        "kv_cache_range_gib": "the fitted figures' 90th-percentile residuals, widened on non-NVIDIA GPUs (and "
                              "FlashInfer's sampler, where the "
                              "release uses it when installed)",
        "kv_cache_gib": "given (--kv-cache-memory-bytes)" if cfg.kv_cache_memory_bytes else
        "requested memory minus the figures above", "kv_cache_tokens": "exact arithmetic from the KV budget",
        "num_gpu_blocks": "exact arithmetic from the KV budget", "max_concurrency": "exact arithmetic from the blocks",
        "total_memory_gib": "GPU catalog (what CUDA reports)" if free_memory_bytes is None else "measured free memory",
        "lora_gib": "exact arithmetic from the LoRA flags and config.json (create_lora_weights' stacks)",
        "speculative_weights_gib": "exact arithmetic for a draft model or MTP layers from config.json; an EAGLE head "
                                   "estimated from the target's shapes",
        "speculative_kv_gib": "exact arithmetic: the drafter's attention layers' share of every KV block",
        "sampling_state_gib": "exact arithmetic: model runner V2's penalty counts, max_num_seqs x vocabulary int32",
        "encoder_cache_gib": "exact arithmetic from the processor's largest item and the release's item count; the "
                             "encoder's own activations estimated from its shapes",
        "host_memory_gib": "exact arithmetic from --swap-space / --kv-offloading-size / the connector's settings",
    }
    if measured_names:
        said = f"measured (a start of this setup, {measured.measured_at or 'undated'})"
        derived = "activation_peak" in measured_names and measured.activation_peak_bytes is None
        for name in measured_names & {"weights", "activation_peak", "non_torch", "cuda_graph"}:
            provenance[f"{name}_gib"] = said + ("; what its KV budget left, split as estimated"
                                                if derived and name in ("activation_peak", "non_torch") else "")
        provenance["kv_cache_range_gib"] = (f"{REPEAT_GIB} GiB for the measured figures (identical starts repeat "
                                            "them) and the fitted figures' residuals for the rest")
        notes.append(f"figures measured on an earlier start of this setup ({measured.measured_at or 'undated'}) "
                     f"replace the estimates: {', '.join(sorted(measured_names))}")
    resolved = {
        "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": cfg.data_parallel_size,
        "gpu_memory_utilization": util, "max_model_len": max_len, "max_num_seqs": seqs,
        "max_num_batched_tokens": tokens, "dtype": dtype, "quantization": quant.method if quant else None,
        "kv_cache_dtype": cfg.kv_cache_dtype, "block_size": block_size, "enforce_eager": cfg.enforce_eager,
        "enable_prefix_caching": cfg.enable_prefix_caching, "cpu_offload_gb": cfg.cpu_offload_gb,
        "kv_cache_memory_bytes": cfg.kv_cache_memory_bytes, "enable_expert_parallel": cfg.enable_expert_parallel,
        "performance_mode": cfg.performance_mode, "usage_context": cfg.usage_context,
        "model_runner": "v2" if runner_v2 else engine, **cfg.feature_flags,
    }
    return MemoryReport(
        model_id=model.model_id, gpu_name=gpu.name, gpu_count=gpu_count, vllm_version=fmt(version), engine=engine,
        config=resolved, total_memory_bytes=total, requested_memory_bytes=requested, start_used_bytes=start_used,
        workers=tuple(workers), cuda_graphs_in_budget=in_budget, num_gpu_blocks=blocks, block_size=block_size,
        sampling_state_in_budget=rel.budget_counts_consumed,
        kv_cache_tokens=report_tokens, max_concurrency=concurrency, max_model_len=max_len,
        starts=error is None, verdict=verdict, risks=tuple(risks), kv_cache_low_bytes=kv_low,
        kv_cache_high_bytes=kv_high, error=error, error_class=error_class, estimated_max_model_len=estimated,
        needed_kv_bytes=needed, headroom_bytes=int(headroom), assumptions=tuple(notes), provenance=provenance,
        warnings=tuple(warnings), kv_layout=layout, in_flight_tokens=in_flight, host_memory_bytes=host.bytes,
    )


def _with_quant(model: ModelSpec, quant: QuantSpec | None) -> ModelSpec:
    return replace(model, quant=quant)
