"""A JSON object kept in one file: read leniently (missing or damaged reads as empty), written atomically (a reader
never sees half a file; a crash mid-write leaves the old one)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def read_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_object(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)
