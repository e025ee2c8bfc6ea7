"""Where oomguard keeps what it fetches or builds between runs: `${OOMGUARD_CACHE:-~/.cache/oomguard}`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("OOMGUARD_CACHE") or Path.home() / ".cache" / "oomguard").expanduser()
