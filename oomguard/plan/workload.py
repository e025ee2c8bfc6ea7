"""The workload a configuration must serve: the p99 request length and the peak concurrency.

Given on the command line, or derived from a JSONL of real requests. Pure except `read_workload_file`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from oomguard.errors import UsageError

CHARS_PER_TOKEN = 4.0   # prompt text without a tokenizer: the usual English average, stated in the plan
_PROMPT_TOKENS = ("prompt_tokens", "input_tokens", "input_len", "prompt_len", "num_prompt_tokens")
_OUTPUT_TOKENS = ("output_tokens", "completion_tokens", "output_len", "max_tokens", "num_output_tokens")
_START = ("start", "start_time", "arrival", "arrival_time", "timestamp")
_END = ("end", "end_time", "finish_time")
_DURATION = ("duration", "latency", "e2e_latency", "duration_s")


@dataclass(frozen=True)
class Workload:
    p99_tokens: int                  # prompt + output of the 99th-percentile request
    peak_concurrency: int            # requests in flight at the busiest moment
    prefix_sharing: float = 0.0      # fraction of each request's tokens shared with the others (a system prompt)
    max_tokens_out: int | None = None
    notes: tuple[str, ...] = ()      # how the figures were derived

    def __post_init__(self):
        if self.p99_tokens < 1:
            raise UsageError(f"--p99-tokens must be a positive integer, got {self.p99_tokens}")
        if self.peak_concurrency < 1:
            raise UsageError(f"--peak-concurrency must be a positive integer, got {self.peak_concurrency}")
        if not 0 <= self.prefix_sharing < 1:
            raise UsageError(f"--prefix-sharing is a fraction in [0, 1), got {self.prefix_sharing}")
        if self.max_tokens_out is not None and not 0 < self.max_tokens_out <= self.p99_tokens:
            raise UsageError(f"--max-tokens-out must be between 1 and --p99-tokens ({self.p99_tokens}), "
                             f"got {self.max_tokens_out}")

    @property
    def kv_tokens_at_peak(self) -> int:
        return self.p99_tokens * self.peak_concurrency


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (the smallest value with at least q% of the values at or below it)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (a request ending at t does not overlap one starting at t)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    open_now = peak = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    return peak


def _number(record: dict, keys: tuple[str, ...], line: int, path: str) -> float | None:
    for key in keys:
        if key in record and record[key] is not None:
            value = record[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise UsageError(f"{path}:{line}: {key!r} must be a non-negative number, got {value!r}")
            return float(value)
    return None


def _prompt_tokens(record: dict, line: int, path: str) -> tuple[float, bool]:
    """Prompt tokens of one record and whether they were estimated from text."""
    counted = _number(record, _PROMPT_TOKENS, line, path)
    if counted is not None:
        return counted, False
    text = record.get("prompt")
    if text is None and isinstance(record.get("messages"), list):
        text = "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in record["messages"])
    if isinstance(text, str):
        return math.ceil(len(text) / CHARS_PER_TOKEN), True
    raise UsageError(f"{path}:{line}: no prompt length: give one of {', '.join(_PROMPT_TOKENS)}, or 'prompt' "
                     "text, or 'messages'")


def workload_from_records(records: list[dict], path: str, peak_concurrency: int | None = None,
                          prefix_sharing: float = 0.0, max_tokens_out: int | None = None) -> Workload:
    """p99 of prompt + output and the peak overlap of [start, end) from real requests (pure)."""
    if not records:
        raise UsageError(f"{path}: no requests in the workload file")
    totals: list[float] = []
    outputs: list[float] = []
    intervals: list[tuple[float, float]] = []
    estimated = 0
    for line, record in records:
        prompt, guessed = _prompt_tokens(record, line, path)
        estimated += guessed
        output = _number(record, _OUTPUT_TOKENS, line, path)
        if output is None:
            raise UsageError(f"{path}:{line}: no output length: give one of {', '.join(_OUTPUT_TOKENS)}")
        totals.append(prompt + output)
        outputs.append(output)
        start, end = _number(record, _START, line, path), _number(record, _END, line, path)
        duration = _number(record, _DURATION, line, path)
        if start is not None and end is None and duration is not None:
            end = start + duration
        if start is not None and end is not None:
            if end < start:
                raise UsageError(f"{path}:{line}: the request ends before it starts")
            intervals.append((start, end))
    notes = [f"p99 of prompt + output over {len(totals):,} requests of {path}"]
    if estimated:
        notes.append(f"{estimated:,} prompts given as text: ~{CHARS_PER_TOKEN:g} characters per token assumed")
    if peak_concurrency is None:
        if len(intervals) != len(totals):
            raise UsageError(f"{path}: the requests carry no start and end (or duration) times, so the peak "
                             "concurrency cannot be derived: add --peak-concurrency N")
        peak_concurrency = peak_overlap(intervals)
        notes.append(f"peak concurrency {peak_concurrency} = most requests in flight at once in {path}")
    return Workload(p99_tokens=math.ceil(percentile(totals, 99)), peak_concurrency=peak_concurrency,
                    prefix_sharing=prefix_sharing,
                    max_tokens_out=max_tokens_out or math.ceil(max(outputs)) or None, notes=tuple(notes))


def read_workload_file(path: str, **kwargs) -> Workload:
    """Read a JSONL of requests (one JSON object per line; blank lines skipped)."""
    file = Path(path)
    if file.is_dir():
        raise UsageError(f"workload {path!r} is a directory: give a JSONL file with one request per line")
    if not file.is_file():
        raise UsageError(f"workload file {path!r} not found: give a JSONL file with one request per line")
    records: list[tuple[int, dict]] = []
    try:
        with file.open(encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}:{number}: not valid JSON ({exc.msg}): one JSON object per line") from None
                if not isinstance(record, dict):
                    raise UsageError(f"{path}:{number}: expected a JSON object per line, got {type(record).__name__}")
                records.append((number, record))
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text: give a JSONL file with one request per line") from None
    return workload_from_records(records, path, **kwargs)
