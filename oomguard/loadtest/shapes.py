"""Load shapes: how requests are offered, and ramps of them (the peak profile).

  --concurrency N            closed loop: N requests always in flight
  --rate R [--poisson]       open loop: R requests a second, evenly spaced or Poisson arrivals
  --burst N/T                N requests at once every T (e.g. 32/10s)
A range instead of a number steps the load up, stage by stage (the peak profile):
  --concurrency 1:64         1, 2, 4, ... 64 (x2 is the default step)
  --rate 2:40:+2             2, 4, 6, ... 40 requests a second
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from oomguard.errors import UsageError


@dataclass(frozen=True)
class Load:
    kind: str  # "concurrency", "rate", "poisson", "burst"
    value: float  # concurrency N, rate R (req/s), or burst size N
    every: float = 0.0  # burst period (s)

    @property
    def integer(self) -> bool:
        return self.kind in ("concurrency", "burst")

    @property
    def closed_loop(self) -> bool:
        """A request leaves only when one has finished: the client cannot outrun the server."""
        return self.kind == "concurrency"

    def at(self, value: float) -> "Load":
        return replace(self, value=int(round(value)) if self.integer else value)

    def label(self) -> str:
        v = _num(self.value)
        if self.kind == "concurrency":
            return f"{v} concurrent"
        if self.kind == "rate":
            return f"{v} req/s"
        if self.kind == "poisson":
            return f"{v} req/s (Poisson)"
        return f"bursts of {v} every {format_duration(self.every)}"

    def unit(self) -> str:
        return {"concurrency": "concurrent requests", "rate": "req/s", "poisson": "req/s (Poisson)",
                "burst": "requests a burst"}[self.kind]

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "value": self.value, "label": self.label()}
        if self.kind == "burst":
            d["every_s"] = self.every
        return d


@dataclass(frozen=True)
class Step:
    """x2 (multiply) or +4 (add)."""

    factor: float = 2.0
    add: float = 0.0

    def after(self, value: float, integer: bool) -> float:
        nxt = value * self.factor if self.add == 0 else value + self.add
        if integer:
            nxt = max(math.floor(nxt), int(value) + 1)
        return nxt

    def __str__(self) -> str:
        return f"+{_num(self.add)}" if self.add else f"x{_num(self.factor)}"


@dataclass(frozen=True)
class Ramp:
    start: float
    stop: float
    step: Step

    def levels(self, integer: bool) -> list[float]:
        out, v = [], self.start
        while v < self.stop - 1e-9:
            out.append(v)
            v = self.step.after(v, integer)
        out.append(self.stop)
        return out


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{round(seconds, 1):g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        m, s = divmod(round(seconds), 60)
        return f"{m} min" + (f" {s} s" if s else "")
    h, rest = divmod(round(seconds), 3600)
    return f"{h} h" + (f" {rest // 60} min" if rest // 60 else "")


def format_rate(x: float | None) -> str:
    """Requests a second with the digits that mean something: 1234, 27.9, 2.13, 0.047."""
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")


def parse_duration(text: str, what: str = "duration") -> float:
    m = _DUR.match(str(text))
    if not m:
        raise UsageError(f"{what} must be a number of seconds or like 30s, 5m, 1h, not {text!r}")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
    if value <= 0:
        raise UsageError(f"{what} must be positive, not {text!r}")
    return value


_NUM = r"(\d+(?:\.\d+)?)"


def parse_level(text: str, what: str, integer: bool) -> tuple[float, Ramp | None]:
    """'16' -> (16, None); '1:64' / '1:64:x2' / '4:64:+4' -> (1, Ramp)."""
    s = str(text).strip()
    m = re.fullmatch(_NUM + r"(?:\s*:\s*" + _NUM + r"(?:\s*:\s*([x+*]?)\s*" + _NUM + r")?)?", s)
    if not m:
        raise UsageError(f"{what} must be N or START:MAX[:STEP] (STEP x2 or +4), e.g. 16 or 1:64 or 2:40:+2, "
                         f"not {s!r}")
    start = float(m.group(1))
    if integer and not start.is_integer():
        raise UsageError(f"{what} must be a whole number, not {s!r}")
    if start <= 0:
        raise UsageError(f"{what} must be positive, not {s!r}")
    if m.group(2) is None:
        return (int(start) if integer else start), None
    stop = float(m.group(2))
    if integer and not stop.is_integer():
        raise UsageError(f"{what} must be whole numbers, not {s!r}")
    if stop <= start:
        raise UsageError(f"{what} range {s!r}: MAX must be above START")
    step = Step()
    if m.group(4) is not None:
        amount = float(m.group(4))
        if m.group(3) == "+":
            if amount <= 0:
                raise UsageError(f"{what} step must be positive: {s!r}")
            step = Step(add=amount)
        else:  # x or * or bare number: a factor
            if amount <= 1:
                raise UsageError(f"{what} step factor must be above 1 (x2, x1.5): {s!r}")
            step = Step(factor=amount)
    return (int(start) if integer else start), Ramp(start, stop, step)


def parse_burst(text: str) -> Load:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(.+)", str(text))
    if not m or int(m.group(1)) < 1:
        raise UsageError(f"--burst must be N/PERIOD, e.g. 32/10s (32 requests at once every 10 s), not {text!r}")
    return Load("burst", int(m.group(1)), parse_duration(m.group(2), "--burst period"))
