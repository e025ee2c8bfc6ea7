"""The state directory's measured figures: `oomguard serve` writes what each engine start printed about its memory,
`oomguard plan` and serve's own planning read it back for the same setup (engines/vllm/measured.py says what a setup
is and how the figures are used).

The directory: `--state-dir DIR`, else $OOMGUARD_STATE_DIR; none, nothing is read or kept.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from oomguard.engines.vllm.measured import MeasuredFigures, setup_key

STATE_DIR_ENV = "OOMGUARD_STATE_DIR"
FIGURES_FILE = "measured-figures.json"


def state_dir(given: str | os.PathLike | None) -> Path | None:
    chosen = given or os.environ.get(STATE_DIR_ENV)
    return Path(chosen) if chosen else None


class MeasuredStore:
    """One JSON file: {setup key: {"setup": what it was, "figures": MeasuredFigures}}, written atomically."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.file = self.dir / FIGURES_FILE

    def _load(self) -> dict:
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}    # none kept yet, or a damaged file: plan from the estimates
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> MeasuredFigures | None:
        entry = self._load().get(key)
        return MeasuredFigures.from_dict(entry["figures"]) if isinstance(entry, dict) and \
            isinstance(entry.get("figures"), dict) else None

    def put(self, key: str, setup: dict, figures: MeasuredFigures) -> None:
        data = self._load()
        data[key] = {"setup": setup, "figures": figures.to_dict()}
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".measured-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, self.file)


def key_of(report) -> str:
    """The setup key of a plan (a MemoryReport): its model, GPU, release and resolved settings."""
    return setup_key(report.model_id, report.gpu_name, report.vllm_version, report.config)


def setup_of(report) -> dict:
    return {"model": report.model_id, "gpu": report.gpu_name, "vllm_version": report.vllm_version,
            "config": dict(report.config)}
