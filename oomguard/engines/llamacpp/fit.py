"""llama.cpp tiering plan: GGUF quantization, layers on the GPU (-ngl), KV cache type, speed. Pure, no I/O.

Memory per device mirrors what llama.cpp's own fit logic adds up (common/fit.cpp, llama_get_memory_breakdown):
model weights + KV cache ("context") + compute buffer, per device, for the llama.cpp vendored by
llama-cpp-python 0.3.36:
- weights: `quant.choose_types` over `tensors.gguf_tensors` (exact for the tensor list; a few KiB of GGUF
  header and rope tables aside);
- placement (src/llama-model.cpp load_tensors): -ngl N puts the output layer (output_norm + output) on the
  GPU first, then the last N - 1 repeating layers; token embeddings always stay on the CPU;
- KV cache (src/llama-context.cpp, llama-kv-cache.cpp, llama-kv-cache-iswa.cpp): n_ctx padded to 256, one
  stream of n_ctx/np cells per slot (llama-server with an explicit -np), each layer's K and V on its layer's
  device; sliding-window layers hold pad256(min(n_ctx_seq, n_swa + n_ubatch)) cells per stream;
- compute buffer: an estimate (the graph allocator's peak) fitted to llama.cpp's own figures, see
  `compute_buffer_bytes`; llama-fit-params' default margin (--fit-target) is 1 GiB.
The split is checked against llama-fit-params itself in tests/test_llamacpp_fit.py.

Speed is a roofline upper bound: decode reads every weight once per step (MoE: the routed experts in use) plus
the KV of the context, the GPU part at the GPU's memory bandwidth and the CPU part at the CPU's
(`DEFAULT_CPU_BANDWIDTH`, flag-able); prefill is compute-bound on the GPU, and CPU-resident weights cross
PCIe once per micro-batch (ggml-cuda offloads large batches' matmuls to the GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from oomguard.engines.llamacpp.quant import FTYPES, QUALITY_LADDER, choose_types, row_bytes, tensor_bytes
from oomguard.engines.llamacpp.tensors import gguf_tensors, mix_context, tied_output
from oomguard.errors import UsageError
from oomguard.models.params import parameter_counts
from oomguard.models.spec import ModelSpec
from oomguard.units import GiB, MiB

DEFAULT_CPU_BANDWIDTH = 60e9      # bytes/s: dual-channel DDR5-4800 (76.8 GB/s peak), ~60 GB/s achieved
DEFAULT_MARGIN_BYTES = 1024 * MiB  # common/common.h fit_params_target: 1024 MiB per device
DEFAULT_UBATCH = 512               # common/common.h n_ubatch
CTX_PAD = 256                      # llama-context.cpp: GGML_PAD(n_ctx, 256)
KV_TYPES = ("f16", "q8_0", "q4_0")
_KV_GGML = {"f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "f32": "F32"}
UNUSABLE_SECONDS_PER_TOKEN = 1.0


def _pad(n: int, to: int = CTX_PAD) -> int:
    return -(-n // to) * to


# ---------------------------------------------------------------- weights

@dataclass(frozen=True)
class Weights:
    """Bytes of a GGUF file of `model` at quantization `ftype`, by where llama.cpp can place them."""

    ftype: str
    layer_bytes: tuple[int, ...]          # per repeating layer (norms, attention, FFN / experts)
    layer_expert_bytes: tuple[int, ...]   # the routed-expert part of each layer (0 for dense layers)
    token_embd_bytes: int                 # input layer: always on the CPU (llama-model.cpp dev_input)
    output_norm_bytes: int
    output_matrix_bytes: int              # output.weight, or the tied token_embd that llama.cpp duplicates
    tied: bool                            # (TENSOR_DUPLICATED) onto the output layer's device
    params: int
    type_counts: tuple[tuple[str, int], ...]

    @property
    def output_bytes(self) -> int:
        """What the output layer puts on its device."""
        return self.output_norm_bytes + self.output_matrix_bytes

    @property
    def file_bytes(self) -> int:
        return (sum(self.layer_bytes) + self.token_embd_bytes + self.output_norm_bytes
                + (0 if self.tied else self.output_matrix_bytes))

    @property
    def bits_per_weight(self) -> float:
        return self.file_bytes * 8 / max(1, self.params)


def gguf_weights(model: ModelSpec, ftype: str) -> Weights:
    if ftype not in FTYPES:
        raise UsageError(f"unknown GGUF quantization {ftype!r}; use one of {', '.join(FTYPES)}")
    tensors = gguf_tensors(model)
    types = choose_types(tensors, ftype, mix_context(model))
    return place_tensors(((t.name, t.layer, ty, tensor_bytes(ty, t.shape), math.prod(t.shape))
                          for t, ty in zip(tensors, types)), model.num_layers, ftype, tied_output(model))


def place_tensors(tensors, num_layers: int, ftype: str, tied: bool) -> Weights:
    """Weights from (name, layer or None, ggml type, bytes, elements) per tensor: each repeating layer's bytes (its
    routed experts apart), the input embedding, the output norm and matrix (the embedding again when tied)."""
    layers, experts = [0] * num_layers, [0] * num_layers
    embd = out = out_norm = params = 0
    counts: dict[str, int] = {}
    for name, layer, ggml_type, size, elements in tensors:
        params += elements
        counts[ggml_type] = counts.get(ggml_type, 0) + 1
        if layer is not None:
            if layer < num_layers:   # a file's extra blocks (MTP heads) are not repeating layers llama.cpp offloads
                layers[layer] += size
                if "_exps" in name:
                    experts[layer] += size
        elif name == "token_embd.weight":
            embd = size
        elif name == "output_norm.weight":
            out_norm = size
        else:
            out += size
    return Weights(ftype, tuple(layers), tuple(experts), embd, out_norm, embd if tied else out, tied, params,
                   tuple(sorted(counts.items())))


# ---------------------------------------------------------------- KV cache

@dataclass(frozen=True)
class KvCache:
    type_k: str
    type_v: str
    n_ctx: int            # total cells of the full-attention layers, as llama.cpp pads it
    n_seq: int            # slots (-np), one stream each
    n_ctx_seq: int        # per slot
    layer_bytes: tuple[int, ...]
    layer_bytes_per_token: tuple[int, ...]   # K+V of one token (what a decode step reads per context token)

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes)


def kv_cache(model: ModelSpec, n_ctx: int, n_seq: int = 1, type_k: str = "f16", type_v: str = "f16",
             n_ubatch: int = DEFAULT_UBATCH) -> KvCache:
    """llama.cpp's KV cache for `-c n_ctx -np n_seq` (llama-context.cpp: padding; llama-kv-cache*.cpp: sizes)."""
    for t in (type_k, type_v):
        if t not in _KV_GGML:
            raise UsageError(f"unknown KV cache type {t!r}; use one of {', '.join(KV_TYPES)}")
    if n_ctx < 1 or n_seq < 1:
        raise UsageError("the context size and the number of slots must be positive")
    n_ctx = _pad(n_ctx)
    n_ctx_seq = _pad(n_ctx // n_seq) if n_ctx // n_seq else CTX_PAD   # llama_context: n_ctx / n_seq_max, padded
    window = model.sliding_window or model.attention_chunk_size
    layers, per_token = [], []
    for kind in model.layer_attention:
        if model.mla:  # MLA: one latent (kv_lora_rank + rope dims) per token as K, no V (is_mla)
            k_width, v_width = model.mla.kv_lora_rank + model.mla.qk_rope_head_dim, 0
        else:
            k_width = v_width = model.num_kv_heads * model.head_dim
        cells = n_ctx_seq
        if kind in ("sliding", "chunked") and window:
            cells = _pad(min(n_ctx_seq, window + n_ubatch))  # llama-kv-cache-iswa.cpp size_swa (non-unified)
        token = row_bytes(_KV_GGML[type_k], k_width) + (row_bytes(_KV_GGML[type_v], v_width) if v_width else 0)
        layers.append(token * cells * n_seq)
        per_token.append(token)
    return KvCache(type_k, type_v, n_ctx_seq * n_seq, n_seq, n_ctx_seq, tuple(layers), tuple(per_token))


# ---------------------------------------------------------------- compute buffers

def compute_buffer_bytes(model: ModelSpec, kv: KvCache, *, device_layers: int, output_on_device: bool,
                         flash_attn: bool, n_ubatch: int = DEFAULT_UBATCH, host: bool = False,
                         device_experts: bool = True) -> int:
    """Estimated peak of ggml's graph allocator on one device for the `n_ubatch`-token graph llama.cpp reserves.

    The live f32 activations of the largest step (llama-graph.cpp), t = n_ubatch tokens, h = hidden size:
    - attention without flash attention: the scores KQ [n_kv, t, n_head] (n_kv = cells per stream; the
      streams split the tokens), the KQ mask [n_kv, t] and Q, K, V, output: 4t(4h + 2 kv_dim);
    - FFN: gate, up and their product, 12 t n_ff (MoE: the top-k experts' width plus shared experts), with two
      residual-width tensors (three with flash attention, whose output is not reused in place);
    - every layer on the device: the mask (f16 with flash attention) and the input embeddings join the FFN step;
    - the output layer: logits [n_vocab, t] plus the residual (MoE: the last layer's expert combine, top-k + 1);
    - the CPU also holds the input embeddings of the micro-batch;
    - MoE with every routed expert of the device's layers on the CPU (--n-cpu-moe): only the shared experts'
      FFN runs on the device, and the expert combine before the output layer runs on the CPU.
    The coefficients were fitted to llama.cpp's own breakdown (llama-fit-params --fit-print, on shape-only
    GGUFs of Llama 2/3, CodeLlama and Mixtral shapes, 512-32768 context, 1-4 slots, with and without flash
    attention): within 1-5% where attention or logits dominate. An estimate, labelled as such.
    """
    t = min(n_ubatch, kv.n_ctx)
    h = model.hidden_size
    th = 4 * t * h
    kv_dim = model.num_kv_heads * model.head_dim
    mask = (2 if flash_attn else 4) * kv.n_ctx_seq * t
    moe = model.moe is not None and device_experts
    if model.moe:
        ff = model.moe.shared_intermediate_size + (model.moe.expert_intermediate_size * model.moe.top_k if moe else 0)
    else:
        ff = model.intermediate_size
    peak = 0
    if device_layers > 0:
        ffn = 12 * t * ff + (3 if flash_attn else 2) * th
        if device_layers >= model.num_layers and not host:
            ffn += mask + (0 if flash_attn else 2 * th)
        attn = 0 if flash_attn else 4 * kv.n_ctx_seq * t * model.num_heads + mask + 4 * t * (4 * h + 2 * kv_dim)
        peak = max(attn, ffn)
    if output_on_device:
        peak = max(peak, 4 * t * model.vocab_size + th * (1 + (model.moe.top_k + 1 if moe else 0)))
    if host:  # the input embeddings of the micro-batch (get_rows on token_embd)
        peak += th
    return peak


# ---------------------------------------------------------------- the split

@dataclass(frozen=True)
class Split:
    n_gpu_layers: int          # the -ngl value (0 .. n_layer + 1)
    n_layer: int
    gpu_weights_bytes: int
    gpu_kv_bytes: int
    gpu_compute_bytes: int
    cpu_weights_bytes: int
    cpu_kv_bytes: int
    cpu_compute_bytes: int
    n_cpu_moe: int = 0         # --n-cpu-moe: the routed experts of the first N layers stay on the CPU

    @property
    def gpu_bytes(self) -> int:
        return self.gpu_weights_bytes + self.gpu_kv_bytes + self.gpu_compute_bytes

    @property
    def cpu_bytes(self) -> int:
        return self.cpu_weights_bytes + self.cpu_kv_bytes + self.cpu_compute_bytes

    @property
    def repeating_on_gpu(self) -> int:
        return max(0, self.n_gpu_layers - 1)

    @property
    def output_on_gpu(self) -> bool:
        return self.n_gpu_layers >= 1

    @property
    def full_offload(self) -> bool:
        return self.n_gpu_layers > self.n_layer and self.n_cpu_moe == 0

    def describe(self) -> str:
        if self.n_cpu_moe:
            where = "all layers" if self.n_gpu_layers > self.n_layer else f"{self.repeating_on_gpu} layers"
            return (f"{where} and the output layer on the GPU except the routed experts of the first "
                    f"{self.n_cpu_moe} layers, which stay on the CPU")
        if self.full_offload:
            return f"all {self.n_layer} layers and the output layer on the GPU"
        if self.n_gpu_layers == 0:
            return "everything on the CPU"
        on = self.repeating_on_gpu
        if on == 0:
            return f"the output layer on the GPU; all {self.n_layer} repeating layers on the CPU"
        first = self.n_layer - on
        return (f"the output layer and layers {first}-{self.n_layer - 1} ({on} of {self.n_layer}) on the GPU; "
                f"layers 0-{first - 1} on the CPU")

    def to_dict(self) -> dict:
        return {"n_gpu_layers": self.n_gpu_layers, "n_layer": self.n_layer, "n_cpu_moe": self.n_cpu_moe,
                "placement": self.describe(),
                "gpu_gib": {"weights": _g(self.gpu_weights_bytes), "kv_cache": _g(self.gpu_kv_bytes),
                            "compute_estimated": _g(self.gpu_compute_bytes), "total": _g(self.gpu_bytes)},
                "cpu_gib": {"weights": _g(self.cpu_weights_bytes), "kv_cache": _g(self.cpu_kv_bytes),
                            "compute_estimated": _g(self.cpu_compute_bytes), "total": _g(self.cpu_bytes)}}


def _g(n: float) -> float:
    return round(n / GiB, 3)


def split_for(model: ModelSpec, weights: Weights, kv: KvCache, n_gpu_layers: int, *, flash_attn: bool,
              n_ubatch: int = DEFAULT_UBATCH, n_cpu_moe: int = 0) -> Split:
    """Where everything goes with `-ngl n_gpu_layers`.

    llama-model.cpp load_tensors: layer il (il == n_layer is the output layer) is on the GPU when
    il >= n_layer + 1 - ngl, so -ngl 1 offloads the output layer alone, -ngl k the output layer and the last
    k - 1 repeating layers, -ngl n_layer + 1 everything; token embeddings always stay on the CPU."""
    n = model.num_layers
    ngl = max(0, min(n_gpu_layers, n + 1))
    output_gpu = ngl >= 1
    on_gpu = max(0, ngl - 1)
    first = n - on_gpu
    gw = sum(weights.layer_bytes[first:]) + (weights.output_bytes if output_gpu else 0)
    # on the CPU a tied output matrix is the token_embd already there (one mmap'd copy)
    cpu_out = 0 if output_gpu else weights.output_norm_bytes + (0 if weights.tied else weights.output_matrix_bytes)
    cw = sum(weights.layer_bytes[:first]) + weights.token_embd_bytes + cpu_out
    # common/common.h llm_add_n_cpu_ffn_overrides: blk.<i>.ffn_*_exps of layers i < N to the CPU buffer type
    cpu_moe_end = max(first, min(n_cpu_moe, n))
    moved = sum(weights.layer_expert_bytes[first:cpu_moe_end])
    gw, cw = gw - moved, cw + moved
    gk = sum(kv.layer_bytes[first:])
    ck = sum(kv.layer_bytes[:first])
    gc = compute_buffer_bytes(model, kv, device_layers=on_gpu, output_on_device=output_gpu, flash_attn=flash_attn,
                              n_ubatch=n_ubatch, device_experts=cpu_moe_end < n) if ngl > 0 else 0
    cc = compute_buffer_bytes(model, kv, device_layers=first, output_on_device=not output_gpu,
                              flash_attn=flash_attn, n_ubatch=n_ubatch, host=True)
    if moved and model.moe:  # the CPU runs the routed experts of the --n-cpu-moe layers (their FFN step only)
        t, th = min(n_ubatch, kv.n_ctx), 4 * min(n_ubatch, kv.n_ctx) * model.hidden_size
        cc = max(cc, 12 * t * model.moe.expert_intermediate_size * model.moe.top_k + 3 * th)
    return Split(ngl, n, gw, gk, gc, cw, ck, cc, min(n_cpu_moe, n) if moved else 0)


def max_gpu_layers(model: ModelSpec, weights: Weights, kv: KvCache, gpu_free_bytes: int, *, flash_attn: bool,
                   margin_bytes: int = DEFAULT_MARGIN_BYTES, n_ubatch: int = DEFAULT_UBATCH) -> Split:
    """The largest -ngl whose GPU memory (weights + KV + compute) stays within free - margin, whole layers
    from the back, as llama-fit-params places a dense model (common/fit.cpp, step 3)."""
    target = gpu_free_bytes - margin_bytes
    best = split_for(model, weights, kv, 0, flash_attn=flash_attn, n_ubatch=n_ubatch)
    for ngl in range(1, model.num_layers + 2):  # memory grows with ngl; a linear scan is cheap (<= ~130 steps)
        s = split_for(model, weights, kv, ngl, flash_attn=flash_attn, n_ubatch=n_ubatch)
        if s.gpu_bytes > target:
            break
        best = s
    return best


def min_cpu_moe(model: ModelSpec, weights: Weights, kv: KvCache, gpu_free_bytes: int, *, flash_attn: bool,
                margin_bytes: int = DEFAULT_MARGIN_BYTES, n_ubatch: int = DEFAULT_UBATCH) -> Split | None:
    """MoE: every layer on the GPU (-ngl n_layer + 1) with the routed experts of the fewest first layers on the
    CPU (--n-cpu-moe N) that fits; None for dense models or when even all experts on the CPU do not fit."""
    if not model.moe:
        return None
    target = gpu_free_bytes - margin_bytes
    full = model.num_layers + 1
    for n_cpu in range(0, model.num_layers + 1):
        s = split_for(model, weights, kv, full, flash_attn=flash_attn, n_ubatch=n_ubatch, n_cpu_moe=n_cpu)
        if s.gpu_bytes <= target:
            return s
    return None


# ---------------------------------------------------------------- speed

@dataclass(frozen=True)
class Speed:
    """Roofline upper bounds (no kernel inefficiency, no overlap of CPU and GPU work)."""

    decode_tokens_per_s: float          # one request at the planned context
    decode_tokens_per_s_all_slots: float  # all -np slots decoding together, each at the planned context
    gpu_ms_per_token: float
    cpu_ms_per_token: float
    prefill_tokens_per_s: float
    gpu_bandwidth_bytes_per_s: float
    cpu_bandwidth_bytes_per_s: float
    pcie_bandwidth_bytes_per_s: float
    bound: str

    @property
    def seconds_per_token(self) -> float:
        return 1.0 / self.decode_tokens_per_s if self.decode_tokens_per_s else float("inf")

    def to_dict(self) -> dict:
        return {"decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
                "decode_tokens_per_s_all_slots": round(self.decode_tokens_per_s_all_slots, 2),
                "gpu_ms_per_token": round(self.gpu_ms_per_token, 3), "cpu_ms_per_token": round(self.cpu_ms_per_token, 3),
                "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 1),
                "assumed_gpu_bandwidth_gb_per_s": round(self.gpu_bandwidth_bytes_per_s / 1e9, 1),
                "assumed_cpu_bandwidth_gb_per_s": round(self.cpu_bandwidth_bytes_per_s / 1e9, 1),
                "assumed_pcie_gb_per_s": round(self.pcie_bandwidth_bytes_per_s / 1e9, 1),
                "bound": self.bound, "kind": "roofline upper bound"}


def speed(model: ModelSpec, weights: Weights, kv: KvCache, split: Split, *, context_tokens: int,
          gpu_bandwidth: float, cpu_bandwidth: float = DEFAULT_CPU_BANDWIDTH, gpu_flops: float = 0.0,
          pcie_bandwidth: float = 0.0, n_ubatch: int = DEFAULT_UBATCH) -> Speed:
    n = model.num_layers
    first = n - split.repeating_on_gpu

    def read(lo: int, hi: int) -> float:  # weight bytes a decode step reads from layers [lo, hi)
        total = 0.0
        for i in range(lo, hi):
            dense = weights.layer_bytes[i] - weights.layer_expert_bytes[i]
            used = model.moe.top_k / model.moe.num_experts if model.moe and weights.layer_expert_bytes[i] else 1.0
            total += dense + weights.layer_expert_bytes[i] * used
        return total

    out = weights.output_bytes  # the output matrix is read every step; token_embd is a row lookup
    gpu_w = read(first, n) + (out if split.output_on_gpu else 0)
    cpu_w = read(0, first) + (0 if split.output_on_gpu else out)
    if split.n_cpu_moe and model.moe:  # routed experts of the first N layers are read from host RAM
        moved = sum(weights.layer_expert_bytes[first:max(first, split.n_cpu_moe)]) * model.moe.top_k / model.moe.num_experts
        gpu_w, cpu_w = gpu_w - moved, cpu_w + moved
    ctx = min(context_tokens, kv.n_ctx_seq)
    gpu_kv = sum(kv.layer_bytes_per_token[first:]) * ctx
    cpu_kv = sum(kv.layer_bytes_per_token[:first]) * ctx
    g1 = (gpu_w + gpu_kv) / gpu_bandwidth if gpu_bandwidth else 0.0
    c1 = (cpu_w + cpu_kv) / cpu_bandwidth
    slots = kv.n_seq
    step_all = (gpu_w + slots * gpu_kv) / gpu_bandwidth + (cpu_w + slots * cpu_kv) / cpu_bandwidth \
        if gpu_bandwidth else (cpu_w + slots * cpu_kv) / cpu_bandwidth
    one = g1 + c1
    bound = "CPU memory bandwidth" if c1 > g1 else "GPU memory bandwidth"
    prefill = 0.0
    if gpu_flops:
        t = n_ubatch
        seconds = 2 * parameter_counts(model)[1] * t / gpu_flops + gpu_w / (gpu_bandwidth or 1)
        if cpu_w and pcie_bandwidth:
            seconds += cpu_w / pcie_bandwidth  # CPU-resident weights copied to the GPU once per micro-batch
        prefill = t / seconds
    return Speed(1 / one if one else 0.0, slots / step_all if step_all else 0.0, g1 * 1e3, c1 * 1e3, prefill,
                 gpu_bandwidth, cpu_bandwidth, pcie_bandwidth, bound)


# ---------------------------------------------------------------- the plan

@dataclass(frozen=True)
class LlamaCppPlan:
    model_id: str
    quantization: str
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    n_ctx: int                 # the -c value (all slots together)
    n_parallel: int            # -np
    split: Split
    weights_file_gib: float
    speed: Speed | None
    gpu_free_bytes: int
    margin_bytes: int
    cpu_ram_bytes: int         # what stays in host RAM: CPU weights (mmap), CPU KV, CPU compute buffer
    fits_on_gpu: bool          # every layer on the GPU
    notes: tuple[str, ...] = ()
    alternatives: tuple[dict, ...] = field(default=(), compare=False)
    model_file: str = ""

    def command(self) -> str:
        model = self.model_file or f"{self.model_id.split('/')[-1]}-{self.quantization}.gguf"
        parts = ["llama-server", "-m", model, "-ngl", str(self.split.n_gpu_layers), "-c", str(self.n_ctx),
                 "-np", str(self.n_parallel)]
        if self.split.n_cpu_moe:
            parts += ["--n-cpu-moe", str(self.split.n_cpu_moe)]
        if self.cache_type_k != "f16":
            parts += ["--cache-type-k", self.cache_type_k]
        if self.cache_type_v != "f16":
            parts += ["--cache-type-v", self.cache_type_v]
        parts += ["-fa", "on" if self.flash_attn else "off"]
        return " ".join(parts)

    @property
    def verdict(self) -> str:
        if self.speed is None:
            return "no speed estimate (GPU bandwidth unknown)"
        spt = self.speed.seconds_per_token
        if spt >= UNUSABLE_SECONDS_PER_TOKEN:
            return (f"{spt:.1f} s per token at best: the CPU part ({self.split.cpu_weights_bytes / GiB:.1f} GiB read "
                    f"per token at {self.speed.cpu_bandwidth_bytes_per_s / 1e9:.0f} GB/s) rules out interactive use")
        return f"at most {self.speed.decode_tokens_per_s:.1f} tokens/s per request ({self.speed.bound})"

    def summary(self) -> str:
        moe = f" --n-cpu-moe {self.split.n_cpu_moe}" if self.split.n_cpu_moe else ""
        where = "fully on the GPU" if self.fits_on_gpu else \
            f"-ngl {self.split.n_gpu_layers} of {self.split.n_layer + 1}{moe}, {self.cpu_ram_bytes / GiB:.1f} GiB in host RAM"
        return (f"GGUF {self.quantization} ({self.weights_file_gib:.1f} GiB), {where}, KV {self.cache_type_k}/"
                f"{self.cache_type_v}, -c {self.n_ctx} -np {self.n_parallel}: {self.verdict}")

    def to_dict(self) -> dict:
        return {"engine": "llama.cpp", "model": self.model_id, "quantization": self.quantization,
                "gguf_file_gib": round(self.weights_file_gib, 3), "n_gpu_layers": self.split.n_gpu_layers,
                "n_ctx": self.n_ctx, "n_parallel": self.n_parallel, "cache_type_k": self.cache_type_k,
                "cache_type_v": self.cache_type_v, "flash_attn": self.flash_attn, "fits_on_gpu": self.fits_on_gpu,
                "gpu_free_gib": _g(self.gpu_free_bytes), "margin_gib": _g(self.margin_bytes),
                "cpu_ram_gib": _g(self.cpu_ram_bytes), "split": self.split.to_dict(),
                "speed": self.speed.to_dict() if self.speed else None, "verdict": self.verdict,
                "command": self.command(), "notes": list(self.notes), "alternatives": list(self.alternatives)}


def plan_config(model: ModelSpec, gpu_free_bytes: int, *, quantization: str, n_ctx_per_slot: int,
                n_parallel: int = 1, cache_type: str = "f16", flash_attn: bool | None = None,
                margin_bytes: int = DEFAULT_MARGIN_BYTES, gpu_bandwidth: float = 0.0,
                cpu_bandwidth: float = DEFAULT_CPU_BANDWIDTH, gpu_flops: float = 0.0, pcie_bandwidth: float = 0.0,
                n_ubatch: int = DEFAULT_UBATCH, weights: Weights | None = None) -> LlamaCppPlan:
    """One configuration: the largest -ngl for this quantization, KV type and context, with its speed.
    `weights`: a GGUF file's own tensors (gguf_file.read_gguf) instead of the model converted at `quantization`."""
    if n_parallel < 1 or n_ctx_per_slot < 1:
        raise UsageError("the context per slot and the number of slots (-np) must be positive")
    if flash_attn is None:
        flash_attn = cache_type != "f16"  # a quantized V cache needs flash attention (llama-context.cpp)
    if cache_type != "f16" and not flash_attn:
        raise UsageError(f"--cache-type-v {cache_type} needs flash attention (-fa on) in llama.cpp")
    weights = weights or gguf_weights(model, quantization)
    per_slot = _pad(n_ctx_per_slot)
    kv = kv_cache(model, per_slot * n_parallel, n_parallel, cache_type, cache_type, n_ubatch)
    split = max_gpu_layers(model, weights, kv, gpu_free_bytes, flash_attn=flash_attn, margin_bytes=margin_bytes,
                           n_ubatch=n_ubatch)
    speed_kw = dict(context_tokens=per_slot, gpu_bandwidth=gpu_bandwidth, cpu_bandwidth=cpu_bandwidth,
                    gpu_flops=gpu_flops, pcie_bandwidth=pcie_bandwidth, n_ubatch=n_ubatch)
    spd = speed(model, weights, kv, split, **speed_kw) if gpu_bandwidth else None
    if not split.full_offload:
        moe = min_cpu_moe(model, weights, kv, gpu_free_bytes, flash_attn=flash_attn, margin_bytes=margin_bytes,
                          n_ubatch=n_ubatch)
        if moe is not None:  # experts on the CPU beat whole layers there: decode reads only the top-k of them
            moe_speed = speed(model, weights, kv, moe, **speed_kw) if gpu_bandwidth else None
            if moe_speed is None or spd is None or moe_speed.decode_tokens_per_s >= spd.decode_tokens_per_s:
                split, spd = moe, moe_speed
    notes = []
    if model.moe:
        notes.append("MoE: decode reads only the routed experts in use (top-k of the experts per layer); when the "
                     "model does not fit, --n-cpu-moe (experts of the first layers in host RAM, everything else on "
                     "the GPU) is weighed against whole layers on the CPU, the faster wins")
    if model.vision is not None:
        notes.append("text decoder only: the vision tower (an mmproj GGUF in llama.cpp) is not counted")
    return LlamaCppPlan(model.model_id, quantization, cache_type, cache_type, flash_attn, kv.n_ctx, n_parallel, split,
                        weights.file_bytes / GiB, spd, gpu_free_bytes, margin_bytes, split.cpu_bytes,
                        split.full_offload, tuple(notes))


def plan(model: ModelSpec, gpu_free_bytes: int, *, n_ctx_per_slot: int, n_parallel: int = 1,
         quantization: str | None = None, cache_type: str | None = None, margin_bytes: int = DEFAULT_MARGIN_BYTES,
         gpu_bandwidth: float = 0.0, cpu_bandwidth: float = DEFAULT_CPU_BANDWIDTH, gpu_flops: float = 0.0,
         pcie_bandwidth: float = 0.0, floor: str = "Q4_K_M", weights: Weights | None = None) -> LlamaCppPlan:
    """Pick a GGUF quantization and KV type: the best quality (down to `floor`) that puts every layer on the
    GPU, with the f16 KV cache before q8_0 before q4_0; if none does, `floor` with a q8_0 cache and as many
    layers on the GPU as fit. Every other combination is listed in `alternatives` with its -ngl and speed.
    `weights`: a GGUF file's own tensors; only the KV type is chosen then."""
    kw = dict(n_ctx_per_slot=n_ctx_per_slot, n_parallel=n_parallel, margin_bytes=margin_bytes,
              gpu_bandwidth=gpu_bandwidth, cpu_bandwidth=cpu_bandwidth, gpu_flops=gpu_flops,
              pcie_bandwidth=pcie_bandwidth, weights=weights)
    quants = (weights.ftype,) if weights else (quantization,) if quantization else QUALITY_LADDER
    caches = (cache_type,) if cache_type else KV_TYPES
    if floor not in quants:
        floor = quants[-1]
    tried = [plan_config(model, gpu_free_bytes, quantization=q, cache_type=c, **kw) for q in quants for c in caches]
    stop = quants.index(floor)
    chosen = next((p for p in tried if p.fits_on_gpu and quants.index(p.quantization) <= stop), None)
    if chosen is None:
        fallback_cache = "q8_0" if "q8_0" in caches else caches[0]
        chosen = next(p for p in tried if p.quantization == floor and p.cache_type_k == fallback_cache)
    alternatives = tuple({"quantization": p.quantization, "cache_type": p.cache_type_k,
                          "n_gpu_layers": p.split.n_gpu_layers, "fits_on_gpu": p.fits_on_gpu,
                          "gguf_file_gib": round(p.weights_file_gib, 2), "cpu_ram_gib": _g(p.cpu_ram_bytes),
                          "decode_tokens_per_s": round(p.speed.decode_tokens_per_s, 2) if p.speed else None}
                         for p in tried if p is not chosen)
    return replace(chosen, alternatives=alternatives)


def plan_for_workload(model: ModelSpec, gpu, workload, free_memory_bytes: int | None = None,
                      cpu_bandwidth: float = DEFAULT_CPU_BANDWIDTH) -> LlamaCppPlan | None:
    """The planner hook `oomguard plan` calls when nothing fits in vLLM: one GPU, the workload's p99 context
    per slot and its peak concurrency as slots. None when llama.cpp cannot run the model's architecture here."""
    free = free_memory_bytes if free_memory_bytes is not None else gpu.total_memory_bytes
    return plan(model, free, n_ctx_per_slot=workload.p99_tokens, n_parallel=workload.peak_concurrency,
                gpu_bandwidth=gpu.memory_bandwidth_bytes_per_s, cpu_bandwidth=cpu_bandwidth,
                gpu_flops=gpu.bf16_dense_flops, pcie_bandwidth=gpu.pcie_bandwidth_bytes_per_s)
