"""Prompt-length checks before a request reaches the engine.

Tokens are counted with the model's own tokenizer when the `tokenizers` package is installed and a
`tokenizer.json` is found (`--tokenizer`, or the local Hugging Face cache for the served model id); else a
bytes-based lower bound is used: at least one token per `BYTES_PER_TOKEN_MAX` UTF-8 bytes of prompt text.
Either way the count is a lower bound (chat templates add tokens we do not count), so the proxy rejects only
requests the engine would reject too, and lets the engine judge the rest exactly.

The 400 wording is vLLM's (0.18-0.30 `renderers/params.py`, with "at least" when the count is a bound), in
vLLM's >= 0.10 error body `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("oomguard.proxy")

# Natural-language and code text averages 3-5 bytes per token in the usual BPE/SentencePiece vocabularies;
# 8 bytes per token is a bound no ordinary prompt exceeds on average, so a count from it undercounts.
BYTES_PER_TOKEN_MAX = 8


class TokenCounter:
    """Counts prompt tokens: `exact` is True when a real tokenizer is in use."""

    def __init__(self, encode: Callable[[str], int] | None = None, source: str = "bytes",
                 bytes_per_token: int = BYTES_PER_TOKEN_MAX) -> None:
        self._encode = encode
        self.exact = encode is not None  # (an attribute, not a property: read for every request)
        self.source = source
        self.bytes_per_token = bytes_per_token

    def count_text(self, text: str) -> int:
        if self._encode is not None:
            return self._encode(text)
        return math.ceil(len(text.encode("utf-8", "surrogatepass")) / self.bytes_per_token)

    def count_prompt(self, body: dict[str, Any], path: str) -> int | None:
        """Prompt tokens of an OpenAI request body (a lower bound), or None if the shape is not known."""
        if path.endswith("/chat/completions"):
            messages = body.get("messages")
            if not isinstance(messages, list):
                return None
            return sum(self.count_text(t) for t in _message_texts(messages))
        if path.endswith("/completions"):
            return _count_prompt_field(body.get("prompt"), self.count_text)
        if path.endswith("/embeddings"):
            return _count_prompt_field(body.get("input"), self.count_text)
        return None

    def describe(self) -> str:
        if self.exact:
            return f"prompt tokens counted with the model's tokenizer ({self.source})"
        return (f"no tokenizer available ({self.source}): prompt tokens bounded from below at one per "
                f"{self.bytes_per_token} UTF-8 bytes; only requests over the limit by that bound are rejected "
                f"here, the engine checks the rest exactly")


def _count_prompt_field(prompt: Any, count: Callable[[str], int]) -> int | None:
    """`prompt`/`input`: a string, a list of strings, a list of token ids, or a list of such lists.
    For a batch, the longest element is what must fit."""
    if isinstance(prompt, str):
        return count(prompt)
    if isinstance(prompt, list):
        if not prompt:
            return 0
        if all(isinstance(x, int) for x in prompt):
            return len(prompt)
        counts = [_count_prompt_field(x, count) for x in prompt]
        known = [c for c in counts if c is not None]
        return max(known) if known else None
    return None


def _message_texts(messages: list[Any]) -> list[str]:
    out = []
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    out.append(part["text"])
    return out


def load_counter(tokenizer: str | None, model_ids: list[str] | tuple[str, ...] = ()) -> TokenCounter:
    """A TokenCounter with the model's tokenizer if possible, else the bytes bound (the log says which)."""
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found]
    except ImportError:
        counter = TokenCounter(source="the `tokenizers` package is not installed")
        log.info("%s", counter.describe())
        return counter
    candidates: list[Path] = []
    if tokenizer:
        p = Path(tokenizer).expanduser()
        candidates.append(p / "tokenizer.json" if p.is_dir() else p)
    for model in model_ids:
        candidates.extend(_hf_cache_tokenizers(model))
    for path in candidates:
        if path.is_file():
            try:
                tok = Tokenizer.from_file(str(path))
            except Exception as exc:  # a corrupt or foreign file: say so and go on
                log.warning("could not load tokenizer %s: %s", path, exc)
                continue
            counter = TokenCounter(lambda text: len(tok.encode(text, add_special_tokens=False).ids),
                                   source=str(path))
            log.info("%s", counter.describe())
            return counter
    counter = TokenCounter(source="no tokenizer.json found" + (f" at {tokenizer}" if tokenizer else ""))
    log.info("%s", counter.describe())
    return counter


def _hf_cache_tokenizers(model: str) -> list[Path]:
    """tokenizer.json files of `model` in the local Hugging Face hub cache (never downloads)."""
    if "/" not in model:
        return []
    root = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface"))
                / "hub").expanduser()
    snapshots = root / ("models--" + model.replace("/", "--")) / "snapshots"
    try:
        return sorted(snapshots.glob("*/tokenizer.json"))
    except OSError:
        return []


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def context_error(n_prompt: int, max_tokens: int | None, max_model_len: int, exact: bool,
                  embeddings: bool = False) -> str | None:
    """vLLM's message if `n_prompt` (+ `max_tokens`) cannot fit in `max_model_len`, else None."""
    q = "" if exact else "at least "
    if embeddings:
        if n_prompt > max_model_len:
            return (f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                    f"{q}{n_prompt} tokens in the input for embedding generation. Please reduce the length "
                    f"of the input.")
        return None
    m = max_tokens or 0
    if n_prompt + m > max_model_len or (m == 0 and n_prompt >= max_model_len):
        return (f"This model's maximum context length is {max_model_len} tokens. However, you requested {m} "
                f"output tokens and your prompt contains {q}{n_prompt} input tokens, for a total of "
                f"{q}{n_prompt + m} tokens. Please reduce the length of the input prompt or the number of "
                f"requested output tokens.")
    return None


class PromptRatio:
    """Prompt tokens per lower-bound unit (one token per BYTES_PER_TOKEN_MAX bytes), learnt from the engines'
    own `usage.prompt_tokens`: admission needs a central estimate where the rejection rule needs a lower bound.
    Starts at about 4 bytes a token (English text); a moving average of what the engines report after that."""

    def __init__(self, start: float = 2.0, weight: float = 0.2) -> None:
        self.ratio, self.weight = start, weight

    def estimate(self, lower_bound: int) -> int:
        return math.ceil(lower_bound * self.ratio)

    def observe(self, lower_bound: int, actual: int) -> None:
        if lower_bound > 0 and actual > 0:
            seen = min(float(BYTES_PER_TOKEN_MAX), max(1.0, actual / lower_bound))
            self.ratio += self.weight * (seen - self.ratio)

