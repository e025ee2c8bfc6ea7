"""vLLM versions: parsing, and the version bands whose memory behaviour differs.

Bands follow the wheels read for ../research/vllm-memory-model.md (0.6.6 ... 0.33.0).
"""

from __future__ import annotations

import re

from oomguard.errors import UsageError

Version = tuple[int, int, int]

OLDEST: Version = (0, 6, 0)
NEWEST: Version = (0, 33, 0)

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+|x))?")


def parse_version(text: str) -> Version:
    """'0.19.0', '0.10.1.dev101+gbda9d0535', 'v0.22', '0.22.x' -> (0, 19, 0) ... ; UsageError otherwise."""
    match = _VERSION.search(str(text).strip())
    if not match:
        raise UsageError(f"cannot read vLLM version {text!r}: give it as X.Y.Z, e.g. --vllm-version 0.19.0")
    patch = match.group(3)
    version = (int(match.group(1)), int(match.group(2)), int(patch) if patch and patch != "x" else 0)
    if not OLDEST <= version <= (NEWEST[0], NEWEST[1], 99):
        raise UsageError(f"vLLM {text} is outside the modelled range {fmt(OLDEST)}..{fmt(NEWEST)}; "
                         f"pick the nearest with --vllm-version")
    return version


def fmt(version: Version) -> str:
    return ".".join(map(str, version))
