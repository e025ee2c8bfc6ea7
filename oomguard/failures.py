"""The failure vocabulary engines and diagnose share: the classes a failure falls in, and what a known message is.

Engines keep their own message tables (`oomguard/engines/<engine>/signatures.py`); diagnose reads any of them.
A signature is found by its `needle` (a short literal, matched case-insensitively, that may wrap over two log
lines), then `pattern` (a regex over the hit line and the next few lines, whitespace collapsed) pulls the
numbers out by named group. `weight` is how sure the text alone makes us of the class (0..1).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources
from typing import Protocol


class FailureClass(str, Enum):
    """Why a serving engine failed, as a user would fix it (../shared/data/README.md's classes)."""

    OOM_WEIGHTS_LOAD = "oom_weights_load"
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    NO_CACHE_BLOCKS = "no_cache_blocks"
    OOM_PROFILING_OR_GRAPH = "oom_profiling_or_graph"
    OOM_RUNTIME = "oom_runtime"
    GPU_MEMORY_IN_USE = "gpu_memory_in_use"
    TP_MISCONFIG = "tp_misconfig"
    CONTEXT_TOO_LONG = "context_too_long"
    TOKENIZER_CHAT_TEMPLATE = "tokenizer_chat_template"
    CONNECTION = "connection"
    DTYPE_CAPABILITY = "dtype_capability"
    QUANTIZATION_MISMATCH = "quantization_mismatch"
    NCCL = "nccl"
    MODEL_ACCESS = "model_access"
    ENGINE_BUG = "engine_bug"
    UNKNOWN = "unknown"

    __str__ = str.__str__   # prints and formats as its value, "oom_runtime"

    @property
    def words(self) -> str:
        return self.value.replace("_", " ")


# kinds: "error" classifies by itself; "oom" is an out-of-memory event classified by phase and numbers;
# "hint" is weak evidence (kept, ranked low); "bug" points at the engine itself.
KINDS = ("error", "oom", "hint", "bug")


@dataclass(frozen=True)
class Signature:
    id: str
    cls: FailureClass
    needle: str
    weight: float
    source: str
    pattern: str | None = None
    kind: str = "error"
    cause: str = ""
    engine: str = "any"
    require: bool = False   # the hit counts only if `pattern` matches (for needles too common on their own)
    regex: re.Pattern | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cls", FailureClass(self.cls))   # a class name not in the vocabulary fails here
        if self.kind not in KINDS:
            raise ValueError(f"{self.id}: unknown kind {self.kind!r}")
        if self.needle != self.needle.lower():
            raise ValueError(f"{self.id}: needles are lower case (matched on the lower-cased line)")
        if self.pattern is not None:
            object.__setattr__(self, "regex", re.compile(self.pattern, re.IGNORECASE))

    def describe(self, numbers: dict) -> str:
        return fill(self.cause, numbers)

    def numbers(self, text: str) -> dict[str, float | str]:
        """Named groups of `pattern` found in `text`, numbers as int/float, the rest as str."""
        if self.regex is None:
            return {}
        match = self.regex.search(text)
        if not match:
            return {}
        out: dict[str, float | str] = {}
        for key, value in match.groupdict().items():
            if value is None:
                continue
            out[key] = to_number(value)
        return out


def to_number(value: str) -> float | int | str:
    text = value.strip().replace(",", "")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return value.strip()


@dataclass
class Fix:
    reason: str
    flag: str | None = None
    value: object = None
    action: str | None = None

    def to_dict(self) -> dict:
        if self.flag is not None:
            return {"flag": self.flag, "value": self.value, "reason": self.reason}
        return {"action": self.action or "", "reason": self.reason}

    def render(self) -> str:
        if self.flag is None:
            return self.action or ""
        if self.flag.startswith("-"):
            if self.value is True:
                return self.flag
            return f"{self.flag} {self.value}"
        return f"{self.flag}={self.value}"  # an environment variable


class Hits(Protocol):
    """What matched for one class: the signatures by id, the surest one, and each hit's numbers."""

    signatures: dict
    best: Signature | None
    all_numbers: object


# numbers that name something rather than count it: printed as read, without thousands separators
_IDENTIFIERS = frozenset({"port", "http_status", "device", "pid", "signal", "exit_status"})


def fill(template: str, numbers: dict) -> str:
    """A cause with its {placeholders} filled from the numbers read; without them, the words before the first."""
    try:
        return template.format(**{k: (f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) and v >= 10000
                                      and k not in _IDENTIFIERS else v) for k, v in numbers.items()})
    except (KeyError, IndexError, ValueError):
        return template.split("{")[0].rstrip(" (,") + ("." if "{" in template else "")


def message_table(package: str, name: str = "messages.json", engine: str = "any",
                  known: tuple[Signature, ...] = ()) -> tuple[Signature, ...]:
    """The reviewed message table shipped in `package` (texts extracted from the engine's sources by
    scripts/extract_messages.py, each mapped to a class), as signatures. A needle a hand-written signature in
    `known` already has is left to it (those carry patterns for the numbers a fix needs). An out-of-memory
    message that can come at any stage (an allocator's) is placed by the traceback like the others."""
    rows = json.loads(resources.files(package).joinpath(name).read_text(encoding="utf-8"))["messages"]
    taken = {sig.needle for sig in known}
    out = []
    for row in rows:
        if row["needle"] in taken:
            continue
        taken.add(row["needle"])
        cls = FailureClass(row["class"])
        stage = row.get("stage")
        placed = cls.value.startswith("oom_") and stage in ("runtime", None)
        # an engine failure while serving is a defect; at config or loading time, a release that lacks the model
        defect = cls is FailureClass.ENGINE_BUG and stage not in ("config", "model_access", "weights_load")
        kind = row.get("kind") or ("oom" if placed else "bug" if defect else "error")
        out.append(Signature(row["id"], cls, row["needle"], float(row["weight"]), row["source"],
                             pattern=row.get("pattern") or None, kind=kind, cause=row.get("cause", ""),
                             engine=engine, require=bool(row.get("require"))))
    return tuple(out)

