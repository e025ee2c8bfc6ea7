"""What each request asks for: prompt and output lengths, or prompts read from a file.

Sources (`--dataset`):
  random              synthetic prompts; `--prompt-tokens N` or `A:B` (uniform), `--output-tokens` likewise
  peak                every request at the stated p99: `--prompt-tokens` + `--output-tokens` (the longest
                      requests you serve, all at once: the load that fills the KV cache); without them,
                      prompt + output fill the server's max_model_len
  jsonl:PATH          one JSON object a line: {"prompt": "...", "max_tokens": N} (or "messages": [...])
  sharegpt:PATH       a ShareGPT file: [{"conversations": [{"from": "human", "value": ...},
                      {"from": "gpt", "value": ...}]}]; the first human turn is the prompt and the reply's
                      length (about 4 characters a token) its max_tokens, as `vllm bench serve` does

Synthetic prompts are common English words that are one token each in most vocabularies, scaled by the
server's own tokenizer when it exposes `/tokenize` (vLLM and llama.cpp do), and each starts with a unique
number so that prefix caching cannot share their KV blocks.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from typing import Protocol

from oomguard.errors import UsageError

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their can has more when will would if no what so said who about "
    "up out them some could into him time then only other its new two like than first been any these may "
    "people my over me also after most made did many before must through back years where much your way "
    "well down should because each just those how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three"
).split()


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request: a prompt (or chat messages) and its output budget."""

    prompt: str
    max_tokens: int
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) when the source has a conversation
    prompt_tokens: int | None = None  # the intended prompt length, when synthetic


class Workload(Protocol):
    name: str

    def next(self) -> RequestSpec: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Lengths:
    """A fixed length or a uniform range [low, high]."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str | int, what: str) -> "Lengths":
        s = str(text).strip()
        m = re.fullmatch(r"(\d+)(?:\s*:\s*(\d+))?", s)
        if not m:
            raise UsageError(f"{what} must be N or LOW:HIGH (uniform), e.g. 512 or 128:2048, not {s!r}")
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) else low
        if low < 1 or high < low:
            raise UsageError(f"{what} {s!r}: need 1 <= LOW <= HIGH")
        return cls(low, high)

    def draw(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high} (uniform)"


class PromptMaker:
    """Builds prompts of about N tokens from one-token words; `tokens_per_word` is calibrated on the server."""

    def __init__(self, seed: int = 0, tokens_per_word: float = 1.0, head_tokens: int = 8):
        self.rng = random.Random(seed)
        self.head_tokens = head_tokens
        words = list(_WORDS)
        self.rng.shuffle(words)
        self._text = " ".join(words * 64)  # about 12,000 words to slice from
        self._starts = [0] + [i + 1 for i, c in enumerate(self._text) if c == " "]
        self.tokens_per_word = tokens_per_word
        self._serial = 0

    def sample_text(self, n_words: int) -> str:
        return self._slice(0, n_words)

    def _slice(self, first_word: int, n_words: int) -> str:
        starts, n = self._starts, len(self._starts)
        parts = []
        while n_words > 0:
            take = min(n_words, n - first_word)
            end = starts[first_word + take] - 1 if first_word + take < n else len(self._text)
            parts.append(self._text[starts[first_word]:end])
            n_words -= take
            first_word = 0
        return " ".join(parts)

    def head(self) -> str:
        return f"{self._serial}-{self.rng.randrange(1 << 30):x}"

    def make(self, n_tokens: int) -> str:
        self._serial += 1
        # a unique head defeats prefix caching: every request's KV blocks are its own
        head = self.head()
        n_words = max(1, round((n_tokens - self.head_tokens) / self.tokens_per_word))
        return head + " " + self._slice(self.rng.randrange(len(self._starts)), n_words)


class SyntheticWorkload:
    def __init__(self, prompt: Lengths, output: Lengths, *, seed: int = 0, name: str = "random",
                 tokens_per_word: float = 1.0):
        self.name = name
        self.prompt = prompt
        self.output = output
        self.rng = random.Random(seed + 1)
        self.maker = PromptMaker(seed, tokens_per_word)

    def next(self) -> RequestSpec:
        n = self.prompt.draw(self.rng)
        return RequestSpec(prompt=self.maker.make(n), max_tokens=self.output.draw(self.rng), prompt_tokens=n)

    def describe(self) -> str:
        label = "peak prompt (p99)" if self.name == "peak" else "random"
        return f"{label}: prompt {self.prompt} tokens, output {self.output} tokens"


class FileWorkload:
    """Requests read from a file, replayed in order and cycled when the run outlasts the file."""

    def __init__(self, name: str, path: str, specs: list[RequestSpec], max_output_tokens: int | None = None):
        self.name = name
        self.path = path
        self.specs = specs
        self.max_output_tokens = max_output_tokens
        self._i = 0

    def next(self) -> RequestSpec:
        spec = self.specs[self._i % len(self.specs)]
        self._i += 1
        return spec

    def describe(self) -> str:
        return f"{self.name} file {self.path} ({len(self.specs)} requests, cycled)"


def _read_text(path: str) -> str:
    if not os.path.exists(path):
        raise UsageError(f"dataset file not found: {path}")
    if os.path.isdir(path):
        raise UsageError(f"dataset path is a directory, not a file: {path}")
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except UnicodeDecodeError as exc:
        raise UsageError(f"dataset file {path} is not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read dataset file {path}: {exc.strerror or exc}") from None


def load_jsonl(path: str, default_max_tokens: int | None) -> FileWorkload:
    specs: list[RequestSpec] = []
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{lineno}: not JSON ({exc.msg}); expected one object a line like "
                             '{"prompt": "...", "max_tokens": 128}') from None
        if not isinstance(obj, dict):
            raise UsageError(f"{path}:{lineno}: expected an object like {{\"prompt\": ..., \"max_tokens\": ...}}")
        messages = None
        if isinstance(obj.get("messages"), list):
            try:
                messages = tuple((str(m["role"]), str(m["content"])) for m in obj["messages"])
            except (KeyError, TypeError):
                raise UsageError(f"{path}:{lineno}: messages must be [{{\"role\": ..., \"content\": ...}}]") from None
            prompt = "\n".join(c for _, c in messages)
        elif isinstance(obj.get("prompt"), str):
            prompt = obj["prompt"]
        else:
            raise UsageError(f"{path}:{lineno}: needs a string \"prompt\" (or a \"messages\" list)")
        max_tokens = obj.get("max_tokens", default_max_tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise UsageError(f"{path}:{lineno}: \"max_tokens\" must be a positive integer"
                             + ("" if default_max_tokens else " (or give --output-tokens for lines without one)"))
        specs.append(RequestSpec(prompt=prompt, max_tokens=max_tokens, messages=messages))
    if not specs:
        raise UsageError(f"dataset file {path} has no requests")
    return FileWorkload("jsonl", path, specs)


def load_sharegpt(path: str, max_output_tokens: int | None) -> FileWorkload:
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:  # some ShareGPT dumps are JSON lines
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not a ShareGPT JSON file ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, list):
        raise UsageError(f"{path}: a ShareGPT file is a JSON list of {{\"conversations\": [...]}}")
    specs: list[RequestSpec] = []
    for entry in data:
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        try:
            first, reply = conv[0], conv[1]
            if first.get("from") not in ("human", "user") or not isinstance(first.get("value"), str):
                continue
            prompt, answer = first["value"], str(reply.get("value", ""))
        except AttributeError:
            continue
        if not prompt.strip():
            continue
        out = max(1, round(len(answer) / 4))  # about 4 characters a token, as a tokenizer-free estimate
        if max_output_tokens:
            out = min(out, max_output_tokens)
        specs.append(RequestSpec(prompt=prompt, max_tokens=out, messages=(("user", prompt),)))
    if not specs:
        raise UsageError(f"{path}: no usable ShareGPT conversations (need a human turn then a reply)")
    return FileWorkload("sharegpt", path, specs, max_output_tokens)


def parse_dataset(text: str) -> tuple[str, str | None]:
    """'random' | 'peak' | 'jsonl:PATH' | 'sharegpt:PATH' -> (kind, path)."""
    kind, _, path = text.partition(":")
    if kind in ("random", "peak") and not path:
        return kind, None
    if kind in ("jsonl", "sharegpt") and path:
        return kind, path
    raise UsageError(f"--dataset must be random, peak, jsonl:PATH or sharegpt:PATH, not {text!r}")
