"""What a signature is: a known message text, the failure class it points to, and the numbers it carries.

Engines keep their own tables (`oomguard/engines/<engine>/signatures.py`); this module only defines the shape.
A signature is found by its `needle` (a short literal, matched case-insensitively, that may wrap over two log
lines), then `pattern` (a regex over the hit line and the next few lines, whitespace collapsed) pulls the
numbers out by named group. `weight` is how sure the text alone makes us of the class (0..1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# kinds: "error" classifies by itself; "oom" is an out-of-memory event classified by phase and numbers;
# "hint" is weak evidence (kept, ranked low); "bug" points at the engine itself.
KINDS = ("error", "oom", "hint", "bug")


@dataclass(frozen=True)
class Signature:
    id: str
    cls: str
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
        if self.kind not in KINDS:
            raise ValueError(f"{self.id}: unknown kind {self.kind!r}")
        if self.needle != self.needle.lower():
            raise ValueError(f"{self.id}: needles are lower case (matched on the lower-cased line)")
        if self.pattern is not None:
            object.__setattr__(self, "regex", re.compile(self.pattern, re.IGNORECASE))

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
