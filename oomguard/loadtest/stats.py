"""Percentiles and summaries of latency samples (pure Python: no numpy at run time)."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

QUANTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of already sorted values, interpolated linearly as numpy's default."""
    n = len(sorted_values)
    if n == 0:
        return None
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def summarize(values: Iterable[float]) -> dict[str, float | int | None]:
    """count, mean, p50, p90, p99, min, max of a sample (None figures when it is empty)."""
    data = sorted(values)
    out: dict[str, float | int | None] = {"count": len(data)}
    out["mean"] = (math.fsum(data) / len(data)) if data else None
    for q in QUANTILES:
        out[f"p{q}"] = percentile(data, q)
    out["min"] = data[0] if data else None
    out["max"] = data[-1] if data else None
    return out
