"""llama.cpp's fixes for the failures its own messages name, in llama-server's flag spellings.

Where llama.cpp's message is the evidence, these replace vLLM's fixes (engines/vllm/fixes.py) for the class.
"""

from __future__ import annotations

from oomguard.failures import FailureClass, Fix, Hits


def build(cls: FailureClass, n: dict, facts: dict, hits: Hits | None, why: str = "") -> tuple[str, list[Fix]] | None:
    """The cause and fixes for a finding llama.cpp's messages support; None where vLLM's builder applies."""
    cause = hits.best.describe(n) if hits and hits.best else ""
    if cls == FailureClass.KV_CACHE_TOO_SMALL:
        return cause or "The KV cache does not fit.", [
            Fix("the KV cache grows with the context", action="lower -c (--ctx-size)"),
            Fix("a quantized KV cache halves it", "--cache-type-k", "q8_0"),
            Fix("and the V half (needs flash attention, -fa)", "--cache-type-v", "q8_0")]
    if cls == FailureClass.OOM_WEIGHTS_LOAD:
        return cause or "The model's layers do not fit on the GPU.", [
            Fix("fewer layers on the GPU; the rest run on the CPU", action="lower -ngl (--n-gpu-layers)"),
            Fix("a smaller quantization (e.g. Q4_K_M) shrinks the weights", action="use a smaller GGUF")]
    if cls == FailureClass.OOM_PROFILING_OR_GRAPH:
        return cause or "llama.cpp's compute buffers do not fit.", [
            Fix("compute buffers scale with the micro-batch", "-ub", 256), Fix("and the logical batch", "-b", 512)]
    return None
