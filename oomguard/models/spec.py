"""ModelSpec: what a memory model needs to know about a checkpoint, parsed from its Hugging Face config.json.

Pure: `parse_config(config, model_id)` takes the decoded JSON object; file and hub I/O live in `models/load.py`.
The parser understands nested `text_config` (vision-language models), GQA/MQA, explicit `head_dim`,
sliding-window and interleaved local/global attention, Llama-4 chunked local attention, MLA (DeepSeek V2/V3,
Kimi; DeepSeek-V3.2 / GLM-5 with the sparse-attention indexer), MoE layouts (Mixtral, Qwen-MoE, DeepSeek, gpt-oss,
Llama 4, ERNIE 4.5), Gemma 4 (per-layer head widths, KV-sharing layers, per-layer embeddings, the MoE block beside
the MLP, its vision and audio towers) and quantization_config blocks.
Gemma 3n (AltUp, Laurel blocks, per-layer embeddings, KV-sharing layers, MobileNet-V5 and USM towers), MiniCPM and
MiniCPM3 (low-rank q/kv projections over a plain multi-head KV cache), ChatGLM (chatglm.py), Baichuan (baichuan.py:
RoPE or ALiBi), InternVL (llm_config, InternViT and mlp1) and MiniCPM-V 2.6 / 4.0 / 4.5 (SigLIP and the resampler) are
read as their vLLM model files build them.
Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5), Mamba2 hybrids (Nemotron-H, Granite-4.0-H, Falcon-H1, whose layers run
a Mamba2 mixer beside their attention) and the Mamba (v1) hybrid Jamba carry their recurrent-state shapes;
architectures it cannot model faithfully (other Mamba and linear-attention families) are refused by name, never
approximated.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from oomguard.errors import NotSupportedError, UsageError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16", "bf16": "bfloat16"}

# HF keys vLLM reads to derive the model's context length (vllm/config/model.py:_get_and_verify_max_len)
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# RoPE types whose factor does not extend the derived length (same function)
_ROPE_NO_SCALE = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}

_UNSUPPORTED_TYPES = {
    "mamba", "mamba2", "bamba", "zamba2", "plamo2",
    "minimax", "minimax_m1", "lfm2", "kimi_linear", "rwkv", "recurrent_gemma",
}
# Decoders whose layers are what this module reads: attention (full, sliding, chunked, MLA), a gated or plain MLP,
# MoE with shared experts; their vLLM model files were read for it. Any other model_type is refused by name: its
# layers may hold memory the dense formula does not see.
MODELLED_TYPES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
    "gemma3_text", "phi", "phi3", "starcoder2", "gpt2", "opt", "deepseek", "deepseek_v2", "deepseek_v3", "kimi_k2",
    "kimi_vl", "gpt_oss", "llama4", "llama4_text", "mllama", "mllama_text_model", "mistral3", "glm4", "glm4_moe",
    "glm4v", "glm4v_text", "glm4v_moe", "glm4v_moe_text", "internlm2", "minimax_m2", "olmo2", "olmoe", "mimo",
    "smollm3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text",
    "qwen2_vl_text", "qwen2_5_vl_text",   # Qwen2(.5)-VL saved by newer transformers: the LM's fields in text_config
    "kimi_k25", "nemotron_h", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe",
    "granite",   # models/granite.py: Llama's layers (gated SiLU MLP, GQA) with scalar multipliers, no more memory
    "gemma4", "gemma4_text", "deepseek_v32", "glm_moe_dsa", "olmo3", "ernie4_5_moe",
    "gemma3n", "gemma3n_text",   # models/gemma3n.py, gemma3n_mm.py (AltUp, Laurel, PLE, KV sharing; the towers)
    "minicpm",                   # models/minicpm.py: Llama's layers, head_dim = hidden / heads; MiniCPMMoE
    "minicpm3",                  # models/minicpm3.py: MLA-shaped projections, a plain multi-head KV cache
    "granitemoehybrid",          # models/granitemoehybrid.py: Mamba2 mixer or attention, then MoE and a shared MLP
    "jamba",                     # models/jamba.py: Mamba (v1) mixer or attention (no RoPE), then MoE or a gated MLP
    "falcon_h1",                 # models/falcon_h1.py: attention and a Mamba2 mixer side by side, then a gated MLP
    "chatglm",                   # models/chatglm.py: GLMAttention (multi_query_group_num KV heads, half-width RoPE)
    "baichuan",                  # models/baichuan.py: W_pack fused QKV, RoPE (7B) or ALiBi (13B); gone after 0.24
    "exaone4",                   # models/exaone4.py: Llama's layers with q/k norms and a post-MLP norm; LLLG windows
    "phimoe",                    # models/phimoe.py: Mixtral's experts, biased qkv/o projections, LayerNorms
    "internvl_chat",             # models/internvl.py: InternViT + mlp1 before an llm_config language model
    "minicpmv",                  # models/minicpmv.py: SigLIP (Idefics2VisionTransformer) + resampler before the LM
}
# Known types not modelled yet, and what the plain formula would miss (their vLLM model files name the parts)
NOT_MODELLED_YET = {
    "deepseek_v4": "compressed attention, hyper-connections and fp4 experts (models/deepseek_v4.py)",
    "mimo_v2_flash": "its hybrid sliding-window attention layers",
}
# Model types whose config or tokenizer class only the checkpoint's own code (auto_map) defines: vLLM needs
# --trust-remote-code for them (ChatGLM's and InternLM2's tokenizers, Baichuan, InternVL and MiniCPM-V's processors,
# MiniCPM's and Kimi's configs, DeepSeek-MoE's first format)
REMOTE_CODE_TYPES = frozenset({"chatglm", "baichuan", "internvl_chat", "minicpmv", "internlm2", "minicpm", "minicpm3",
                               "kimi_k2", "kimi_vl", "kimi_k25", "deepseek"})
# Gated DeltaNet + full-attention hybrids (vllm/model_executor/models/qwen3_next.py, qwen3_5.py)
GDN_TYPES = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe"}


@dataclass(frozen=True)
class QuantSpec:
    """How linear weights are stored. `bits` per weight; scales and zero points per `group_size` inputs."""

    method: str                       # vLLM quantization method name: fp8, awq, gptq, compressed-tensors, ...
    bits: int                         # 16 means unquantized weights (e.g. KV-only schemes)
    group_size: int | None = None     # None: per-channel / per-tensor
    zero_point: bool = False
    block: tuple[int, int] | None = None   # FP8 block quantization [out, in]
    ignored: tuple[str, ...] = ()     # module name patterns kept in the model dtype
    lm_head_quantized: bool = False
    experts_only: bool = False        # MXFP4 (gpt-oss): only MoE experts are quantized
    scale_bytes: float = 2.0          # bytes per scale value
    # a GGUF file's own bytes per weight (its ggml block types mix within a file); vLLM's GGUF layers keep the
    # blocks as stored, embedding and output layer included (vllm/model_executor/layers/quantization/gguf.py)
    measured_linear: float | None = None
    measured_embedding: float | None = None
    measured_lm_head: float | None = None
    # (layer, module) pairs an ignore list keeps whole in the model dtype ("model.language_model.layers.3.self_attn*"):
    # ModelOpt exports name the attention or MLP of each layer they leave unquantized
    ignored_sections: frozenset[tuple[int, str]] = frozenset()
    # FP8 weights: one scale per "tensor" (per logical shard), per output "channel", per "block", or "online" (a
    # 16-bit checkpoint quantized while loading); "" where the checkpoint does not say. ROCm pads the rows of the
    # per-tensor and block layouts (engines/vllm/weights.py); the bytes are otherwise the same
    fp8_strategy: str = ""

    def bytes_per_param(self) -> float:
        """Storage per quantized weight, scales and zero points included (vllm/model_executor/layers/quantization/*)."""
        if self.measured_linear is not None:
            return self.measured_linear
        per = self.bits / 8
        if self.group_size:
            per += self.scale_bytes / self.group_size + (self.bits / 8 / self.group_size if self.zero_point else 0)
        if self.block:
            per += 4 / (self.block[0] * self.block[1])  # fp32 weight_scale_inv per block
        return per

    def quantizes(self, module: str, layer: int | None = None, section: str | None = None) -> bool:
        """Whether `module` (of `section` of decoder layer `layer`, where the caller names them) is quantized."""
        if any(pattern and pattern in module for pattern in self.ignored):
            return False
        if layer is not None and (layer, section) in self.ignored_sections:
            return False
        if self.experts_only:
            return module.startswith("experts")
        return True


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek V2/V3): one latent of kv_lora_rank + rope dims per token per layer."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int     # total width of always-on shared experts (0 if none)
    moe_layers: tuple[bool, ...]      # per decoder layer: MoE block (True) or dense MLP (False)
    shared_expert_gate: bool = False  # Qwen2-MoE has a 1-wide sigmoid gate on the shared expert
    router_bias: bool = False


@dataclass(frozen=True)
class LinearAttentionSpec:
    """A Gated DeltaNet layer's shapes (config.json linear_* fields): its per-request recurrent state and weights."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_dtype: str | None = None      # the temporal state's dtype when config.json pins it (Qwen3.5 mamba_ssm_dtype)

    def state_elements(self, tp: int) -> tuple[int, int]:
        """(conv, temporal) state elements of one request on one TP rank
        (mamba_utils.MambaStateShapeCalculator.gated_delta_net_state_shape)."""
        conv_dim = 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
        return ((self.conv_kernel - 1) * conv_dim // tp,
                self.num_value_heads // tp * self.key_head_dim * self.value_head_dim)


@dataclass(frozen=True)
class MambaMixerSpec:
    """A Mamba2 mixer's shapes (Nemotron-H: mamba_num_heads, mamba_head_dim, n_groups, ssm_state_size, conv_kernel)."""

    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int
    conv_bias: bool = True
    ssm_dtype: str | None = None      # config.json's mamba_ssm_cache_dtype, which vLLM reads from 0.13
    intermediate: int = 0             # the model file's own width where it does not take heads x head_dim
                                      # (granitemoehybrid.py: mamba_expand x hidden_size)
    proj_bias: bool = False           # in_proj and out_proj biases (Granite mamba_proj_bias)
    gated_norm: bool = True           # Mixer2RMSNormGated's weight [intermediate] (Falcon-H1: mamba_rms_norm)

    @property
    def intermediate_size(self) -> int:
        return self.intermediate or self.num_heads * self.head_dim

    def groups(self, tp: int) -> int:
        """B/C groups on a rank: replicated up to tp when tp does not divide them (extra_groups_for_head_shards)."""
        return self.n_groups if self.n_groups % tp == 0 else tp

    def state_elements(self, tp: int) -> tuple[int, int]:
        """(conv, temporal) state elements of one request on one TP rank (mamba_utils mamba2_state_shape)."""
        conv_dim = self.intermediate_size + 2 * self.groups(tp) * self.state_size
        return (self.conv_kernel - 1) * conv_dim // tp, self.num_heads // tp * self.head_dim * self.state_size


@dataclass(frozen=True)
class Mamba1MixerSpec:
    """A Mamba (v1) mixer's shapes (Jamba: mamba_expand x hidden_size, mamba_d_state, mamba_d_conv, mamba_dt_rank),
    as layers/mamba/mamba_mixer.py MambaMixer builds it."""

    intermediate_size: int
    state_size: int
    conv_kernel: int
    dt_rank: int                      # time_step_rank: x_proj's dt part and dt_proj's input
    conv_bias: bool = True
    proj_bias: bool = False           # in_proj and out_proj biases (Jamba mamba_proj_bias)
    dt_bc_norms: bool = True          # use_rms_norm: dt, B and C RMSNorms (jamba.py passes use_rms_norm=True)
    ssm_dtype: str | None = None      # no config.json field pins it for Jamba: the model dtype

    def state_elements(self, tp: int) -> tuple[int, int]:
        """(conv, temporal) state elements of one request on one TP rank (mamba_utils mamba1_state_shape:
        conv (intermediate / tp, d_conv - 1), temporal (intermediate / tp, d_state))."""
        inter = self.intermediate_size // tp
        return inter * (self.conv_kernel - 1), inter * self.state_size


@dataclass(frozen=True)
class VisionSpec:
    """A vision tower: its weights (kept unquantized in the model dtype) and, for the profile run's encoder pass
    (engines/vllm/multimodal.py), its shape as vision_config and the checkpoint's top-level fields give it.
    A shape field left at 0 / empty is not in the config."""

    params: int
    note: str
    replicated: bool = False          # whole on every TP rank (a transformers module vLLM wraps, e.g. Gemma 4's)
    family: str = ""                  # the checkpoint's top-level model_type (qwen2_5_vl, gemma3, llava, mllama, ...)
    encoder: str = ""                 # vision_config.model_type (siglip_vision_model, clip_vision_model, pixtral, ...)
    depth: int = 0                    # encoder blocks (Mllama: local and global layers)
    hidden: int = 0                   # the encoder's width
    intermediate: int = 0             # its MLP width
    gated: bool = False               # gate and up projections (SiLU / SwiGLU MLP), else up only
    patch_size: int = 0
    image_size: int = 0               # a fixed input (tile) resolution; 0 for dynamic-resolution towers (Qwen, Kimi)
    channels: int = 3
    temporal_patch: int = 1           # frames per patch (Qwen: 2)
    spatial_merge: int = 1            # patches merged per side into one output token (Qwen, Mistral 3, Kimi: 2)
    out_width: int = 0                # width of one output row (the LM's hidden size; Qwen3-VL x (1 + deepstack))
    text_type: str = ""               # the language model's model_type (InternVL takes video with some)
    downsample_ratio: float = 1.0     # pixel shuffle (InternVL downsample_ratio, Llama 4 pixel_shuffle_ratio)
    max_tiles: int = 0                # InternVL max_dynamic_patch, Mllama max_num_tiles
    thumbnail: bool = False           # InternVL use_thumbnail: a whole-image tile beside the crops
    grid_pinpoints: tuple[tuple[int, int], ...] = ()   # LLaVA-NeXT image_grid_pinpoints (height, width)
    feature_select: str = "default"   # LLaVA vision_feature_select_strategy ("default" drops CLS)
    tokens_per_image: int = 0         # a fixed soft-token count per image (Gemma 3 mm_tokens_per_image, Gemma 4)
    pooling: int = 1                  # patches pooled per side into one token (Gemma 4 pooling_kernel_size)
    kept_layers: int = 0              # hidden states kept to the end (Mllama intermediate_layers_indices)
    split_params: int = 0             # parameters beside a replicated tower that vLLM splits over TP ranks
                                      # (Gemma 3n's embedders: VocabParallelEmbedding and RowParallelLinear)
    head_split_params: int = 0        # parameters split over TP only when TP divides `heads`, else whole on every
    heads: int = 0                    # rank (intern_vit.py InternParallelAttention: its attention then runs
                                      # data-parallel)
    exact: bool = False               # params counted module by module from the vLLM model file (not estimated)


@dataclass(frozen=True)
class PerLayerEmbedSpec:
    """Gemma 4's per-layer embeddings (PLE): a second embedding table of vocab x (layers x dim), a projection of the
    hidden state to it, and in each layer a gate and a projection back (vllm/model_executor/models/gemma4.py)."""

    dim: int                          # hidden_size_per_layer_input
    vocab: int                        # vocab_size_per_layer_input
    batch_buffer: bool = False        # gemma4_mm.py keeps a [max_num_batched_tokens, layers, dim] buffer on the GPU


@dataclass(frozen=True)
class Gemma3nSpec:
    """What Gemma 3n adds to each decoder layer and to the model (vllm/model_executor/models/gemma3n.py): AltUp's
    altup_num_inputs parallel streams (Gemma3nAltUp, altup_projections / altup_unembed_projections) and the Laurel
    low-rank residual (Gemma3nLaurelBlock)."""

    altup_inputs: int                 # altup_num_inputs
    laurel_rank: int


@dataclass(frozen=True)
class IndexerSpec:
    """The sparse-attention indexer of DeepSeek-V3.2 / GLM-5 (DSA): its own projections and its own K cache.

    GLM-5.2 shares it (IndexShare / IndexCache): only some layers compute the top-k tokens, the others reuse the last
    computed indices. config.json says which: index_topk_freq and index_skip_topk_offset (or an explicit
    index_topk_pattern of "F"/"S" per layer), spelt out per layer in indexer_types. Which of those layers vLLM gives
    an indexer depends on the release (engines/vllm/weights.py builds_indexer)."""

    num_heads: int                    # index_n_heads
    head_dim: int                     # index_head_dim
    topk: int                         # index_topk
    rope_interleave: bool = False     # indexer_rope_interleave (GLM-5): its RoPE is the MLA one's (not NeoX-style)
    topk_freq: int = 1                # index_topk_freq: one layer in this many computes its own top-k
    skip_offset: int | None = None    # index_skip_topk_offset as config.json gives it (None: absent)
    topk_pattern: tuple[str, ...] | None = None   # index_topk_pattern, one "F"/"S" per layer (None: absent)
    use_index_cache: bool = False     # use_index_cache (vLLM 0.21-0.22 apply the sharing only when it is set)
    # the layers whose checkpoint carries no indexer: indexer_types' "shared" layers, else what
    # index_topk_freq / index_skip_topk_offset / index_topk_pattern make shared; () when every layer has its own
    shared_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    model_id: str
    architecture: str
    model_type: str
    dtype: str                          # checkpoint dtype (torch_dtype/dtype): bfloat16, float16, float32
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    derived_max_model_len: int
    tie_word_embeddings: bool
    layer_attention: tuple[str, ...]    # per layer: "full", "sliding", "chunked", "mla", "linear" (Gated DeltaNet),
                                        # "mamba" (a Mamba mixer: recurrent's type says which) or "none" (MLP only)
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    quant: QuantSpec | None = None
    vision: VisionSpec | None = None
    recurrent: LinearAttentionSpec | MambaMixerSpec | Mamba1MixerSpec | None = None   # linear/Mamba layers' shapes
    layer_ffn: tuple[str, ...] | None = None     # per layer "mlp", "moe" or "none" where layers are single-purpose
    gated_mlp: bool = True                       # gate and up projections (SiLU-and-mul); False: up only (relu2)
    attn_output_gate: bool = False               # q_proj also produces a sigmoid gate per head (Qwen3-Next, 3.5)
    rope_cache_positions: tuple[int, ...] = ()   # one cos/sin cache per distinct RoPE (vllm get_rope caches them)
    rotary_dim: int = 0
    checkpoint_bytes: int | None = None          # exact, from safetensors metadata, when known
    source: str = ""
    resolved_from: str = ""                      # the catalog model this id was planned as (models/resolve.py)
    # the repository also holds Mistral's own format (params.json and consolidated*.safetensors), which vLLM loads in
    # preference to config.json from 0.12 (transformers_utils/config.py get_config, config_format "auto")
    mistral_consolidated: bool = False
    load_notes: tuple[str, ...] = ()             # what the plan should say about where the model came from
    # Per-layer attention shapes where layers differ (Gemma 4's full-attention layers: global_head_dim and
    # num_global_key_value_heads); empty: head_dim and num_kv_heads everywhere
    layer_head_dim: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    kv_shared_layers: int = 0                    # the last N layers read an earlier layer's KV cache, store none
    layer_intermediate: tuple[int, ...] = ()     # per-layer dense MLP width where it differs (use_double_wide_mlp)
    per_layer_embed: PerLayerEmbedSpec | None = None
    mlp_beside_moe: bool = False                 # MoE layers keep their dense MLP too (Gemma 4)
    rope_cache_dims: tuple[int, ...] = ()        # rotary dims of each cache where they differ (else rotary_dim)
    embeddings_every_stage: bool = False         # the model file builds embeddings on every pipeline stage
    indexer: IndexerSpec | None = None
    gemma3n: Gemma3nSpec | None = None
    # MiniCPM3: q_a/q_b and kv_a/kv_b projections shaped like MLA's (this spec's ranks and head dims), while the
    # attention itself is plain multi-head over qk_nope + qk_rope wide heads (models/minicpm3.py MiniCPM3Attention)
    low_rank_attention: MlaSpec | None = None
    mtp_layers: int = 0                          # multi-token-prediction layers the checkpoint carries (speculative)
    # every layer runs the `recurrent` mixer beside its attention (falcon_h1.py FalconH1ParallelHybrid): its weights
    # and its state page come on top of the attention's
    mixer_beside_attention: bool = False
    alibi: bool = False                          # ALiBi position bias, no RoPE (baichuan.py BaiChuanAttention "ALIBI")
    # the vLLM class a model file dispatches the checkpoint to where one architecture covers several (minicpmv.py
    # MiniCPMV.__new__ picks MiniCPMV2_6 / MiniCPMV4_0 / MiniCPMV4_5 by config.version); "" where the architecture is
    # the class
    served_as: str = ""

    def head_dim_at(self, layer: int) -> int:
        return self.layer_head_dim[layer] if self.layer_head_dim else self.head_dim

    def kv_heads_at(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_kv_heads

    @property
    def needs_remote_code(self) -> bool:
        """vLLM loads it only with --trust-remote-code: its config or tokenizer class lives in the checkpoint's own
        code (auto_map), not in transformers or vLLM (transformers_utils/config.py get_config)."""
        return self.model_type in REMOTE_CODE_TYPES

    @property
    def has_recurrent_layers(self) -> bool:
        """Some layer keeps a recurrent state (a Gated DeltaNet or Mamba mixer, alone or beside attention)."""
        return self.mixer_beside_attention or any(k in ("linear", "mamba") for k in self.layer_attention)

    def reads_shared_kv(self, layer: int) -> bool:
        """The layer attends over another layer's KV cache and has none of its own (kv_sharing_target_layer_name)."""
        return self.kv_shared_layers > 0 and layer >= self.num_layers - self.kv_shared_layers

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def kv_heads_or_latent(self) -> str:
        return "MLA" if self.mla else f"{self.num_kv_heads} KV heads"


def _norm_dtype(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    name = value.replace("torch.", "").lower()
    name = _DTYPE_ALIASES.get(name, name)
    return name if name in DTYPE_BYTES else None


def _int(cfg: dict, *keys: str, default: int | None = None) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and value == value:
            return int(value)
    return default


def _require(value: int | None, what: str, model_id: str) -> int:
    if value is None or value <= 0:
        raise UsageError(f"config.json of {model_id} has no valid {what}; pass a complete config with --model-config")
    return value


def derived_max_len(cfg: dict) -> int:
    """The context length vLLM derives from config.json (vllm/config/model.py:_get_and_verify_max_len)."""
    lengths = [v for k in _MAX_LEN_KEYS if isinstance(v := cfg.get(k), int) and not isinstance(v, bool) and v > 0]
    length = min(lengths) if lengths else 2048
    rope = cfg.get("rope_scaling") or {}
    if isinstance(rope, dict):
        rope_type = rope.get("rope_type") or rope.get("type")
        factor = rope.get("factor")
        if rope_type not in _ROPE_NO_SCALE and isinstance(factor, (int, float)) and cfg.get("model_type") != "gemma3_text":
            if rope_type == "dynamic":
                pass  # dynamic NTK keeps the derived length
            else:
                length = int(length * factor)
    return length


def _layer_attention(cfg: dict, num_layers: int, model_type: str) -> tuple[tuple[str, ...], int | None, int | None]:
    """Per-layer attention kind, mirroring how each vLLM model file picks its attention per layer."""
    window = _int(cfg, "sliding_window")
    chunk = _int(cfg, "attention_chunk_size")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == num_layers and window:
        kinds = tuple("sliding" if str(t).startswith("sliding") else "full" for t in layer_types)
        return kinds, window, None
    if model_type == "llama4_text" and chunk:
        # vllm/model_executor/models/llama4.py: NoPE layers (no_rope_layers[i] == 0) attend globally
        nope = cfg.get("no_rope_layers") or []
        interval = _int(cfg, "no_rope_layer_interval", default=4)
        if len(nope) == num_layers:
            kinds = tuple("full" if flag == 0 else "chunked" for flag in nope)
        else:
            kinds = tuple("full" if (i + 1) % interval == 0 else "chunked" for i in range(num_layers))
        return kinds, None, chunk
    if model_type == "gemma2" and window:
        # vllm/model_executor/models/gemma2.py: even layers use the sliding window
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(num_layers)), window, None
    if model_type in ("gemma3_text", "gemma3") and window:
        pattern = _int(cfg, "sliding_window_pattern", "_sliding_window_pattern", default=6)
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers)), window, None
    if window and cfg.get("use_sliding_window", True) is not False and model_type in ("mistral", "mixtral", "phi3", "phimoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "starcoder2"):
        # A config-wide window applies to every layer (Mistral v0.1, Phi-3); Qwen sets use_sliding_window=false
        max_window_layers = _int(cfg, "max_window_layers")
        if model_type.startswith("qwen") and max_window_layers is not None:
            return tuple("sliding" if i >= max_window_layers else "full" for i in range(num_layers)), window, None
        return tuple("sliding" for _ in range(num_layers)), window, None
    return tuple("full" for _ in range(num_layers)), None, None


def _linear_attention(cfg: dict, model_type: str) -> LinearAttentionSpec | None:
    if model_type not in GDN_TYPES:
        return None
    ssm = _norm_dtype(cfg.get("mamba_ssm_dtype"))
    return LinearAttentionSpec(
        num_key_heads=_int(cfg, "linear_num_key_heads", default=16), num_value_heads=_int(cfg, "linear_num_value_heads",
                                                                                           default=32),
        key_head_dim=_int(cfg, "linear_key_head_dim", default=128),
        value_head_dim=_int(cfg, "linear_value_head_dim", default=128),
        conv_kernel=_int(cfg, "linear_conv_kernel_dim", default=4), ssm_dtype=ssm)


def _nemotron_h(cfg: dict, num_layers: int, model_id: str) -> tuple[MambaMixerSpec, tuple[str, ...], tuple[str, ...]]:
    """Nemotron-H's single-purpose layers from hybrid_override_pattern (models/nemotron_h.py): M a Mamba2 mixer,
    * attention, - an MLP, E a MoE block."""
    pattern = str(cfg.get("hybrid_override_pattern") or "")
    if len(pattern) != num_layers or set(pattern) - set("M*-E"):
        raise UsageError(f"{model_id}: hybrid_override_pattern {pattern!r} does not describe {num_layers} layers of "
                         "M, *, - and E; pass the model's own config.json")
    if cfg.get("moe_latent_size"):
        raise NotSupportedError(f"{model_id} uses latent MoE projections (moe_latent_size), which oomguard does not "
                                "model yet")
    mixer = MambaMixerSpec(
        num_heads=_int(cfg, "mamba_num_heads", default=128), head_dim=_int(cfg, "mamba_head_dim", default=64),
        n_groups=_int(cfg, "n_groups", default=8), state_size=_int(cfg, "ssm_state_size", default=128),
        conv_kernel=_int(cfg, "conv_kernel", default=4), conv_bias=bool(cfg.get("use_conv_bias", True)),
        ssm_dtype=_norm_dtype(cfg.get("mamba_ssm_cache_dtype")))
    kinds = tuple({"M": "mamba", "*": "full"}.get(c, "none") for c in pattern)
    ffn = tuple({"-": "mlp", "E": "moe"}.get(c, "none") for c in pattern)
    return mixer, kinds, ffn


def _granite_hybrid(cfg: dict, num_layers: int, hidden: int,
                    model_id: str) -> tuple[MambaMixerSpec, tuple[str, ...], tuple[str, ...]]:
    """Granite-4.0-H's layers (models/granitemoehybrid.py GraniteMoeHybridModel): layer_types names each layer a
    "mamba" (GraniteMoeHybridMambaDecoderLayer, a MambaMixer2 of mamba_expand x hidden_size) or an "attention" layer;
    both then run the MoE block (num_local_experts > 0) beside the shared MLP (shared_intermediate_size > 0). Missing
    fields take GraniteMoeHybridConfig's defaults (transformers configuration_granitemoehybrid.py)."""
    types = cfg.get("layer_types")
    if not isinstance(types, list) or len(types) != num_layers or set(types) - {"mamba", "attention"}:
        raise UsageError(f"{model_id}: layer_types {types!r} does not name {num_layers} layers of \"mamba\" and "
                         "\"attention\"; pass the model's own config.json")
    expand = cfg.get("mamba_expand", 2)
    inter = int((expand if isinstance(expand, (int, float)) else 2) * hidden)
    heads = _int(cfg, "mamba_n_heads", default=128)
    mixer = MambaMixerSpec(
        num_heads=heads, head_dim=_int(cfg, "mamba_d_head") or inter // heads,   # mamba_d_head "auto"
        n_groups=_int(cfg, "mamba_n_groups", default=1), state_size=_int(cfg, "mamba_d_state", default=256),
        conv_kernel=_int(cfg, "mamba_d_conv", default=4), conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        intermediate=inter, proj_bias=bool(cfg.get("mamba_proj_bias", False)))
    kinds = tuple("mamba" if t == "mamba" else "full" for t in types)
    experts = _int(cfg, "num_local_experts", default=0) or 0
    shared = _int(cfg, "shared_intermediate_size", default=0) or 0
    ffn = "moe" if experts > 0 else "mlp" if shared > 0 else "none"
    return mixer, kinds, tuple(ffn for _ in range(num_layers))


def _jamba(cfg: dict, num_layers: int, hidden: int, model_id: str) -> tuple[Mamba1MixerSpec, tuple[str, ...]]:
    """Jamba's layers (models/jamba.py JambaModel): JambaConfig.layers_block_type makes layer i attention when
    i % attn_layer_period == attn_layer_offset, else a JambaMambaDecoderLayer whose MambaMixer is mamba_expand x
    hidden_size wide (use_rms_norm=True: the dt, B and C norms). Missing fields take JambaConfig's defaults
    (_TRANSFORMERS_DEFAULTS)."""
    period, offset = _int(cfg, "attn_layer_period", default=8), _int(cfg, "attn_layer_offset", default=4)
    if not period or period <= 0 or offset is None or not 0 <= offset < period:
        raise UsageError(f"{model_id}: attn_layer_period {period} / attn_layer_offset {offset} do not place Jamba's "
                         "attention layers (JambaConfig needs 0 <= offset < period); pass the model's own config.json")
    expand = cfg.get("mamba_expand", 2)
    dt_rank = _int(cfg, "mamba_dt_rank") or math.ceil(hidden / 16)   # JambaConfig: "auto" is ceil(hidden_size / 16)
    mixer = Mamba1MixerSpec(
        intermediate_size=int((expand if isinstance(expand, (int, float)) else 2) * hidden),
        state_size=_int(cfg, "mamba_d_state", default=16), conv_kernel=_int(cfg, "mamba_d_conv", default=4),
        dt_rank=dt_rank, conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        proj_bias=bool(cfg.get("mamba_proj_bias", False)))
    return mixer, tuple("full" if i % period == offset else "mamba" for i in range(num_layers))


def _falcon_h1_mixer(cfg: dict, hidden: int) -> MambaMixerSpec:
    """The Mamba2 mixer beside the attention in every Falcon-H1 layer (models/falcon_h1.py FalconH1SSMDecoderLayer):
    MambaMixer2 of mamba_d_ssm (int(mamba_expand x hidden_size) when config.json sets it to null) with mamba_n_heads
    heads of mamba_d_head, mamba_n_groups, mamba_d_state, mamba_d_conv; its gated norm only with mamba_rms_norm.
    Missing fields take FalconH1Config's defaults (_TRANSFORMERS_DEFAULTS)."""
    expand = cfg.get("mamba_expand", 2)
    d_ssm = _int(cfg, "mamba_d_ssm") or int((expand if isinstance(expand, (int, float)) else 2) * hidden)
    heads = _int(cfg, "mamba_n_heads", default=128)
    return MambaMixerSpec(
        num_heads=heads, head_dim=_int(cfg, "mamba_d_head") or d_ssm // heads,   # FalconH1Config: "auto"
        n_groups=_int(cfg, "mamba_n_groups", default=1), state_size=_int(cfg, "mamba_d_state", default=256),
        conv_kernel=_int(cfg, "mamba_d_conv", default=4), conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        intermediate=d_ssm, proj_bias=bool(cfg.get("mamba_proj_bias", False)),
        gated_norm=bool(cfg.get("mamba_rms_norm", False)))


def _gemma3n_fields(text: dict, top: dict, spec: ModelSpec, layer_inter: tuple[int, ...]) -> dict:
    """What Gemma 3n adds to a plain decoder, as vllm/model_executor/models/gemma3n.py builds it (0.9.2-0.33)."""
    ple_dim = _int(text, "hidden_size_per_layer_input", default=256) or 0
    ple = PerLayerEmbedSpec(ple_dim, _int(text, "vocab_size_per_layer_input") or spec.vocab_size,
                            batch_buffer=isinstance(top.get("text_config"), dict)) if ple_dim > 0 else None
    return dict(
        # Gemma3nAttention: the last num_kv_shared_layers layers read the cache of the last earlier layer of their type
        kv_shared_layers=_int(text, "num_kv_shared_layers", default=0) or 0,
        layer_intermediate=layer_inter if len(set(layer_inter)) > 1 else (),   # Gemma3nMLP intermediate_size[i]
        per_layer_embed=ple,
        gemma3n=Gemma3nSpec(altup_inputs=_int(text, "altup_num_inputs", default=4) or 4,
                            laurel_rank=_int(text, "laurel_rank", default=64) or 0),
        qk_norm=True,
        # Gemma3nForCausalLM.compute_logits: logits from embed_tokens; the model file builds no lm_head
        tie_word_embeddings=True,
    )


# timm parameter counts of the vision towers Gemma 3n names by vision_config.architecture (TimmWrapperModel builds
# timm.create_model(architecture, num_classes=0)). mobilenetv5_300m_enc: timm/models/mobilenetv5.py
# _gen_mobilenet_v5 arch_def (the 300m branch: 3 EdgeResidual, 5 + 37 + 39 UIR / MobileAttention blocks, the
# MultiScaleFusionAdapter to 2048 channels), with RmsNorm2d weights, layer scales and the stem conv's bias: counted
# block by block from that arch_def (timm commit aa4b5850), 294,126,912 parameters.
_TIMM_TOWER_PARAMS = {"mobilenetv5_300m_enc": 294_126_912}
# configuration_gemma3n.py Gemma3nAudioConfig defaults (transformers 4.53)
_GEMMA3N_AUDIO_DEFAULTS = {"hidden_size": 1536, "conf_num_hidden_layers": 12, "conf_num_attention_heads": 8,
                           "conf_conv_kernel_size": 5, "sscp_conv_channel_size": [128, 32],
                           "sscp_conv_kernel_size": [[3, 3], [3, 3]], "sscp_conv_stride_size": [[2, 2], [2, 2]],
                           "input_feat_size": 128, "vocab_size": 128}


def _gemma3n_towers(top: dict, text_hidden: int) -> VisionSpec | None:
    """Gemma 3n's vision and audio towers and their embedders, as gemma3n_mm.py Gemma3nForConditionalGeneration builds
    them from 0.10.1: transformers' AutoModel.from_config for each tower (a timm MobileNet-V5 and the USM conformer
    Gemma3nAudioEncoder, plain modules whole on every TP rank) and two Gemma3nMultimodalEmbedder (a
    VocabParallelEmbedding of vocab_size rows, hard and soft RMSNorms, a RowParallelLinear to the text width)."""
    vc, ac = top.get("vision_config"), top.get("audio_config")
    params, split, parts = 0, 0, []
    for cfg in (vc, ac):
        if isinstance(cfg, dict):   # Gemma3nMultimodalEmbedder: embedding, two norms, projection (split over TP)
            width = _int(cfg, "hidden_size", default=2048 if cfg is vc else 1536)
            split += _padded64(_int(cfg, "vocab_size", default=128)) * width + width * text_hidden
            params += 2 * width
    if isinstance(vc, dict):
        arch = str(vc.get("architecture") or "mobilenetv5_300m_enc")
        if arch not in _TIMM_TOWER_PARAMS:
            raise NotSupportedError(f"Gemma 3n vision tower {arch!r} is not modelled (oomguard counts timm's "
                                    f"{', '.join(_TIMM_TOWER_PARAMS)})")
        params += _TIMM_TOWER_PARAMS[arch]
        parts.append(f"vision tower timm {arch}")
    if isinstance(ac, dict):
        a = {**_GEMMA3N_AUDIO_DEFAULTS, **{k: x for k, x in ac.items() if x is not None}}
        h, heads, k = a["hidden_size"], a["conf_num_attention_heads"], a["conf_conv_kernel_size"]
        # modeling_gemma3n.py Gemma3nAudioConformerBlock: two feed-forwards (H->4H->H, pre and post RMSNorm each),
        # attention (pre_attn_norm, relative_position_embedding.pos_proj, q/k/v, per_dim_scale, post, post_norm),
        # the light conv (pre norm, linear_start H->2H, depthwise kernel, conv_norm, linear_end) and the block norm
        block = 2 * (8 * h * h + 2 * h) + (5 * h * h + h // heads + 2 * h) + (3 * h * h + k * h + 2 * h) + h
        params += a["conf_num_hidden_layers"] * block
        # Gemma3nAudioSubSampleConvProjection: two bias-free convs with CumulativeGroupNorm weights, input_proj_linear
        freq, c_in = a["input_feat_size"], 1
        for c_out, (kh, kw), (_, sw) in zip(a["sscp_conv_channel_size"], a["sscp_conv_kernel_size"],
                                            a["sscp_conv_stride_size"]):
            params += c_in * c_out * kh * kw + c_out
            freq, c_in = (freq + 2 - kw) // sw + 1, c_out
        params += c_in * freq * h
        parts.append(f"audio tower of {a['conf_num_hidden_layers']} conformer blocks of width {h}")
    if not parts:
        return None
    return VisionSpec(params=params, note=" and ".join(parts) + " (transformers' Gemma 3n towers)", replicated=True,
                      family="gemma3n", split_params=split)


def _padded64(n: int) -> int:
    return -(-n // 64) * 64


def _hybrid_layers(cfg: dict, num_layers: int) -> tuple[str, ...]:
    """Gated DeltaNet ("linear") or full attention per layer: layer_types, else every full_attention_interval-th
    layer is full attention (Qwen3NextConfig / Qwen3_5TextConfig)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == num_layers:
        return tuple("linear" if str(t).startswith("linear") else "full" for t in types)
    interval = _int(cfg, "full_attention_interval", default=4) or 4
    return tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(num_layers))


_IGNORED_SECTION = re.compile(r"layers\.(\d+)\.([A-Za-z_]+)\*?$")


def _quant_spec(qc: dict | None, model_id: str) -> QuantSpec | None:
    quant = _quant_method_spec(qc, model_id)
    if quant is None or not quant.ignored:
        return quant
    # whole per-layer modules an ignore list names ("...layers.3.self_attn*", "...layers.0.mlp*"): kept unquantized
    sections = frozenset((int(m.group(1)), m.group(2)) for p in quant.ignored if (m := _IGNORED_SECTION.search(p)))
    return replace(quant, ignored_sections=sections) if sections else quant


def _quant_method_spec(qc: dict | None, model_id: str) -> QuantSpec | None:
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "")).lower()
    ignored = tuple(str(x) for x in (qc.get("ignored_layers") or qc.get("modules_to_not_convert")
                                      or qc.get("ignore") or qc.get("llm_int8_skip_modules") or []))
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        bits = _int(qc, "bits", "w_bit", default=4)
        group = _int(qc, "group_size", "q_group_size", default=128)
        return QuantSpec(method=method.replace("_marlin", ""), bits=bits, group_size=None if group == -1 else group,
                         zero_point=True, ignored=ignored, lm_head_quantized=bool(qc.get("lm_head", False)))
    if method == "fp8":
        block = qc.get("weight_block_size")
        return QuantSpec(method="fp8", bits=8, block=tuple(block) if block else None, ignored=ignored, scale_bytes=4,
                         fp8_strategy="block" if block else "tensor")
    if method == "mxfp4":
        # gpt-oss: MoE experts in MXFP4 (4-bit values + one uint8 scale per 32), attention and router in bf16
        return QuantSpec(method="mxfp4", bits=4, group_size=32, scale_bytes=1, experts_only=True, ignored=ignored)
    if method in ("modelopt", "modelopt_fp4", "nvfp4"):
        algo = str(qc.get("quant_algo", "")).upper()
        layers = qc.get("quantized_layers")
        if algo == "MIXED_PRECISION" and isinstance(layers, dict) and layers:
            # ModelOpt's per-module algorithms (vllm quantization/modelopt.py ModelOptMixedPrecisionConfig): the
            # algorithm most modules use stands for all (the routed experts, most of the bytes, are among them)
            algos = [str(v.get("quant_algo", "")).upper() for v in layers.values() if isinstance(v, dict)]
            algo = max(set(algos), key=algos.count) if algos else algo
        if "FP4" in algo or method != "modelopt":
            return QuantSpec(method="modelopt_fp4", bits=4, group_size=16, scale_bytes=1, ignored=ignored)
        return QuantSpec(method="modelopt", bits=8, ignored=ignored, scale_bytes=4)
    if method == "bitsandbytes":
        if qc.get("load_in_8bit"):
            return QuantSpec(method="bitsandbytes", bits=8, ignored=ignored, scale_bytes=0)
        double = bool(qc.get("bnb_4bit_use_double_quant"))
        # absmax per 64 values: fp32, or uint8 + fp32 per 256 with double quantization
        return QuantSpec(method="bitsandbytes", bits=4, group_size=64, scale_bytes=(1 + 4 / 256) if double else 4,
                         ignored=ignored)
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        scheme = next(iter(groups.values()), {}) if isinstance(groups, dict) else {}
        weights = scheme.get("weights") or {}
        bits = _int(weights, "num_bits", default=8)
        wtype = str(weights.get("type", "int"))
        strategy = str(weights.get("strategy", "channel"))
        group = _int(weights, "group_size") if strategy == "group" else None
        block = weights.get("block_structure") if strategy == "block" else None
        if wtype == "float" and bits == 8:
            return QuantSpec(method="compressed-tensors", bits=8, block=tuple(block) if block else None,
                             ignored=ignored, scale_bytes=4 if block else 2, fp8_strategy=strategy)
        if wtype == "float" and bits == 4:
            return QuantSpec(method="compressed-tensors", bits=4, group_size=group or 16, scale_bytes=1, ignored=ignored)
        return QuantSpec(method="compressed-tensors", bits=bits, group_size=group, ignored=ignored,
                         zero_point=not weights.get("symmetric", True))
    if method in ("", "none"):
        return None
    raise NotSupportedError(f"quantization method {method!r} in {model_id}'s config.json is not modelled yet")


def _moe_spec(cfg: dict, num_layers: int, model_type: str) -> MoeSpec | None:
    experts = _int(cfg, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    if not experts or experts <= 1:
        return None
    top_k = _int(cfg, "num_experts_per_tok", "moe_topk", "experts_per_token", "top_k_experts", "moe_k", default=2)
    expert_inter = _int(cfg, "moe_intermediate_size", "intermediate_size_moe", "expert_intermediate_size",
                        "intermediate_size")
    shared = 0
    if (n_shared := _int(cfg, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts")) and expert_inter:
        shared = n_shared * expert_inter
    shared = _int(cfg, "shared_expert_intermediate_size", default=shared) or 0
    if model_type == "granitemoehybrid":  # granitemoeshared.py GraniteMoeSharedMLP beside GraniteMoeMoE
        shared = _int(cfg, "shared_intermediate_size", default=0) or 0
    if model_type == "nemotron_h":  # nemotron_h.py NemotronHMoE: shared experts of their own width
        shared = (_int(cfg, "moe_shared_expert_intermediate_size", default=0) or 0) * (n_shared or 0)
    if model_type == "llama4_text":
        shared = _int(cfg, "intermediate_size", default=0) if cfg.get("num_shared_experts", 1) else 0
        expert_inter = _int(cfg, "intermediate_size", default=expert_inter)
    first_dense = _int(cfg, "first_k_dense_replace", default=0) or 0
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    interleave = _int(cfg, "interleave_moe_layer_step")
    layers = []
    for i in range(num_layers):
        if interleave:  # Llama 4 (llama4.py): every `interleave`-th layer is MoE
            layers.append((i + 1) % interleave == 0)
        elif model_type == "ernie4_5_moe":  # ernie45_moe.py Ernie4_5_MoeDecoderLayer.__init__
            start = _int(cfg, "moe_layer_start_index", default=0) or 0
            end = _int(cfg, "moe_layer_end_index", default=num_layers - 1)
            every = _int(cfg, "moe_layer_interval", default=1) or 1
            layers.append(bool(cfg.get("use_moe", True)) and (i + 1) % every == 0 and start <= i <= end)
        elif model_type == "jamba":  # JambaConfig.layers_num_experts: num_experts where i % period == offset
            layers.append(i % (_int(cfg, "expert_layer_period", default=2) or 2)
                          == _int(cfg, "expert_layer_offset", default=1))
        elif model_type == "nemotron_h":  # the E layers of hybrid_override_pattern
            layers.append(str(cfg.get("hybrid_override_pattern", ""))[i:i + 1] == "E")
        elif "decoder_sparse_step" in cfg:  # Qwen MoE (qwen2_moe.py / qwen3_moe.py)
            layers.append(i not in mlp_only and (i + 1) % (_int(cfg, "decoder_sparse_step") or 1) == 0)
        else:  # DeepSeek (deepseek_v2.py): dense for the first k layers, then every moe_layer_freq-th
            layers.append(i >= first_dense and i % (_int(cfg, "moe_layer_freq", default=1) or 1) == 0)
    return MoeSpec(num_experts=experts, top_k=top_k or 2, expert_intermediate_size=expert_inter or 0,
                   shared_intermediate_size=shared, moe_layers=tuple(layers),
                   shared_expert_gate=model_type in ("qwen2_moe", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe"),
                   router_bias=model_type in ("gpt_oss", "nemotron_h"))


def _vision_spec(cfg: dict) -> VisionSpec | None:
    """Weights of a vision tower from its vision_config: a ViT of `depth` blocks plus patch embedding and merger.

    This is an estimate (the exact layout differs per family); the planner marks it as such.
    """
    vc = cfg.get("vision_config")
    if not isinstance(vc, dict):
        return None
    vc = {**_TRANSFORMERS_VISION_DEFAULTS.get(cfg.get("model_type"), {}), **vc}
    qwen_vl = cfg.get("model_type") in ("qwen2_vl", "qwen2_5_vl")
    moonvit = vc.get("model_type") == "moonvit"  # Kimi-VL (vllm/model_executor/models/moonvit.py)
    # Qwen2-VL names the tower's width embed_dim; its hidden_size there is the merger's output (the LM's width)
    hidden = _int(vc, "embed_dim", "hidden_size", "width") if qwen_vl else _int(vc, "hidden_size", "embed_dim", "width")
    depth = _int(vc, "num_hidden_layers", "depth", "layers")
    if not hidden or not depth:
        return None
    inter = _int(vc, "intermediate_size", "mlp_dim", default=int(vc.get("mlp_ratio") or 4) * hidden)
    patch = _int(vc, "patch_size", default=14)
    channels = _int(vc, "num_channels", "in_channels", "in_chans", default=3)
    temporal = _int(vc, "temporal_patch_size", default=1)
    gated = str(vc.get("hidden_act", "")).lower() in ("silu", "swiglu") or vc.get("model_type") == "qwen2_5_vl"
    mlp = (3 if gated else 2) * hidden * inter + (2 * inter if gated else inter) + hidden  # weights and biases
    norm = 2 * hidden if cfg.get("model_type") == "qwen2_vl" or moonvit else hidden  # LayerNorm or RMSNorm
    block = 4 * hidden * hidden + mlp + 4 * hidden + 2 * norm  # qkvo, mlp, qkvo biases, two norms
    params = depth * block + channels * temporal * patch * patch * hidden
    text_hidden = _int(cfg.get("text_config") or cfg, "hidden_size", default=hidden)
    merge = _int(vc, "spatial_merge_size", default=1) or 1
    if moonvit:
        # learnable position grid, patch-embedding bias and final LayerNorm; merge_kernel_size is [h, w]
        params += _int(vc, "init_pos_emb_height", default=0) * _int(vc, "init_pos_emb_width", default=0) * hidden
        params += hidden + norm
        merge = math.isqrt(math.prod(vc.get("merge_kernel_size") or [1]))
    if qwen_vl or moonvit:
        out_hidden = _int(vc, "out_hidden_size", default=None) or (_int(vc, "hidden_size") if "embed_dim" in vc
                                                                  else text_hidden)
        # vllm/model_executor/models/qwen2_5_vl.py Qwen2_5_VisionPatchMerger (qwen2_vl.py alike; kimi_vl.py
        # KimiVLMultiModalProjector too): a norm, then Linear(C*m^2 -> C*m^2) and Linear(C*m^2 -> out), with biases
        wide = hidden * merge * merge
        params += norm + wide * wide + wide + wide * out_hidden + out_hidden
    else:
        out_hidden = _int(vc, "out_hidden_size", default=None) or text_hidden
        params += hidden * merge * merge * out_hidden + out_hidden * out_hidden  # projector / patch merger
    extra = _int(vc, "num_global_layers", default=0) or 0  # Mllama's global encoder layers
    params += extra * block
    note = f"vision tower estimated from vision_config ({depth} blocks of width {hidden})"
    return VisionSpec(params=params, note=note, **_vision_shape(cfg, vc, depth + extra, hidden, inter, gated, patch,
                                                                channels, temporal, out_hidden))


def _vision_shape(cfg: dict, vc: dict, depth: int, hidden: int, inter: int, gated: bool, patch: int, channels: int,
                  temporal: int, out_hidden: int) -> dict:
    """The tower's shape for its profile-run pass (VisionSpec's shape fields), from vision_config and the
    top-level fields each family's vLLM model file reads (qwen2_vl.py, qwen3_vl.py, gemma3_mm.py, llava.py,
    llava_next.py, mistral3.py, internvl.py, kimi_vl.py, mllama.py, mllama4.py)."""
    family = str(cfg.get("model_type") or "")
    text = cfg.get("text_config") or cfg.get("llm_config") or {}
    merge = _int(vc, "spatial_merge_size") or _int(cfg, "spatial_merge_size") or 1
    if vc.get("model_type") == "moonvit":
        merge = math.isqrt(math.prod(vc.get("merge_kernel_size") or [1]))
    deepstack = vc.get("deepstack_visual_indexes") if family.startswith(("qwen3_vl", "qwen3_5")) else None
    if "text_config" not in cfg and isinstance(text, dict) and _int(text, "hidden_size"):
        out_hidden = _int(text, "hidden_size")   # InternVL's llm_config: mlp1 projects to the LM's width
    width = out_hidden * (1 + len(deepstack)) if isinstance(deepstack, list) else out_hidden
    pinpoints = cfg.get("image_grid_pinpoints")
    pinpoints = tuple((int(h), int(w)) for h, w in pinpoints) if isinstance(pinpoints, list) and all(
        isinstance(p, list) and len(p) == 2 for p in pinpoints) else ()
    ratio = cfg.get("downsample_ratio", vc.get("pixel_shuffle_ratio", 1.0))
    kept = vc.get("intermediate_layers_indices")
    return dict(
        family=family, encoder=str(vc.get("model_type") or ""), depth=depth, hidden=hidden, intermediate=inter,
        gated=gated, patch_size=patch,
        image_size=_int(vc, "image_size", default=0) or _int(cfg, "force_image_size", default=0) or 0,
        channels=channels, temporal_patch=temporal, spatial_merge=merge, out_width=width,
        text_type=str(text.get("model_type") or "") if isinstance(text, dict) else "",
        downsample_ratio=float(ratio) if isinstance(ratio, (int, float)) else 1.0,
        max_tiles=_int(cfg, "max_dynamic_patch", default=0) or _int(vc, "max_num_tiles", default=0) or 0,
        thumbnail=bool(cfg.get("use_thumbnail", False)), grid_pinpoints=pinpoints,
        feature_select=str(cfg.get("vision_feature_select_strategy") or "default"),
        tokens_per_image=_int(cfg, "mm_tokens_per_image", "vision_soft_tokens_per_image", default=0) or 0,
        pooling=_int(vc, "pooling_kernel_size", default=1) or 1,
        kept_layers=len(kept) if isinstance(kept, list) else 0)


# Fields a published config.json may leave out because transformers' config class supplies them; vLLM reads the
# config through that class, so the defaults are part of the model (transformers/models/<type>/configuration_*.py).
_TRANSFORMERS_DEFAULTS = {
    # configuration_gemma.py / configuration_gemma2.py: embeddings tied unless the config says otherwise
    "gemma": {"tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True},
    # configuration_gemma3.py Gemma3TextConfig.__init__ (transformers 4.50)
    "gemma3_text": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131_072, "tie_word_embeddings": True, "sliding_window": 4096,
                    "sliding_window_pattern": 6},
    # configuration_gemma4.py Gemma4TextConfig (transformers 5.5): the field defaults, and global_head_dim's 512
    "gemma4_text": {"vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131_072, "tie_word_embeddings": True, "sliding_window": 512,
                    "vocab_size_per_layer_input": 262_144, "hidden_size_per_layer_input": 256,
                    "attention_k_eq_v": False, "num_kv_shared_layers": 0, "global_head_dim": 512},
    # configuration_jamba.py JambaConfig.__init__ (the Jamba-v0.1 shape)
    "jamba": {"vocab_size": 65536, "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "max_position_embeddings": 262_144, "num_experts_per_tok": 2, "num_experts": 16,
              "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8, "attn_layer_offset": 4,
              "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True,
              "mamba_proj_bias": False},
    # configuration_falcon_h1.py FalconH1Config (its field defaults: mamba_d_ssm 1024 unless config.json says null)
    "falcon_h1": {"vocab_size": 128_000, "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 14336,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "max_position_embeddings": 8192, "mamba_d_ssm": 1024, "mamba_n_heads": 128, "mamba_n_groups": 1,
                  "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True,
                  "mamba_proj_bias": False, "mamba_rms_norm": False},
}
# vllm/transformers_utils/configs/chatglm.py ChatGLMConfig.__init__ (the class vLLM registers for "chatglm"; the
# checkpoints' own configuration_chatglm.py has the same defaults), and PretrainedConfig's tie_word_embeddings
_TRANSFORMERS_DEFAULTS["chatglm"] = {
    "num_layers": 28, "padded_vocab_size": 65024, "hidden_size": 4096, "ffn_hidden_size": 13696,
    "num_attention_heads": 32, "seq_length": 2048, "rmsnorm": True, "post_layer_norm": True,
    "add_bias_linear": False, "add_qkv_bias": False, "multi_query_attention": False, "multi_query_group_num": 1,
    "tie_word_embeddings": True,
}
# configuration_gemma4.py Gemma4VisionConfig / Gemma4AudioConfig defaults (transformers 5.5)
_GEMMA4_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16,
                           "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 64, "patch_size": 16,
                           "position_embedding_size": 10 * 1024, "use_clipped_linears": False, "standardize": False}
_GEMMA4_AUDIO_DEFAULTS = {"hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 8,
                          "subsampling_conv_channels": [128, 32], "conv_kernel_size": 5, "output_proj_dims": 1536,
                          "use_clipped_linears": True}
# The same for vision_config, keyed by the checkpoint's model_type (Qwen's own AWQ configs leave depth out):
# configuration_qwen2_vl.py Qwen2VLVisionConfig and configuration_qwen2_5_vl.py Qwen2_5_VLVisionConfig (4.51)
_TRANSFORMERS_VISION_DEFAULTS = {
    "qwen2_vl": {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "hidden_act": "quick_gelu", "mlp_ratio": 4,
                 "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "qwen2_5_vl": {"depth": 32, "hidden_size": 3584, "hidden_act": "silu", "intermediate_size": 3420,
                   "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 3584},
}


def parse_config(config: dict, model_id: str, checkpoint_bytes: int | None = None, source: str = "") -> ModelSpec:
    """Build a ModelSpec from a decoded config.json. Raises UsageError / NotSupportedError with what to do."""
    if not isinstance(config, dict):
        raise UsageError(f"config.json of {model_id} is not a JSON object; pass a Hugging Face config.json with --model-config")
    top = config
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if top.get("model_type") == "internvl_chat" and isinstance(top.get("llm_config"), dict):
        text = top["llm_config"]   # internvl.py InternVLChatModel: the language model is built from llm_config
    model_type = str(text.get("model_type") or top.get("model_type") or "")
    served_as = ""
    if top.get("model_type") == "minicpmv":
        # minicpmv.py MiniCPMV.__new__: config.version picks the class and with it the language model, whose fields
        # are config.json's own top-level ones
        model_type, served_as = _minicpmv_text(top, model_id)
    if top.get("model_type") == "gemma3" and not text.get("model_type"):
        model_type = "gemma3_text"   # Gemma3Config builds its text_config as a Gemma3TextConfig
    if top.get("model_type") == "gemma4" and text is not top and not text.get("model_type"):
        model_type = "gemma4_text"   # Gemma4Config builds its text_config as a Gemma4TextConfig
    if top.get("model_type") == "gemma3n" and text is not top and not text.get("model_type"):
        model_type = "gemma3n_text"  # Gemma3nConfig builds its text_config as a Gemma3nTextConfig
    text = {**_TRANSFORMERS_DEFAULTS.get(model_type, {}), **text}
    if model_type == "gemma4_text":
        text = _gemma4_layer_types(text)
    top_type = str(top.get("model_type") or model_type)
    if model_type in _UNSUPPORTED_TYPES or top_type in _UNSUPPORTED_TYPES or text.get("layers_block_type") \
            or (text.get("hybrid_override_pattern") and model_type != "nemotron_h") or text.get("linear_attn_config") \
            or (model_type not in GDN_TYPES and text.get("linear_num_value_heads")):
        raise NotSupportedError(f"{model_id} is a hybrid linear-attention/Mamba model ({top_type}); oomguard does "
                                f"not model {top_type} yet (of these it models Qwen3-Next, Qwen3.5, Nemotron-H, "
                                "Granite-4.0-H, Jamba and Falcon-H1)")
    archs = top.get("architectures") or text.get("architectures") or [top_type or "unknown"]
    architecture = str(archs[0]) if isinstance(archs, list) and archs else str(archs)

    hidden = _require(_int(text, "hidden_size", "n_embd", "d_model"), "hidden_size", model_id)
    num_layers = _require(_int(text, "num_hidden_layers", "n_layer", "num_layers"), "num_hidden_layers", model_id)
    heads = _require(_int(text, "num_attention_heads", "n_head"), "num_attention_heads", model_id)
    _check_modelled(model_id, model_type, top_type, architecture)
    kv_heads = _int(text, "num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num")
    if kv_heads is None:
        kv_heads = 1 if text.get("multi_query") else heads
    head_dim = _int(text, "head_dim") or hidden // heads
    if model_type == "chatglm":
        _check_chatglm(text, model_id)
        # chatglm.py GLMAttention: multi_query_group_num KV heads with multi_query_attention, else one per head;
        # head_dim = hidden_size // num_attention_heads (kv_channels is not read)
        kv_heads = (_int(text, "multi_query_group_num", default=1) or 1) if text.get("multi_query_attention") \
            else heads
        head_dim = hidden // heads
    if model_type in ("minicpm", "granitemoehybrid", "jamba"):
        # minicpm.py MiniCPMAttention / granitemoehybrid.py GraniteMoeHybridAttention / jamba.py
        # JambaAttentionDecoderLayer: head_dim = hidden // heads
        head_dim = hidden // heads
    # chatglm.py ChatGLMModel: embedding and output_layer are padded_vocab_size rows
    vocab = _require(_int(text, "padded_vocab_size" if model_type == "chatglm" else "vocab_size")
                     or _int(top, "vocab_size"), "vocab_size", model_id)
    inter = _int(text, "intermediate_size", "n_inner", "ffn_hidden_size") or 4 * hidden
    widths = text.get("intermediate_size")   # Gemma 3n: one MLP width per layer (MatFormer)
    layer_inter = tuple(int(w) for w in widths) if isinstance(widths, list) and len(widths) == num_layers else ()
    if layer_inter:
        inter = max(layer_inter)

    dtype = _norm_dtype(text.get("torch_dtype") or text.get("dtype") or top.get("torch_dtype") or top.get("dtype"))
    if dtype is None:
        dtype = "float32" if "torch_dtype" not in text and "torch_dtype" not in top else "bfloat16"

    mla = low_rank = None
    if _int(text, "kv_lora_rank") and model_type == "minicpm3":
        # minicpm3.py MiniCPM3Attention: Attention(num_heads, qk_head_dim, num_kv_heads=num_heads) over the
        # decompressed keys and values, the value padded to qk_head_dim: every head caches K and V
        low_rank = MlaSpec(kv_lora_rank=_int(text, "kv_lora_rank"), qk_rope_head_dim=_int(text, "qk_rope_head_dim"),
                           qk_nope_head_dim=_int(text, "qk_nope_head_dim"), v_head_dim=_int(text, "v_head_dim"),
                           q_lora_rank=_int(text, "q_lora_rank"))
        head_dim, kv_heads = low_rank.qk_nope_head_dim + low_rank.qk_rope_head_dim, heads
    elif _int(text, "kv_lora_rank"):
        mla = MlaSpec(kv_lora_rank=_int(text, "kv_lora_rank"), qk_rope_head_dim=_int(text, "qk_rope_head_dim", default=64),
                      qk_nope_head_dim=_int(text, "qk_nope_head_dim", default=128),
                      v_head_dim=_int(text, "v_head_dim", default=128), q_lora_rank=_int(text, "q_lora_rank"))
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    kinds, window, chunk = _layer_attention(text, num_layers, model_type)
    recurrent, ffn = _linear_attention(text, model_type), None
    if recurrent:
        kinds = _hybrid_layers(text, num_layers)
    if model_type == "nemotron_h":
        recurrent, kinds, ffn = _nemotron_h(text, num_layers, model_id)
    if model_type == "granitemoehybrid":
        recurrent, kinds, ffn = _granite_hybrid(text, num_layers, hidden, model_id)
        # granitemoeshared.py GraniteMoeSharedMLP: the dense MLP is shared_intermediate_size wide
        inter = _int(text, "shared_intermediate_size", default=0) or inter
    if model_type == "jamba":
        recurrent, kinds = _jamba(text, num_layers, hidden, model_id)
    if model_type == "falcon_h1":
        recurrent = _falcon_h1_mixer(text, hidden)
    if mla:
        kinds = tuple("mla" for _ in range(num_layers))

    rope = text.get("rope_scaling") or {}
    rope_type = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
    positions = _int(text, "max_position_embeddings", default=2048)
    if rope_type in ("yarn", "deepseek_yarn") and isinstance(rope.get("factor"), (int, float)):
        # vllm/model_executor/layers/rotary_embedding: YaRN caches original_max_position * factor positions
        positions = int(_int(rope, "original_max_position_embeddings", default=positions) * rope["factor"])
    rope_params = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), dict) else {}
    partial = text.get("partial_rotary_factor", rope_params.get("partial_rotary_factor", 1.0))
    rotary_dim = mla.qk_rope_head_dim if mla else int(head_dim * (partial if isinstance(partial, (int, float)) else 1.0))
    if low_rank:
        rotary_dim = low_rank.qk_rope_head_dim   # minicpm3.py: get_rope(qk_rope_head_dim, ...)
    rope_caches = (positions,)
    if rope_type in ("longrope", "su") and _int(rope, "original_max_position_embeddings"):
        # rotary_embedding Phi3LongRoPEScaledRotaryEmbedding: long_short_cos_sin_cache = cat(short cache over
        # original_max_position_embeddings, long cache over max_position_embeddings)
        rope_caches = (positions + _int(rope, "original_max_position_embeddings"),)
    if model_type in ("gemma3_text", "gemma3", "gemma3n_text"):
        rope_caches = (positions, positions)  # separate local and global RoPE bases
    if model_type == "olmo3":
        # olmo2.py (0.11-0.27) / olmo3.py (0.28-0.29) Olmo2Attention: "Rope scaling is only applied on full attention
        # layers"; sliding layers get a plain RoPE over max_position_embeddings, a second cache when they differ
        scaling = text.get("rope_scaling") or text.get("rope_parameters") or {}
        scaling_type = (scaling.get("rope_type") or scaling.get("type")) if isinstance(scaling, dict) else None
        plain = _int(text, "max_position_embeddings", default=2048)
        full = plain
        if scaling_type in ("yarn", "deepseek_yarn") and isinstance(scaling.get("factor"), (int, float)):
            full = int(_int(scaling, "original_max_position_embeddings", default=plain) * scaling["factor"])
        scaled = scaling_type not in (None, "default")
        rope_caches = ((full if scaled else plain,) if "full" in kinds else ()) + \
            ((plain,) if "sliding" in kinds and (scaled or "full" not in kinds) else ())
    if model_type == "llama4_text" or text.get("position_embedding_type") == "absolute" or \
            model_type in ("gpt2", "opt", "nemotron_h", "jamba"):   # Nemotron-H and Jamba attention have no RoPE
        rope_caches = (positions,) if model_type == "llama4_text" else ()
    if model_type == "granitemoehybrid" and text.get("position_embedding_type") != "rope":
        rope_caches = ()   # GraniteMoeHybridAttention: rotary_emb only with position_embedding_type "rope" (NoPE)
    if model_type == "chatglm":
        # chatglm.py GLMAttention: get_rope over half the head (rotary_dim=head_dim // 2 to 0.12, partial_rotary_factor
        # 0.5 from 0.13), max_position=config.seq_length; rope_ratio scales the base only, original_rope the layout
        rotary_dim, rope_caches = head_dim // 2, (_int(text, "seq_length", default=8192),)
    # baichuan.py BaichuanForCausalLM: hidden_size 4096 (Baichuan2-7B) is "ROPE", every other width (Baichuan-13B,
    # Baichuan2-13B) "ALIBI"; BaiChuanForCausalLM (Baichuan-7B) always "ROPE"
    alibi = model_type == "baichuan" and architecture != "BaiChuanForCausalLM" and hidden != 4096
    if model_type == "baichuan":
        # BaiChuanAttention: get_rope(head_dim, max_position=getattr(config, "max_position_embeddings", 8192)); the
        # ALiBi layers build no rotary embedding
        rope_caches = () if alibi else (_int(text, "max_position_embeddings", default=8192),)

    norms = 2
    if model_type in ("gemma2", "gemma3_text", "gemma3"):
        norms = 4
    if model_type == "phimoe":
        norms = 4   # phimoe.py PhiMoEDecoderLayer: two nn.LayerNorm, weight and bias each (lm_head's bias: 1 x vocab)
    if model_type == "nemotron_h":
        norms = 1   # one pre-norm per single-purpose layer
    qk_norm = model_type in ("qwen3", "qwen3_moe", "gemma3_text", "gemma3", "olmo2", "olmo3", "exaone4") \
        or model_type in GDN_TYPES \
        or bool(text.get("use_qk_norm"))

    quant = _quant_spec(top.get("quantization_config") or text.get("quantization_config"), model_id)
    spec = ModelSpec(
        model_id=model_id, architecture=architecture, model_type=model_type, dtype=dtype,
        hidden_size=hidden, intermediate_size=inter, num_layers=num_layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab, derived_max_model_len=derived_max_len(text),
        # jamba.py JambaForCausalLM builds its own lm_head and never ties it; InternVL's language model reads
        # llm_config's own tie_word_embeddings
        tie_word_embeddings=model_type != "jamba" and bool(
            (text if top_type == "internvl_chat" else top).get("tie_word_embeddings",
                                                               text.get("tie_word_embeddings", False))),
        layer_attention=kinds, sliding_window=window, attention_chunk_size=chunk,
        # chatglm.py GLMAttention: query_key_value bias = add_bias_linear or add_qkv_bias (_check_chatglm refuses
        # add_bias_linear)
        qkv_bias=bool(text.get("add_qkv_bias")) if model_type == "chatglm" else model_type == "phimoe" or
        bool(text.get("use_bias" if model_type == "ernie4_5_moe" else "attention_bias",
                      model_type in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"))),
        # phimoe.py PhiMoEAttention: qkv_proj and o_proj with bias=True whatever the config says
        o_bias=model_type == "phimoe" or bool(text.get("attention_bias", False)) and model_type in ("gpt_oss",),
        qk_norm=qk_norm, norms_per_layer=norms, mla=mla, moe=_moe_spec(text, num_layers, model_type), quant=quant,
        vision=_gemma3n_towers(top, hidden) if model_type == "gemma3n_text" else
        _internvl_towers(top, hidden, model_id) if top_type == "internvl_chat" else
        _minicpmv_towers(top, hidden, served_as, model_id) if top_type == "minicpmv" else _vision_spec(top),
        recurrent=recurrent, layer_ffn=ffn, gated_mlp=model_type != "nemotron_h",
        attn_output_gate=bool(text.get("attn_output_gate", isinstance(recurrent, LinearAttentionSpec))),
        rope_cache_positions=rope_caches, rotary_dim=rotary_dim,
        checkpoint_bytes=checkpoint_bytes, source=source,
        # DeepSeek / GLM / MiMo num_nextn_predict_layers, Qwen3.5 mtp_num_hidden_layers (vllm/config/speculative.py)
        mtp_layers=_int(text, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0) or 0,
        mixer_beside_attention=model_type == "falcon_h1",   # falcon_h1.py FalconH1ParallelHybrid
        alibi=alibi, served_as=served_as,
        # chatglm.py ChatGLMModel (embedding, output_layer, final_layernorm) and baichuan.py BaiChuanModel /
        # BaiChuanBaseForCausalLM (embed_tokens, norm, lm_head) build them on every pipeline stage
        embeddings_every_stage=model_type in ("chatglm", "baichuan"),
    )
    if model_type == "gemma4_text":
        spec = replace(spec, **_gemma4_fields(text, top, spec))
    if model_type == "gemma3n_text":
        spec = replace(spec, **_gemma3n_fields(text, top, spec, layer_inter))
    if low_rank:
        spec = replace(spec, low_rank_attention=low_rank)
    if mla and _int(text, "index_topk"):
        spec = replace(spec, indexer=_indexer(text, model_id))
    return spec


def _indexer(text: dict, model_id: str) -> IndexerSpec:
    """DeepSeek-V3.2 / GLM-5 sparse attention (DSA): vLLM treats any DeepSeek config with index_topk as one
    (models/deepseek_v2.py DeepseekV2Model.is_v32). GLM-5.2's index sharing (IndexShare) is read here as the
    checkpoint declares it; what each vLLM release makes of it is engines/vllm/weights.py's."""
    layers = _int(text, "num_hidden_layers", default=0) or 0
    freq = _int(text, "index_topk_freq", default=1) or 1
    offset = _int(text, "index_skip_topk_offset")
    raw_pattern = text.get("index_topk_pattern")
    pattern = tuple(str(x) for x in raw_pattern) if isinstance(raw_pattern, (list, tuple, str)) else None
    types = text.get("indexer_types")
    if isinstance(types, list) and len(types) == layers:
        # the checkpoint's own per-layer list (transformers GlmMoeDsaConfig: "full" or "shared")
        shared = tuple(i for i, t in enumerate(types) if t != "full")
    elif pattern is not None:
        shared = tuple(i for i in range(min(layers, len(pattern))) if pattern[i] == "S")
    elif freq > 1:
        # transformers' and vLLM 0.23+'s schedule: a layer computes its top-k when max(i - offset + 1, 0) % freq == 0
        # (vLLM's default offset is 2)
        first = 2 if offset is None else offset
        shared = tuple(i for i in range(layers) if max(i - first + 1, 0) % freq)
    else:
        shared = ()
    return IndexerSpec(num_heads=_int(text, "index_n_heads", default=64), head_dim=_int(text, "index_head_dim",
                                                                                         default=128),
                       topk=_int(text, "index_topk"), rope_interleave=bool(text.get("indexer_rope_interleave")),
                       topk_freq=freq, skip_offset=offset, topk_pattern=pattern,
                       use_index_cache=bool(text.get("use_index_cache")), shared_layers=shared)


def _gemma4_layer_types(text: dict) -> dict:
    """Gemma4TextConfig.__post_init__: layer_types default to five sliding layers then one full, and the last layer
    is always made full attention."""
    layers = _int(text, "num_hidden_layers", default=30)
    types = text.get("layer_types")
    if not isinstance(types, list) or len(types) != layers:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    if types and types[-1] != "full_attention":
        types = [*types[:-1], "full_attention"]
    return {**text, "layer_types": types}


def _gemma4_fields(text: dict, top: dict, spec: ModelSpec) -> dict:
    """What Gemma 4 adds to a plain decoder, as vllm/model_executor/models/gemma4.py builds it (0.19-0.33)."""
    n, kinds = spec.num_layers, spec.layer_attention
    # gemma4.py Gemma4DecoderLayer / transformers_utils/configs/gemma4.py gemma4_layer_config: full-attention layers
    # use global_head_dim, and with attention_k_eq_v num_global_key_value_heads
    global_dim = _int(text, "global_head_dim") or spec.head_dim
    global_kv = _int(text, "num_global_key_value_heads") if text.get("attention_k_eq_v") else None
    global_kv = global_kv or spec.num_kv_heads
    head_dims = tuple(global_dim if k == "full" else spec.head_dim for k in kinds)
    kv_heads = tuple(global_kv if k == "full" else spec.num_kv_heads for k in kinds)
    # Gemma4Attention: the last num_kv_shared_layers layers read the cache of the last earlier layer of their type
    shared = _int(text, "num_kv_shared_layers", default=0) or 0
    # Gemma4DecoderLayer: use_double_wide_mlp doubles the dense MLP of the KV-shared layers
    first_shared = n - shared
    widths = tuple(spec.intermediate_size * (2 if text.get("use_double_wide_mlp") and i >= first_shared > 0 else 1)
                   for i in range(n))
    ple_dim = _int(text, "hidden_size_per_layer_input", default=0) or 0
    multimodal = isinstance(top.get("text_config"), dict)
    ple = PerLayerEmbedSpec(ple_dim, _int(text, "vocab_size_per_layer_input") or spec.vocab_size,
                            batch_buffer=multimodal) if ple_dim > 0 else None
    # one RoPE per layer type (get_rope caches by its arguments); gemma4_rope.py Gemma4RotaryEmbedding ("proportional")
    # keeps a cos/sin cache as wide as the head whatever partial_rotary_factor says
    params = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), dict) else {}
    dims = []
    for kind, name in (("sliding", "sliding_attention"), ("full", "full_attention")):
        if kind not in kinds:
            continue
        rope = params.get(name) if isinstance(params.get(name), dict) else params
        width = global_dim if kind == "full" else spec.head_dim
        partial = rope.get("partial_rotary_factor", 1.0)
        dims.append(width if rope.get("rope_type") == "proportional" else int(width * partial))
    positions = _int(text, "max_position_embeddings", default=131_072)
    return dict(
        layer_head_dim=head_dims if len(set(head_dims)) > 1 else (),
        layer_kv_heads=kv_heads if len(set(kv_heads)) > 1 else (),
        head_dim=spec.head_dim, kv_shared_layers=shared,
        layer_intermediate=widths if len(set(widths)) > 1 else (),
        per_layer_embed=ple, mlp_beside_moe=spec.moe is not None,
        qk_norm=True, norms_per_layer=4 + (1 if ple else 0),   # input, post-attention, pre- and post-feedforward
        rope_cache_positions=tuple(positions for _ in dims), rope_cache_dims=tuple(dims),
        rotary_dim=dims[0] if dims else spec.rotary_dim,
        embeddings_every_stage=True,   # Gemma4Model builds embed_tokens (and the PLE table) on every PP rank
        vision=_gemma4_towers(top, spec.hidden_size) if multimodal else None,
    )


def _gemma4_towers(top: dict, text_hidden: int) -> VisionSpec | None:
    """Gemma 4's vision (and audio) towers: transformers' Gemma4VisionModel / Gemma4AudioModel, which
    gemma4_mm.py Gemma4ForConditionalGeneration builds with AutoModel.from_config, replicated on every TP rank
    (recursive_replace_linear: "replicate"), with the Gemma4MultimodalEmbedder projections to the text width."""
    vc, ac = top.get("vision_config"), top.get("audio_config")
    params, parts = 0, []
    if isinstance(vc, dict):
        v = {**_GEMMA4_VISION_DEFAULTS, **{k: x for k, x in vc.items() if x is not None}}
        h, inter, d = v["hidden_size"], v["intermediate_size"], v["head_dim"]
        heads, kv = v["num_attention_heads"], v["num_key_value_heads"]
        # Gemma4VisionEncoderLayer: q/k/v/o (Gemma4ClippableLinear, no bias), gated MLP, four RMSNorms, q/k norms
        layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * inter + 4 * h + 2 * d
        layer += 7 * 4 if v["use_clipped_linears"] else 0            # input/output min/max per clipped linear
        params += v["num_hidden_layers"] * layer
        params += 3 * v["patch_size"] ** 2 * h + 2 * v["position_embedding_size"] * h   # Gemma4VisionPatchEmbedder
        params += 2 * h if v["standardize"] else 0                     # std_bias, std_scale
        params += h * text_hidden                                      # embed_vision.embedding_projection
        parts.append(f"vision tower of {v['num_hidden_layers']} blocks of width {h}")
    if isinstance(ac, dict):
        a = {**_GEMMA4_AUDIO_DEFAULTS, **{k: x for k, x in ac.items() if x is not None}}
        h, heads, out = a["hidden_size"], a["num_attention_heads"], a["output_proj_dims"]
        c0, c1 = a["subsampling_conv_channels"]
        # Gemma4AudioLayer: two feed-forwards (H->4H->H, two norms each), attention (q, k, v, post, relative_k_proj,
        # per_dim_scale), the light conv (H->2H, H->H, depthwise kernel, two norms) and three norms
        layer = 2 * (8 * h * h + 2 * h) + 5 * h * h + h // heads + 3 * h * h + a["conv_kernel_size"] * h + 2 * h + 3 * h
        layer += 10 * 4 if a["use_clipped_linears"] else 0
        params += a["num_hidden_layers"] * layer
        # Gemma4AudioSubSampleConvProjection: two 3x3 convs with LayerNorms, then input_proj_linear
        params += 9 * c0 + c0 + 9 * c0 * c1 + c1 + (c0 // 4) * c1 * h
        params += h * out + out + out * text_hidden                    # output_proj (bias), embed_audio projection
        parts.append(f"audio tower of {a['num_hidden_layers']} conformer blocks of width {h}")
    if not parts:
        return None
    shape = {}
    if isinstance(vc, dict):   # Gemma4VisionEncoderLayer: a gated MLP; vision_soft_tokens_per_image pooled tokens
        shape = dict(family="gemma4", encoder="gemma4_vision", depth=v["num_hidden_layers"], hidden=v["hidden_size"],
                     intermediate=v["intermediate_size"], gated=True, patch_size=v["patch_size"],
                     out_width=text_hidden, pooling=_int(vc, "pooling_kernel_size", default=3) or 3,
                     tokens_per_image=_int(top, "vision_soft_tokens_per_image", default=0) or
                     _int(vc, "default_output_length", default=0) or 0)
    return VisionSpec(params=params, note=" and ".join(parts) + " (transformers' Gemma 4 towers)", replicated=True,
                      **shape)


def _check_chatglm(text: dict, model_id: str) -> None:
    """Refuse, by name, the ChatGLM layouts models/chatglm.py builds differently from what this module counts."""
    if text.get("vision_config") is not None:
        raise NotSupportedError(f"{model_id} is GLM-4V in the ChatGLM format (vision_config): vLLM serves it with "
                                "glm4v.py's EVA2-CLIP tower, which oomguard does not model")
    unmodelled = [name for name, bad in (("add_bias_linear", bool(text.get("add_bias_linear"))),
                                         ("rmsnorm: false (LayerNorm)", not text.get("rmsnorm", True)),
                                         ("post_layer_norm: false", not text.get("post_layer_norm", True)),
                                         ("quantization_bit", bool(text.get("quantization_bit"))))
                  if bad]
    if unmodelled:
        raise NotSupportedError(f"{model_id}: a ChatGLM config with {', '.join(unmodelled)} is not modelled (the "
                                "published ChatGLM2/3 and GLM-4 checkpoints have none of these)")


# minicpmv.py _SUPPORT_VERSION: config.version -> (the class MiniCPMV dispatches to, its language model's model type:
# MiniCPMV2_6 Qwen2ForCausalLM, MiniCPMV4_0 LlamaForCausalLM, MiniCPMV4_5 Qwen3ForCausalLM)
_MINICPMV_VERSIONS = {(2, 6): ("MiniCPMV2_6", "qwen2"), (4, 0): ("MiniCPMV4_0", "llama"),
                      (4, 5): ("MiniCPMV4_5", "qwen3")}


def _minicpmv_text(top: dict, model_id: str) -> tuple[str, str]:
    """(the language model's model type, the class) for a MiniCPM-V checkpoint (minicpmv.py get_version_by_config:
    no version field is 2.0 with hidden_size 2304 and query_num 64, else 2.5)."""
    version = top.get("version")
    if version is None:
        key = (2, 0) if top.get("hidden_size") == 2304 and top.get("query_num") == 64 else (2, 5)
    else:
        try:
            key = tuple(int(x) for x in str(version).split("."))
        except ValueError:
            raise UsageError(f"{model_id}: MiniCPM-V version {version!r} is not a number") from None
    if key not in _MINICPMV_VERSIONS:
        raise NotSupportedError(f"{model_id}: MiniCPM-V {'.'.join(map(str, key))} (minicpmv.py MiniCPMV"
                                f"{'_'.join(map(str, key))}) is not modelled; oomguard models MiniCPM-V 2.6, 4.0 and "
                                "4.5")
    cls, text_type = _MINICPMV_VERSIONS[key]
    return text_type, cls


# configuration_intern_vit.py InternVisionConfig belongs to each checkpoint; vLLM reads these of it
_INTERN_VIT_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "image_size",
                      "patch_size", "qkv_bias", "qk_normalization", "norm_type")


def _internvl_towers(top: dict, text_hidden: int, model_id: str) -> VisionSpec | None:
    """InternVL's InternViT and mlp1 projector, module by module as models/internvl.py InternVLChatModel builds them
    (intern_vit.py InternVisionModel; the same in 0.6.6 ... 0.33)."""
    vc = top.get("vision_config")
    if not isinstance(vc, dict):
        return None
    missing = [k for k in _INTERN_VIT_FIELDS if k not in vc]
    if missing or not isinstance(top.get("downsample_ratio"), (int, float)):
        raise UsageError(f"{model_id}: vision_config lacks {', '.join(missing) or 'nothing'} or the config lacks "
                         "downsample_ratio (InternVL's config class is the checkpoint's own code, so oomguard knows "
                         "no defaults); pass the model's own config.json")
    h, inter, heads = int(vc["hidden_size"]), int(vc["intermediate_size"]), int(vc["num_attention_heads"])
    layers, size, patch = int(vc["num_hidden_layers"]), int(vc["image_size"]), int(vc["patch_size"])
    select = _int(top, "select_layer", default=-1)
    # internvl.py _init_vision_model: num_hidden_layers_override = layers + select_layer + 1 (select_layer < 0)
    depth = layers + select + 1 if select < 0 else select + 1
    norm = 2 * h if vc["norm_type"] == "layer_norm" else h   # intern_vit.py NORM2FN: nn.LayerNorm or RMSNorm
    # InternParallelAttention: qkv (QKVParallelLinear, bias=qkv_bias) and proj's weight split over TP when TP
    # divides the heads, else whole (InternSdpaAttention before 0.11, disable_tp after)
    head_split = depth * (3 * h * h + (3 * h if vc["qkv_bias"] else 0) + h * h)
    # InternMLP: fc1 (ColumnParallelLinear, bias) and fc2's weight (RowParallelLinear) split over TP
    split = depth * (h * inter + inter + inter * h)
    # whole on every rank: proj's and fc2's biases, q_norm / k_norm (RMSNorm over every head) with
    # qk_normalization, norm1 / norm2, the layer scales ls1 / ls2
    per_layer = 2 * h + (2 * h if vc["qk_normalization"] else 0) + 2 * norm + 2 * h
    # InternVisionEmbeddings: class_embedding [H], patch_embedding Conv2d(3, H, patch) with bias, position_embedding
    # [(image_size / patch)^2 + 1, H]
    embed = h + 3 * patch * patch * h + h + ((size // patch) ** 2 + 1) * h
    # _init_mlp1: LayerNorm(H x (1/r)^2), Linear(H x (1/r)^2 -> text), GELU, Linear(text -> text): nn modules, whole
    # on every rank
    wide = h * int(1 / top["downsample_ratio"]) ** 2
    mlp1 = 2 * wide + wide * text_hidden + text_hidden + text_hidden * text_hidden + text_hidden
    shape = _vision_shape(top, vc, depth, h, inter, False, patch, 3, 1, text_hidden)
    return VisionSpec(params=depth * per_layer + embed + mlp1, split_params=split, head_split_params=head_split,
                      heads=heads, replicated=True, exact=True,
                      note=f"InternViT of {depth} blocks of width {h} and the mlp1 projector (internvl.py)", **shape)


# transformers configuration_siglip.py SiglipVisionConfig.__init__ defaults (MiniCPM-V's config class builds its
# vision_config as one)
_SIGLIP_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                           "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 16}


def _minicpmv_towers(top: dict, text_hidden: int, served_as: str, model_id: str) -> VisionSpec | None:
    """MiniCPM-V's SigLIP tower and resampler, as models/minicpmv.py builds them (MiniCPMV2_6 / 4_0 / 4_5:
    idefics2_vision_model.py Idefics2VisionTransformer, Resampler2_5 / Resampler4_5)."""
    vc = top.get("vision_config")
    if not isinstance(vc, dict):
        return None
    v = {**_SIGLIP_VISION_DEFAULTS, **{k: x for k, x in vc.items() if x is not None}}
    h, inter, layers = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
    size, patch, channels = int(v["image_size"]), int(v["patch_size"]), int(v["num_channels"])
    queries = _int(top, "query_num")
    if not queries:
        raise UsageError(f"{model_id}: config.json has no query_num (the resampler's queries); pass the model's own "
                         "config.json")
    # init_vision_module: drop_vision_last_layer keeps layers[:-1] (the dropped layer's weights are freed)
    depth = layers - (1 if top.get("drop_vision_last_layer") else 0)
    # Idefics2VisionAttention qkv_proj (QKVParallelLinear, bias) and out_proj's weight, Idefics2VisionMLP fc1
    # (ColumnParallelLinear, bias) and fc2's weight: split over TP
    split = depth * (3 * h * h + 3 * h + h * h + h * inter + inter + inter * h)
    # whole on every rank: out_proj's and fc2's biases, layer_norm1 / layer_norm2 (nn.LayerNorm)
    per_layer = 2 * h + 4 * h
    # Idefics2VisionEmbeddings: patch_embedding Conv2d(channels, H, patch) with bias, position_embedding
    # nn.Embedding((image_size / patch)^2, H); post_layernorm
    embed = channels * patch * patch * h + h + (size // patch) ** 2 * h + 2 * h
    # layers/resampler.py BaseResampler (embed_dim D = the LM's hidden_size, kv_dim = the tower's): query [Q, D],
    # kv_proj ReplicatedLinear [D, kv] without bias (none when kv == D), nn.MultiheadAttention (in_proj [3D, D] and
    # out_proj [D, D], with biases), ln_q / ln_kv / ln_post (nn.LayerNorm), proj [D, D]
    d = text_hidden
    resampler = queries * d + (h * d if h != d else 0) + 4 * d * d + 4 * d + 6 * d + d * d
    # buffers the resampler carries onto the GPU in the model dtype (init_resampler .to(dtype), then the device):
    # Resampler2_5 pos_embed [70, 70, D] (max_size (70, 70)); Resampler4_5 also temporal_pos_embed [36000, D]
    buffers = 70 * 70 * d + (36000 * d if served_as == "MiniCPMV4_5" else 0)
    shape = dict(family="minicpmv", encoder=str(vc.get("model_type") or "siglip"), depth=depth, hidden=h,
                 intermediate=inter, gated=False, patch_size=patch, image_size=_int(top, "image_size", default=0) or 0,
                 channels=channels, out_width=d, text_type=served_as)
    return VisionSpec(params=depth * per_layer + embed + resampler + buffers, split_params=split, replicated=True,
                      exact=True, note=f"SigLIP tower of {depth} blocks of width {h} and the resampler (minicpmv.py "
                                       f"{served_as})", **shape)


def _check_modelled(model_id: str, model_type: str, top_type: str, architecture: str) -> None:
    """Refuse, by name, a model whose layers this module has not read (MODELLED_TYPES)."""
    if not model_type:   # an old or hand-written config: the architecture class names the type
        name = re.sub(r"(For\w+|Model)$", "", architecture).lower()
        model_type = top_type = next((t for t in MODELLED_TYPES if t.replace("_", "") == name), name)
    for kind in dict.fromkeys((model_type, top_type)):
        if kind in NOT_MODELLED_YET:
            raise NotSupportedError(f"{model_id} (model type {kind}) is not modelled yet: the plain formula would "
                                    f"miss {NOT_MODELLED_YET[kind]}")
        if kind not in MODELLED_TYPES:
            raise NotSupportedError(f"{model_id}: model type {kind or 'unknown'!r} is not modelled yet (its layers "
                                    "may hold memory the dense formula does not see); plan a modelled model of the "
                                    "same shape with --like MODEL if you know it is one")
