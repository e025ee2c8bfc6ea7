"""Findings: what `oomguard diagnose` reports, and their JSON contract (issue 4).

A finding: `class` (a slug below), `confidence` (0..1), `summary` (the cause in one sentence), `evidence`
(lines with their numbers), `fixes` (ordered; `{flag, value, reason}` or `{action, reason}`). Optional keys are
added, never renamed: `command` (the user's `vllm serve` line rewritten with the fix), `notes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from oomguard.failures import FailureClass, Fix

LOG_CLASSES = tuple(FailureClass)
METRIC_CLASSES = ("kv_pressure", "preemptions_rising", "queue_growing", "prefix_cache_low_hit_rate",
                  "memory_growing", "ttft_queue_bound", "server_stopped")


@dataclass
class EvidenceLine:
    line: int
    text: str
    file: str = "-"

    def to_dict(self) -> dict:
        return {"line": self.line, "text": self.text, "file": self.file}


@dataclass
class Finding:
    cls: str
    confidence: float
    summary: str
    evidence: list[EvidenceLine] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    command: str | None = None
    notes: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)
    alternatives: list[dict] = field(default_factory=list)   # [{class, confidence, why}], most likely first

    def to_dict(self) -> dict:
        out = {"class": self.cls, "confidence": round(self.confidence, 2), "summary": self.summary,
               "evidence": [e.to_dict() for e in self.evidence], "fixes": [f.to_dict() for f in self.fixes],
               "alternatives": list(self.alternatives)}
        if self.command:
            out["command"] = self.command
        if self.notes:
            out["notes"] = list(self.notes)
        return out


@dataclass
class Diagnosis:
    findings: list[Finding]
    facts: Mapping   # StartupFacts for a log; the metric facts for --metrics
    lines: int = 0

    def to_dict(self) -> dict:
        return {"findings": [f.to_dict() for f in self.findings], "facts": dict(self.facts)}

    @property
    def top(self) -> str | None:
        return self.findings[0].cls if self.findings else None
