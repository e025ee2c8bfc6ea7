"""vLLM's OpenAI-server errors for a request longer than max_model_len, per version, and the error body shapes.

Texts from shared/research/vllm-memory-model.md section 5 (vllm/entrypoints/openai/serving_engine.py,
entrypoints/openai/engine/serving.py, renderers/params.py). Body: <= 0.9.x
`{"object": "error", "message", "type", "param", "code"}`; >= 0.10 `{"error": {"message", "type", "param", "code"}}`.

`check_context(version, max_model_len, prompt_tokens, max_tokens)` returns (error text or None, max_tokens to
use): vLLM rejects prompt + max_tokens > max_model_len up to 0.30 and clamps max_tokens from 0.31 on (0.33's
behaviour; 0.31-0.32 were not read and are assumed to match 0.33). A missing max_tokens becomes
`max_model_len - prompt_tokens`, as vLLM's get_max_tokens does.
"""

from __future__ import annotations

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import Version


def error_body(version: Version, message: str, status: int = 400, err_type: str = "BadRequestError",
               param: str | None = None) -> dict:
    if release(version).openai_error_envelope:
        return {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return {"object": "error", "message": message, "type": err_type, "param": param, "code": status}


def check_context(version: Version, max_model_len: int, n: int, m: int | None) -> tuple[str | None, int]:
    """(vLLM's 400 text or None, effective max_tokens) for n prompt tokens and requested max_tokens m."""
    L = max_model_len
    era = release(version).context_error_era
    if era == 0:
        if m is None:
            if n >= L:
                return (f"This model's maximum context length is {L} tokens. However, you requested {n} tokens in "
                        "the messages, Please reduce the length of the messages."), 0
            return None, L - n
        if n + m > L:
            return (f"This model's maximum context length is {L} tokens. However, you requested {n + m} tokens "
                    f"({n} in the messages, {m} in the completion). Please reduce the length of the messages or "
                    "completion."), 0
        return None, m
    if era == 1:
        if n >= L:
            return (f"This model's maximum context length is {L} tokens. However, your request has {n} input "
                    "tokens. Please reduce the length of the input messages."), 0
        if m is None:
            return None, L - n
        if n + m > L:
            return (f"'max_tokens' or 'max_completion_tokens' is too large: {m}. This model's maximum context "
                    f"length is {L} tokens and your request has {n} input tokens ({m} > {L} - {n})."), 0
        return None, m
    if era == 2:
        requested = m or 0
        if n + requested > L or n >= L:
            return (f"This model's maximum context length is {L} tokens. However, you requested {requested} output "
                    f"tokens and your prompt contains {n} input tokens, for a total of {n + requested} tokens. "
                    "Please reduce the length of the input prompt or the number of requested output tokens."), 0
        return None, L - n if m is None else m
    if n > L:
        return (f"This model's maximum context length is {L} tokens. However, your prompt contains {n} input "
                "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the "
                "input prompt."), 0
    if n == L:
        return (f"The decoder prompt (length {n}) plus the number of requested output tokens (at least 1) is longer "
                f"than the maximum model length of {L}. Make sure that `max_model_len` is no smaller than the number "
                "of text tokens plus the number of requested output tokens."), 0
    return None, min(L - n, m) if m is not None else L - n
