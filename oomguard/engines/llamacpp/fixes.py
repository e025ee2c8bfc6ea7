"""llama.cpp's fixes for the failures its own messages name, in llama-server's flag spellings, with numbers from
what the log showed: the model buffer of the offloaded layers (`CUDA0 model buffer size`), the layers offloaded
(`offloaded N/M layers to GPU`), the KV and compute buffers, the GPU's memory.

Where llama.cpp's message is the evidence, these replace vLLM's fixes (engines/vllm/fixes.py) for the class.
"""

from __future__ import annotations

import math

from oomguard.failures import FailureClass, Fix, Hits

MARGIN_GIB = 1.0   # what llama-fit-params keeps free per device by default (common/common.h fit_params_target)


def _layers_that_fit(facts: dict) -> tuple[int, float] | None:
    """(layers, GiB a layer) that fit on the GPU beside the KV and compute buffers, from the log's own figures."""
    weights, offloaded = facts.get("weights_gib"), facts.get("gpu_layers_offloaded")
    if not weights or not offloaded:
        return None
    per_layer = weights / offloaded
    total = facts.get("total_gpu_memory_gib")
    if not total:   # the GPU's size unknown: a quarter fewer layers is the first step
        return max(0, math.floor(offloaded * 0.75)), per_layer
    room = total - MARGIN_GIB - (facts.get("kv_cache_gib") or 0) - (facts.get("compute_buffer_gib") or 0)
    return max(0, min(offloaded - 1, math.floor(room / per_layer))), per_layer


def build(cls: FailureClass, n: dict, facts: dict, hits: Hits | None, why: str = "") -> tuple[str, list[Fix]] | None:
    """The cause and fixes for a finding llama.cpp's messages support; None where vLLM's builder applies."""
    cause = hits.best.describe(n) if hits and hits.best else ""
    if cls == FailureClass.KV_CACHE_TOO_SMALL:
        n_ctx, kv = facts.get("n_ctx"), facts.get("kv_cache_gib")
        fixes = [Fix(f"the KV cache grows with the context ({kv} GiB at -c {n_ctx})" if kv and n_ctx else
                     "the KV cache grows with the context", "-c", max(256, int(n_ctx) // 2 // 256 * 256))
                 if n_ctx else Fix("the KV cache grows with the context", action="lower -c (--ctx-size)")]
        return cause or "The KV cache does not fit.", fixes + [
            Fix("a quantized KV cache halves it", "--cache-type-k", "q8_0"),
            Fix("and the V half (needs flash attention, -fa on)", "--cache-type-v", "q8_0")]
    if cls == FailureClass.OOM_WEIGHTS_LOAD:
        fit = _layers_that_fit(facts)
        ngl = (Fix(f"{facts['gpu_layers_offloaded']} layers of {fit[1]:.2f} GiB did not fit"
                   + (f" beside the KV and compute buffers on a {facts['total_gpu_memory_gib']} GiB GPU"
                      if facts.get("total_gpu_memory_gib") else "") + "; the rest run on the CPU", "-ngl", fit[0])
               if fit else Fix("fewer layers on the GPU; the rest run on the CPU", action="lower -ngl (--n-gpu-layers)"))
        return cause or "The model's layers do not fit on the GPU.", [
            ngl, Fix("a smaller quantization (e.g. Q4_K_M) shrinks every layer", action="use a smaller GGUF")]
    if cls == FailureClass.OOM_PROFILING_OR_GRAPH:
        compute = facts.get("compute_buffer_gib")
        return cause or "llama.cpp's compute buffers do not fit.", [
            Fix("compute buffers scale with the micro-batch" + (f" ({compute} GiB now)" if compute else ""), "-ub", 256),
            Fix("and the logical batch", "-b", 512)]
    return None
