"""`--find-capacity`: the highest load that holds, found by stepping up and then bisecting.

A pure search over levels; the caller runs a stage at each level the search asks for and says whether it held
(KV usage under the threshold, no preemptions, no errors, no other --stop-when condition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from oomguard.loadtest.shapes import Step


@dataclass
class CapacitySearch:
    start: float
    maximum: float
    step: Step
    integer: bool = True
    resolution: float | None = None  # absolute; default 1 for integer levels, 5% of the bound for rates
    good: float | None = None  # highest level that held
    bad: float | None = None  # lowest level that broke
    history: list[tuple[float, bool]] = field(default_factory=list)

    def _resolution(self) -> float:
        if self.resolution is not None:
            return self.resolution
        return 1.0 if self.integer else max(0.05 * (self.bad or self.maximum), 0.01)

    def next_level(self) -> float | None:
        """The next level to try, or None when the search is over."""
        if not self.history:
            return self.start
        if self.bad is None:  # stepping up
            if self.good is None:
                return None
            if self.good >= self.maximum:
                return None
            return min(self.step.after(self.good, self.integer), self.maximum)
        low = self.good if self.good is not None else 0.0
        if self.bad - low <= self._resolution() + 1e-9:
            return None
        mid = (low + self.bad) / 2
        if self.integer:
            mid = math.floor(mid)
            if mid <= low or mid >= self.bad:
                return None
        return mid

    def record(self, level: float, held: bool) -> None:
        self.history.append((level, held))
        if held:
            self.good = level if self.good is None else max(self.good, level)
        else:
            self.bad = level if self.bad is None else min(self.bad, level)

    @property
    def capacity(self) -> float | None:
        return self.good

    @property
    def reached_maximum(self) -> bool:
        return self.bad is None and self.good is not None and self.good >= self.maximum
