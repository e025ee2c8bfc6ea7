"""SGLang's fixes for the failures its own messages name, in SGLang's flag spellings (sglang/srt/server_args.py).

SGLang sizes its KV pool from --mem-fraction-static (the share of GPU memory for weights and the KV pool); the
activations and CUDA graphs live in the rest, so the two memory failures move that one knob in opposite ways.
"""

from __future__ import annotations

from oomguard.failures import FailureClass, Fix, Hits

_MEMORY_STATIC = "--mem-fraction-static"


def build(cls: FailureClass, n: dict, facts: dict, hits: Hits | None, why: str = "") -> tuple[str, list[Fix]]:
    cause = hits.best.describe(n) if hits and hits.best else f"SGLang failed ({cls.words})."
    fixes = {
        FailureClass.NO_CACHE_BLOCKS: [
            Fix("a larger share for weights and KV pool leaves room for the cache", _MEMORY_STATIC, 0.9),
            Fix("more GPUs split the weights", action="raise --tp-size (or use a quantized checkpoint)")],
        FailureClass.KV_CACHE_TOO_SMALL: [
            Fix("a request must fit in the KV pool", action="lower --context-length, or raise --mem-fraction-static"),
            Fix("an fp8 KV cache holds twice the tokens", "--kv-cache-dtype", "fp8_e5m2")],
        FailureClass.OOM_PROFILING_OR_GRAPH: [
            Fix("CUDA graphs and activations live outside the static fraction", _MEMORY_STATIC, 0.8),
            Fix("fewer captured batch sizes need less graph memory", "--cuda-graph-max-bs", 32)],
        FailureClass.OOM_RUNTIME: [
            Fix("fewer requests at once need less KV and activation memory", "--max-running-requests", 32),
            Fix("a smaller prefill chunk lowers the activation peak", "--chunked-prefill-size", 4096)],
        FailureClass.GPU_MEMORY_IN_USE: [
            Fix("another process holds memory on some GPUs", action="nvidia-smi; stop it or pick free GPUs with "
                                                                   "CUDA_VISIBLE_DEVICES")],
        FailureClass.CONTEXT_TOO_LONG: [
            Fix("the prompt plus max_tokens must fit the context", action="shorten the prompt or lower max_tokens"),
            Fix("SGLang can keep only the tail of a long prompt", "--allow-auto-truncate", True)],
        FailureClass.CONNECTION: [
            Fix("another server (often a previous SGLang) holds the port", action="stop it or pass --port")],
    }.get(cls, [Fix("SGLang's message names the cause", action="read the error above it in the server log")])
    return cause, fixes
