"""TGI's fixes for the failures its own messages name, in TGI's flag spellings (launcher/src/main.rs Args).

TGI's warm-up runs a prefill of --max-batch-prefill-tokens tokens at start and sizes the KV cache from what is left,
so the activation peak is set by that flag; the request limits are --max-input-tokens and --max-total-tokens
(--max-input-length in releases before 2.0).
"""

from __future__ import annotations

from oomguard.failures import FailureClass, Fix, Hits


def build(cls: FailureClass, n: dict, facts: dict, hits: Hits | None, why: str = "") -> tuple[str, list[Fix]]:
    if hits and hits.best:
        cause = hits.best.describe(n)
    elif cls.startswith("oom_"):   # an allocator's error placed by TGI's launcher lines
        cause = f"A TGI shard ran out of GPU memory; {why or 'the log does not show where'}."
    else:
        cause = f"TGI failed ({cls.words})."
    prefill = n.get("prefill_tokens")
    half = max(int(prefill) // 2, 256) if isinstance(prefill, (int, float)) and prefill > 256 else 2048
    fixes = {
        FailureClass.OOM_PROFILING_OR_GRAPH: [
            Fix("the warm-up prefill must fit beside the weights", "--max-batch-prefill-tokens", half),
            Fix("a shorter request limit lowers what the warm-up must hold",
                action="lower --max-input-tokens and --max-total-tokens"),
            Fix("more shards split the weights", action="raise --num-shard, or --quantize the model")],
        FailureClass.OOM_WEIGHTS_LOAD: [
            Fix("one GPU does not hold the weights", action="raise --num-shard to split them over more GPUs"),
            Fix("a quantized model needs less memory", action="--quantize (bitsandbytes, awq, gptq, eetq ...)")],
        FailureClass.CONTEXT_TOO_LONG: [
            Fix("the prompt plus max_new_tokens must fit the server's limits",
                action="shorten the prompt or lower max_new_tokens"),
            Fix("the server's limits are launcher flags",
                action="raise --max-input-tokens and --max-total-tokens (within the model's context)")],
        FailureClass.KV_CACHE_TOO_SMALL: [
            Fix("the KV cache left after the warm-up must hold one full request",
                action="lower --max-total-tokens, or raise --num-shard")],
        FailureClass.TP_MISCONFIG: [
            Fix("the attention heads must split evenly", action="pick a --num-shard that divides the head count")],
    }.get(cls, [Fix("TGI's message names the cause", action="read the shard's error above it in the launcher log")])
    return cause, fixes
