"""The exact error texts vLLM prints when it refuses to start, per version.

Sources: vllm/v1/core/kv_cache_utils.py:check_enough_kv_cache_memory, vllm/worker/worker.py
(raise_if_cache_size_invalid, V0), vllm/v1/worker/utils.py:request_memory (>= 0.14) and
gpu_worker.init_device (0.9-0.13), vllm/config/model.py (dtype check, TP heads check).
"""

from __future__ import annotations

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import Version

_DOCS = " See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def _gib(n_bytes: float, version: Version) -> str:
    value = n_bytes / (1 << 30)
    return f"{round(value, 2)}" if release(version).gib_rounded else f"{value:.2f}"


def no_cache_memory(version: Version, engine: str) -> str:
    text = "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine"
    rel = release(version)
    if engine == "v1" and rel.cpu_backend_wording:
        return text + " (this flag also controls CPU memory reservation on the CPU backend, despite its name)." + _DOCS
    return text + "." + (_DOCS if engine == "v1" and rel.docs_link_in_errors else "")


def kv_too_small(version: Version, engine: str, max_model_len: int, needed: int, available: int,
                 estimated: int, v0_max_tokens: int) -> str:
    if engine == "v0":
        return (f"The model's max seq len ({max_model_len}) is larger than the maximum number of tokens that can be "
                f"stored in KV cache ({v0_max_tokens}). Try increasing `gpu_memory_utilization` or decreasing "
                "`max_model_len` when initializing the engine.")
    rel = release(version)
    need, avail = _gib(needed, version), _gib(available, version)
    models = "model's" if rel.cpu_backend_wording else "models's"
    head = (f"To serve at least one request with the {models} max seq len ({max_model_len}), ({need} GiB KV cache is "
            f"needed, which is larger than the available KV cache memory ({avail} GiB).")
    if rel.estimate_dropped:
        return head + (" Based on the available memory,  " if estimated > 0 else "  ") + \
            "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    estimate = f"Based on the available memory, the estimated maximum model length is {estimated}." if estimated else ""
    util = "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend)" \
        if rel.cpu_backend_wording else "`gpu_memory_utilization`"
    tail = f"Try increasing {util} or decreasing `max_model_len` when initializing the engine."
    if rel.gib_rounded:
        return f"{head} {estimate + ' ' if estimate else ''}{tail}{_DOCS}"
    return f"{head} {estimate} {tail}" + (_DOCS if rel.docs_link_in_errors else "")


def free_memory_too_low(version: Version, free: int, total: int, utilization: float, requested: float) -> str:
    device = "on device cuda:0 " if release(version).device_in_free_memory_error else "on device "
    return (f"Free memory {device}({_gib(free, version)}/{_gib(total, version)} GiB) on startup is less than desired "
            f"GPU memory utilization ({utilization}, {_gib(requested, version)} GiB). Decrease GPU memory "
            "utilization or reduce GPU memory used by other processes.")


def weights_oom(free_after_weights: float, total: int) -> str:
    return ("Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free memory for "
            "weights, increasing --tensor-parallel-size, or using --quantization. (original error: CUDA out of "
            f"memory; GPU 0 has a total capacity of {total / (1 << 30):.2f} GiB of which "
            f"{max(free_after_weights, 0) / (1 << 30):.2f} GiB is free)")


def sampler_warmup_oom(num_reqs: int) -> str:
    return (f"CUDA out of memory occurred when warming up sampler with {num_reqs} dummy requests. Please try lowering "
            "`max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")


def tp_heads(heads: int, tp: int) -> str:
    return f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."


def bf16_unsupported(gpu_name: str, cc: tuple[int, int]) -> str:
    return (f"Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your {gpu_name} GPU has "
            f"compute capability {cc[0]}.{cc[1]}. You can use float16 instead by explicitly setting the `dtype` "
            "flag in CLI, for example: --dtype=half.")


def quantization_unsupported(method: str, need: int, cc: tuple[int, int]) -> str:
    """config/vllm.py (config.py before 0.10) _get_quantization_config: the method's get_min_capability."""
    return (f"The quantization method {method} is not supported for the current GPU. Minimum capability: {need}. "
            f"Current capability: {cc[0] * 10 + cc[1]}.")


def no_kernel_image(gpu_name: str, cc: tuple[int, int], version: Version) -> str:
    """What stops the PyPI wheel on a GPU it has no kernels for: the CUDA runtime, at the first kernel launch (vLLM's
    own code does not check), then the nearest release whose wheel runs it."""
    from oomguard.engines.vllm.releases import nearest_cuda_release
    from oomguard.engines.vllm.versions import fmt
    head = (f"CUDA error: no kernel image is available for execution on the device (vLLM {fmt(version)}'s PyPI wheels, "
            f"built with CUDA {release(version).cuda_toolkit}, carry no kernels for compute capability "
            f"{cc[0]}.{cc[1]}: this {gpu_name}).")
    nearest = nearest_cuda_release(cc, version)
    if nearest is None:
        return head + (" No vLLM release's wheels do: it needs a source build with TORCH_CUDA_ARCH_LIST naming it "
                       "(on a PyTorch built for it), a community fork, or another engine.")
    pick, newer = nearest
    if newer:
        return head + f" vLLM {fmt(pick)} and newer run it: pick --vllm-version {fmt(pick)} or later."
    return head + (f" vLLM {pick[0]}.{pick[1]} (CUDA {release(pick).cuda_toolkit} wheels) and older run it: pick "
                   f"--vllm-version {pick[0]}.{pick[1]}.x or earlier.")


def max_len_above_derived(user: int, derived: int) -> str:
    return (f"User-specified max_model_len ({user}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived} or model_max_length=None in model's config.json). To allow "
            "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.")
