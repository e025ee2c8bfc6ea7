"""The state directory's measured figures: `oomguard serve` writes what each engine start printed about its memory,
`oomguard plan` and serve's own planning read it back for the same setup (engines/vllm/measured.py says what a setup
is and how the figures are used).

The directory: `--state-dir DIR`, else $OOMGUARD_STATE_DIR; none, nothing is read or kept.
"""

from __future__ import annotations

import os
from pathlib import Path

from oomguard.engines.vllm.measured import MeasuredFigures, setup_key
from oomguard.jsonfile import read_object, write_object

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

    def get(self, key: str) -> MeasuredFigures | None:
        entry = read_object(self.file).get(key)   # none kept yet, or a damaged file: plan from the estimates
        return MeasuredFigures.from_dict(entry["figures"]) if isinstance(entry, dict) and \
            isinstance(entry.get("figures"), dict) else None

    def put(self, key: str, setup: dict, figures: MeasuredFigures) -> None:
        data = read_object(self.file)
        data[key] = {"setup": setup, "figures": figures.to_dict()}
        write_object(self.file, data)


def key_of(report) -> str:
    """The setup key of a plan (a MemoryReport): its model, GPU, release and resolved settings."""
    return setup_key(report.model_id, report.gpu_name, report.vllm_version, report.config)


def setup_of(report) -> dict:
    return {"model": report.model_id, "gpu": report.gpu_name, "vllm_version": report.vllm_version,
            "config": dict(report.config)}
