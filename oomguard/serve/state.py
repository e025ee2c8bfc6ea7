"""What serve has done, as data: the restarts with their causes, and the state directory that remembers the last
configuration that started (per engine command) across runs."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from oomguard.jsonfile import read_object, write_object

STATES = ("planning", "starting", "ready", "restarting", "draining", "stopped", "gave_up")
STATE_FILE = "serve-state.json"


@dataclass
class Restart:
    cause: str                         # exit | signal | hang | startup_timeout
    finding_class: str | None
    summary: str
    exit_code: int | None
    flags_before: dict
    flags_after: dict
    reason: str
    at: float = field(default_factory=time.time)
    seconds_to_ready: float | None = None   # filled when the relaunched engine answers /health

    def to_dict(self) -> dict:
        return asdict(self)


def story(restarts: list[Restart]) -> str:
    """The whole story, one line a restart, for the give-up message."""
    lines = []
    for i, r in enumerate(restarts, 1):
        ready = f", ready in {r.seconds_to_ready:.1f} s" if r.seconds_to_ready is not None else ""
        lines.append(f"  {i}. {r.cause} (exit {r.exit_code}) {r.finding_class or 'no memory finding'}: "
                     f"{r.summary or '-'} -> {r.reason}{ready}")
    return "\n".join(lines)


class StateDir:
    """`--state-dir`: one JSON file, written atomically. Holds `last_good` (per command key: the flags that
    started) and the `restarts` of the last run."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.dir = Path(path)
        self.file = self.dir / STATE_FILE

    def load(self) -> dict:
        return read_object(self.file)

    def last_good(self, key: str) -> dict | None:
        entry = self.load().get("last_good", {}).get(key)
        return entry.get("flags") if isinstance(entry, dict) and isinstance(entry.get("flags"), dict) else None

    def save(self, key: str, good_flags: dict | None, restarts: list[Restart]) -> None:
        data = self.load()
        if good_flags is not None:
            data.setdefault("last_good", {})[key] = {"flags": good_flags, "at": time.time()}
        data["restarts"] = [r.to_dict() for r in restarts]
        write_object(self.file, data)
