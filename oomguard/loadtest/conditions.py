"""`--stop-when` conditions: a small strict grammar, parsed once, evaluated against live snapshots.

    CONDITIONS := CONDITION ("," CONDITION)*
    CONDITION  := METRIC OP NUMBER [UNIT]          OP: > >= < <=

Any condition that holds stops the run (they are OR-ed). Latency conditions look at the requests that finished
in the last 10 seconds (at least the last 20 of the stage), so they react to the load of the moment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from oomguard.errors import UsageError

LATENCIES = ("ttft", "itl", "tpot", "e2e")
PERCENTILES = ("p50", "p90", "p99")

# metric -> (kind, help). kind: "fraction" (0..1 or N%), "count", "seconds"
METRICS: dict[str, tuple[str, str]] = {
    "kv": ("fraction", "KV-cache usage reported by the server (0.95 or 95%)"),
    "preemptions": ("count", "preemptions since the stage started (vLLM's counter)"),
    "errors": ("count", "failed requests since the stage started"),
    "error_rate": ("fraction", "failed / finished requests in the stage (0.01 or 1%)"),
    "running": ("count", "requests the server reports running"),
    "waiting": ("count", "requests the server reports waiting in its queue"),
}
for _lat in LATENCIES:
    for _p in PERCENTILES:
        METRICS[f"{_p}_{_lat}"] = ("seconds", f"{_p} {_lat.upper()} (2s, 500ms)")

GRAMMAR = (
    "conditions are METRIC OP VALUE joined by commas, e.g. 'kv>0.95,preemptions>0,errors>0,p99_ttft>2s'; "
    "OP is one of > >= < <=; METRIC is one of: " + ", ".join(METRICS)
    + "; kv and error_rate take a fraction or a percentage (0.95, 95%), latencies take s or ms"
)

_COND = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=|>|<)\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(%|ms|s)?\s*$")


@dataclass(frozen=True)
class Condition:
    metric: str
    op: str
    threshold: float  # in base units: fraction, count, or seconds
    text: str  # as the user wrote it, normalised (no spaces)

    def holds(self, value: float | None) -> bool:
        if value is None:
            return False
        if self.op == ">":
            return value > self.threshold
        if self.op == ">=":
            return value >= self.threshold
        if self.op == "<":
            return value < self.threshold
        return value <= self.threshold


@dataclass(frozen=True)
class Firing:
    """A condition that held, with the value that made it hold and when (seconds since the run began)."""

    condition: Condition
    value: float
    at_s: float

    def describe(self) -> str:
        return f"{self.condition.metric} {format_value(self.condition.metric, self.value)} " \
               f"{self.condition.op} {format_value(self.condition.metric, self.condition.threshold)}"

    def to_dict(self) -> dict:
        return {"condition": self.condition.text, "metric": self.condition.metric, "value": self.value,
                "threshold": self.condition.threshold, "at_s": round(self.at_s, 3), "text": self.describe()}


def format_value(metric: str, value: float) -> str:
    kind = METRICS.get(metric, ("count", ""))[0]
    if kind == "fraction":
        return f"{round(value * 100, 1):g}%" if metric == "kv" or value >= 0.001 else f"{value:.4f}"
    if kind == "seconds":
        return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"
    return f"{value:g}"


def _parse_one(text: str) -> Condition:
    m = _COND.match(text)
    if not m:
        raise UsageError(f"bad --stop-when condition {text.strip()!r}: {GRAMMAR}")
    metric, op, number, unit = m.group(1), m.group(2), float(m.group(3)), m.group(4)
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r} in --stop-when {text.strip()!r}: {GRAMMAR}")
    kind = METRICS[metric][0]
    if kind == "fraction":
        if unit == "%":
            number /= 100.0
        elif unit is not None:
            raise UsageError(f"{metric} takes a fraction or a percentage, not {unit!r}: {text.strip()!r}")
        if number > 1.0:
            raise UsageError(f"{metric} is a fraction of 1: write 0.95 or 95%, not {text.strip()!r}")
    elif kind == "seconds":
        if unit == "ms":
            number /= 1000.0
        elif unit == "%":
            raise UsageError(f"{metric} is a time: write 2s or 500ms, not {text.strip()!r}")
    elif unit is not None:
        raise UsageError(f"{metric} is a count and takes no unit: {text.strip()!r}")
    return Condition(metric=metric, op=op, threshold=number, text=re.sub(r"\s+", "", text))


def parse_conditions(text: str | None) -> list[Condition]:
    """Parse `kv>0.95,preemptions>0,...` strictly; UsageError (exit 2) with the grammar on anything else."""
    if text is None:
        return []
    parts = text.split(",")
    if not text.strip() or any(not p.strip() for p in parts):
        raise UsageError(f"empty condition in --stop-when {text!r}: {GRAMMAR}")
    out: list[Condition] = []
    for part in parts:
        cond = _parse_one(part)
        if cond not in out:
            out.append(cond)
    return out


def evaluate(conditions: list[Condition], values: dict[str, float | None], at_s: float) -> list[Firing]:
    """The conditions that hold for these values (a metric absent or None never fires)."""
    fired = []
    for cond in conditions:
        value = values.get(cond.metric)
        if cond.holds(value):
            fired.append(Firing(cond, float(value), at_s))  # type: ignore[arg-type]
    return fired
