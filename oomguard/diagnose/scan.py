"""One pass over a log: every line is looked at once, and only bounded state is kept.

The scanner finds signature needles (one combined regex per line; a needle may wrap over two lines), collects
a few following lines to read the numbers of a hit, follows traceback frames per process and the startup phase
(so an out-of-memory error can be placed: loading weights, profiling, graph capture, serving), and reads the
startup facts. Nothing grows with the input: evidence, events and frames are capped.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

from oomguard.diagnose import oom
from oomguard.failures import Signature, message_table
from oomguard.engines.llamacpp import signatures as llamacpp_signatures
from oomguard.engines.ollama import signatures as ollama_signatures
from oomguard.engines.tgi import signatures as tgi_signatures
from oomguard.engines.vllm import signatures as vllm_signatures
from oomguard.engines.vllm import startup_log

from oomguard.diagnose import common_signatures

_WRITTEN = vllm_signatures.SIGNATURES + llamacpp_signatures.SIGNATURES + common_signatures.SIGNATURES
# hand-written signatures (with the patterns fixes need) first; the tables read from each engine's source add the
# wordings they lack (failures.message_table)
ALL_SIGNATURES: tuple[Signature, ...] = _WRITTEN
for _package, _name, _engine in (("oomguard.engines.vllm", "messages.json", "vllm"),
                                 ("oomguard.engines.llamacpp", "messages.json", "llamacpp"),
                                 ("oomguard.diagnose", "layer_messages.json", "any"),
                                 ("oomguard.engines.sglang", "messages.json", "sglang"),
                                 ("oomguard.engines.ollama", "messages.json", "ollama"),
                                 ("oomguard.engines.tgi", "messages.json", "tgi")):
    ALL_SIGNATURES += message_table(_package, _name, engine=_engine, known=ALL_SIGNATURES)

WINDOW = 4            # lines after a hit read for its numbers
EVIDENCE_FIRST = 3    # evidence lines kept per class: the first few ...
EVIDENCE_LAST = 5     # ... and the most recent
EVIDENCE_CHARS = 400  # characters of one evidence line
MAX_PENDING = 32
MAX_OOM_EVENTS = 16
MAX_PROCESSES = 64
TAIL = 160            # characters of the previous line a needle may start in
SHORT_TEXT = 12       # a text of at most this many lines is a pasted summary: its words are read even without errors

_PREFIX = re.compile(r"^\s*(?:\((?:[\w. /-]+?) pid=\d+(?:, ip=[\w.:-]+)?\)|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\s+\d\d-\d\d "
                     r"\d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]|\[[\w ,:.-]*\]|[\w.-]+\s+\|(?=\s))\s*")
_PROCESS = re.compile(r"^\s*\((?P<name>[\w. /-]+?) pid=(?P<pid>\d+)(?:, ip=[\w.:-]+)?\)")
# what marks a line as part of a failure: exceptions, frames, and the words engines and clients fail with
_ERROR_WORDS = re.compile(r"rror|xception|fail|traceback|\bhang|stuck|file \"|cannot|can't|couldn't|unable to|not found|"
                          r"refused|denied|not supported|invalid|fatal|abort|killed|out of memory|exceed|timed? ?out")
_BINARY = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd]")   # control characters, undecodable bytes
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_FRAME = re.compile(r'File "(?P<file>[^"]*)", line \d+, in (?P<func>[\w<>.]+)')
# a frame in an engine's own package (vLLM, SGLang, llama-cpp-python): a traceback there with no known message is
# the engine's code failing
_ENGINE_FILE = re.compile(r"(?:^|[/\\])(?:vllm|sglang|sgl_jax|llama_cpp|vllm_ascend)[/\\]")
_WORKER_METHOD = re.compile(r"while processing method (?P<func>\w+)")
# the source line under a traceback's innermost frame: the call it was making ("    raise_if_cache_size_invalid(n,")
# (indented, after any log prefix: "ERROR 04-28 15:55:45 worker_base.py:157]     raise_if_cache_size_invalid(n,")
_CALL = re.compile(r"(?:^|[\]|])\s{2,}(?:return |raise |await |[\w.,\[\] ]+ = )?(?:[\w.]+\.)?(?P<func>\w+)\(")
# the exception line a Python traceback ends with ("ValueError: ...", "torch.OutOfMemoryError: ...")
_EXCEPTION = re.compile(r"^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception)\b")


def strip_prefix(text: str) -> str:
    for _ in range(4):
        match = _PREFIX.match(text)
        if not match or not match.group(0):
            break
        text = text[match.end():]
    return text


@dataclass
class Evidence:
    first: list = field(default_factory=list)
    last: deque = field(default_factory=lambda: deque(maxlen=EVIDENCE_LAST))
    count: int = 0

    def add(self, number: int, text: str, source: str) -> None:
        self.count += 1
        item = (source, number, text[:EVIDENCE_CHARS])
        if any(i[:2] == item[:2] for i in self.first) or any(i[:2] == item[:2] for i in self.last):
            return
        if len(self.first) < EVIDENCE_FIRST:
            self.first.append(item)
        else:
            self.last.append(item)

    def lines(self) -> list[tuple[str, int, str]]:
        return sorted(self.first + list(self.last), key=lambda i: (i[0], i[1]))


@dataclass
class ClassHits:
    cls: str
    weight: float = 0.0
    kind: str = "error"
    first_line: int = 0
    best: Signature | None = None
    signatures: dict = field(default_factory=dict)   # id -> Signature
    numbers: dict = field(default_factory=dict)
    all_numbers: deque = field(default_factory=lambda: deque(maxlen=8))  # each hit's numbers, latest last
    evidence: Evidence = field(default_factory=Evidence)


@dataclass
class OomEvent:
    source: str
    line: int
    text: str
    phase: str
    frames: tuple[str, ...]
    numbers: dict = field(default_factory=dict)
    signature: Signature | None = None


@dataclass
class _Pending:
    signature: Signature | None
    source: str
    line: int
    texts: list
    remaining: int
    oom: OomEvent | None = None


class Matcher:
    """Finds which needles occur in a (lower-cased) line: one regex for 'any?', then a scan of the needles."""

    def __init__(self, needles: Iterable[str]):
        self.needles = sorted(set(needles), key=len, reverse=True)
        self.any = re.compile("|".join(_trie_regex(self.needles)))
        # the regex reports the longest needle at a position; the shorter needles it starts with match there too
        known = set(self.needles)
        self._prefixes = {n: [n[:k] for k in range(len(n), 0, -1) if n[:k] in known] for n in self.needles}

    def find(self, joined: str, boundary: int) -> list[str]:
        """Needles that end after `boundary` (so they involve the current line), overlapping ones included."""
        search = self.any.search
        match = search(joined, max(0, boundary - TAIL))
        if match is None:
            return []
        found: list[str] = []
        while match is not None:
            start = match.start()
            for needle in self._prefixes[match.group(0)]:
                if start + len(needle) > boundary and needle not in found:
                    found.append(needle)
            match = search(joined, start + 1)
        return found


def _trie_regex(words: list[str]) -> list[str]:
    """One regex that matches any of `words`, factored as a trie (shared prefixes written once).

    Built by grouping the sorted words on their first character, level by level, instead of materialising a
    dict per character: the result is the same, but the transient memory stays small as the tables grow (the
    scanner is built inside every diagnosis)."""
    def build(group: list[str]) -> str:
        # `group`: the distinct, sorted suffixes that share the prefix written so far
        optional = "" in group
        rest = [w for w in group if w]
        branches = []
        i = 0
        while i < len(rest):
            ch = rest[i][0]
            j = i
            while j < len(rest) and rest[j][0] == ch:
                j += 1
            branches.append(re.escape(ch) + build([w[1:] for w in rest[i:j]]))
            i = j
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if optional:
            return "(?:" + body + ")?"
        return body

    return [build(sorted(set(words)))]


@lru_cache(maxsize=1)
def _needles() -> tuple[dict[str, list], Matcher]:
    """Every needle the scan looks for, with what a hit means, and the matcher over them: built once a process
    (the tables are fixed), not once a diagnosis."""
    handlers: dict[str, list] = {}
    for sig in ALL_SIGNATURES:
        handlers.setdefault(sig.needle, []).append(("sig", sig))
    for name, needle, regex in startup_log.FACTS + llamacpp_signatures.FACTS + ollama_signatures.FACTS:
        handlers.setdefault(needle, []).append(("fact", (name, regex)))
    for needle, phase in startup_log.PHASE_MARKERS + llamacpp_signatures.PHASE_MARKERS:
        handlers.setdefault(needle, []).append(("phase", phase))
    for needle, phase in tgi_signatures.PHASE_MARKERS:   # TGI's launcher lines also say the log is TGI's
        handlers.setdefault(needle, []).append(("phase", phase))
        handlers[needle].append(("engine", "tgi"))
    for needle in ollama_signatures.ENGINE_MARKERS:
        handlers.setdefault(needle, []).append(("engine", "ollama"))
    for needle, phase in startup_log.PHASE_HINTS:
        handlers.setdefault(needle, []).append(("phase_hint", phase))
    handlers.setdefault('file "', []).append(("frame", None))
    handlers.setdefault("traceback (most recent call last)", []).append(("traceback", None))
    handlers.setdefault("while processing method", []).append(("frame", None))
    return handlers, Matcher(handlers)


class Scanner:
    """Feed lines with `feed(number, text, source)`; read `classes`, `ooms`, `facts`, `phase` afterwards."""

    def __init__(self) -> None:
        self._handlers, self._matcher = _needles()

        self.lines = 0
        self.classes: dict[str, ClassHits] = {}
        self.ooms: deque[OomEvent] = deque(maxlen=MAX_OOM_EVENTS)
        self.oom_count = 0
        self.facts: dict = {}
        self.fact_lines: dict[str, tuple[str, int]] = {}
        self.phase = "start"
        self.phase_seen: set[str] = set()
        self.phase_line: tuple | None = None   # (source, number, text) of the last startup-phase line
        self.engines: set[str] = set()
        self.error_lines: deque = deque(maxlen=6)
        self._frames: dict[str, deque] = {}
        self._pending: list[_Pending] = []
        self._prev = ""
        self._prev_raw = ""
        self.phase_hints: set[str] = set()
        self.engine_frames = 0   # traceback frames read in an engine's own package
        self.last_frame_line = 0
        self.exception_line = 0   # the line of the last exception line ("XError: ..."), after the frames or not
        self.head: list = []   # the first lines, kept only while the text is short (a pasted summary)

    # -- the pass ------------------------------------------------------------------------------------------
    def feed(self, number: int, text: str, source: str = "-") -> None:
        self.lines += 1
        if self._pending:
            self._advance_pending(text)
        lower = text.lower()
        stripped = lower.strip()
        joined = self._prev + " " + stripped
        boundary = len(self._prev) + 1
        self._prev = stripped[-TAIL:]
        if stripped and len(self.head) < SHORT_TEXT:
            self.head.append((source, number, text[:EVIDENCE_CHARS]))
        if stripped and _ERROR_WORDS.search(lower):
            self.error_lines.append((source, number, text[:EVIDENCE_CHARS]))
            if _EXCEPTION.match(strip_prefix(text)):
                self.exception_line = number
        if (not text.isascii() or _CONTROL.search(text)) and len(_BINARY.findall(text)) * 10 > len(text):
            # binary noise, not a log line: no message hides in it (a plain ASCII log line skips the count)
            self._prev, self._prev_raw = "", ""
            return
        if self.last_frame_line == number - 1:
            # a paste cut off after the innermost frame's source line: the call it shows is where the failure stands
            call = _CALL.search(text)
            if call and call.group("func") in startup_log.STAGE_FUNCTIONS:
                self._push_frame(call.group("func"), self._process_key(text))
        needles = self._matcher.find(joined, boundary)
        if not needles:
            self._prev_raw = text
            return
        process = self._process_key(text)
        seen_oom = False
        for needle in needles:
            for kind, payload in self._handlers[needle]:
                if kind == "sig":
                    seen_oom = self._on_signature(payload, number, text, source, process, seen_oom, joined)
                elif kind == "fact":
                    self._on_fact(payload, number, text, source)
                elif kind == "phase":
                    self._on_phase(payload)
                    self.phase_line = (source, number, text[:EVIDENCE_CHARS])
                elif kind == "frame":
                    self._on_frame(text, process)
                    self.last_frame_line = number
                elif kind == "phase_hint":
                    if payload in self.phase_hints and payload in startup_log.REPEATED_HINTS:
                        self.phase_hints.add(startup_log.REPEATED_HINTS[payload])
                    self.phase_hints.add(payload)
                elif kind == "engine":
                    self.engines.add(payload)
                elif kind == "traceback":
                    self._frames_for(process).clear()
        self._prev_raw = text

    @property
    def frames(self) -> tuple[str, ...]:
        """The functions of the tracebacks read, every process together, outermost first (bounded)."""
        return tuple(self._frames.get("*", ()))

    def finish(self) -> None:
        for pending in self._pending:
            self._complete(pending)
        self._pending.clear()

    # -- handlers ------------------------------------------------------------------------------------------
    def _on_signature(self, sig: Signature, number: int, text: str, source: str, process: str, seen_oom: bool,
                      joined: str = "") -> bool:
        if sig.engine != "any":
            self.engines.add(sig.engine)
        if sig.require:  # a common needle: counts only if its pattern matches this line (with the previous tail)
            raw = self._prev_raw[-TAIL:] + " " + text   # patterns may care for case ("OOM", not "room")
            if sig.regex is None or not (sig.regex.search(joined) or sig.regex.search(raw)):
                return seen_oom
            if sig.kind != "oom":
                self._register(sig, number, text, source)
                numbers = sig.numbers(raw) or sig.numbers(joined)   # the line as written keeps names in their case
                if numbers:
                    hits = self.classes[sig.cls]
                    hits.all_numbers.append(numbers)
                    for key, value in numbers.items():
                        hits.numbers.setdefault(key, value)
                return seen_oom
        if sig.kind == "oom":
            if seen_oom:  # one event per line, however many OOM needles it holds
                return True
            self.oom_count += 1
            event = OomEvent(source, number, text[:EVIDENCE_CHARS], self.phase,
                             tuple(self._frames_for(process)) + tuple(self._frames_for("*")), signature=sig)
            self.ooms.append(event)
            self._queue(_Pending(sig, source, number, [strip_prefix(text)], WINDOW, oom=event))
            return True
        self._register(sig, number, text, source)
        if sig.regex is not None:
            # a needle that started on the previous line: its numbers may be there too
            before = strip_prefix(self._prev_raw) if sig.needle not in text.lower() else ""
            self._queue(_Pending(sig, source, number, [before, strip_prefix(text)], WINDOW))
        return seen_oom

    def _register(self, sig: Signature, number: int, text: str, source: str) -> None:
        hits = self.classes.get(sig.cls)
        if hits is None:
            hits = self.classes[sig.cls] = ClassHits(sig.cls, first_line=number)
        if sig.weight > hits.weight:
            hits.weight, hits.best, hits.kind = sig.weight, sig, sig.kind
        hits.signatures[sig.id] = sig
        hits.evidence.add(number, text, source)

    def _on_fact(self, payload, number: int, text: str, source: str) -> None:
        name, regex = payload
        match = regex.search(text)
        if not match:
            return
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        if not groups:
            return
        self.facts.setdefault("_raw", {})[name] = groups
        self.fact_lines[name] = (source, number)
        raw = self.facts["_raw"]
        if name in ("engine_config", "non_default_args", "args_namespace"):
            raw[name] = groups  # parsed later, once
        if name == "vllm_version" or name == "engine_config":
            self.engines.add("vllm")

    def _on_phase(self, phase: str) -> None:
        if phase == "start" and self.phase != "start":
            self.phase_seen.add("restart")
        order = startup_log.PHASES
        if phase == "start" or order.index(phase) > order.index(self.phase):
            self.phase = phase
        self.phase_seen.add(phase)

    def _on_frame(self, text: str, process: str) -> None:
        match = _FRAME.search(text) or _WORKER_METHOD.search(text)
        if match:
            func = match.group("func")
            if "file" in match.groupdict() and startup_log.HTTP_CLIENT_FILES.search(match.group("file")):
                func = startup_log.HTTP_CLIENT_FRAME
            elif "file" in match.groupdict() and startup_log.DEVICE_CONTEXT_FILES.search(match.group("file")):
                func = startup_log.DEVICE_CONTEXT_FRAME
            elif "file" in match.groupdict() and startup_log.KERNEL_WARMUP_FILES.search(match.group("file")):
                func = "kernel_warmup"
                self.engine_frames += 1
            elif "file" in match.groupdict() and _ENGINE_FILE.search(match.group("file")):
                self.engine_frames += 1
            self._push_frame(func, process)

    def _push_frame(self, func: str, process: str) -> None:
        self._frames_for(process).append(func)
        if process != "*":
            self._frames_for("*").append(func)

    # -- helpers -------------------------------------------------------------------------------------------
    def _process_key(self, text: str) -> str:
        if text[:1] == "(" or text[:2] == " (":
            match = _PROCESS.match(text)
            if match:
                return match.group("pid")
        return "main"

    def _frames_for(self, process: str) -> deque:
        frames = self._frames.get(process)
        if frames is None:
            if len(self._frames) >= MAX_PROCESSES:
                self._frames.pop(next(iter(self._frames)))
            frames = self._frames[process] = deque(maxlen=48)
        return frames

    def _queue(self, pending: _Pending) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._complete(self._pending.pop(0))
        self._pending.append(pending)

    def _advance_pending(self, text: str) -> None:
        keep = []
        for pending in self._pending:
            pending.texts.append(strip_prefix(text))
            pending.remaining -= 1
            if pending.remaining <= 0:
                self._complete(pending)
            else:
                keep.append(pending)
        self._pending = keep

    def _complete(self, pending: _Pending) -> None:
        window = " ".join(t.strip() for t in pending.texts if t and t.strip())
        window = re.sub(r"\s+", " ", window)
        if pending.oom is not None:
            pending.oom.numbers = oom.parse(window)
            return
        sig = pending.signature
        if sig is None:
            return
        numbers = sig.numbers(window)
        if numbers:
            hits = self.classes.get(sig.cls)
            if hits is not None:
                hits.all_numbers.append(numbers)
                # the window that says the most wins (a later, fuller message over an earlier, partial one)
                if len(numbers) >= len(hits.numbers):
                    hits.numbers = {**hits.numbers, **numbers}
                else:
                    for key, value in numbers.items():
                        hits.numbers.setdefault(key, value)
