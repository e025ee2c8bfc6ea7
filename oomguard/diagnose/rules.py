"""From what the scan saw to ranked findings, each with its cause and fixes computed from the numbers in the text.

Ranking: a class's score is the weight of its most specific message (an exact vLLM error text outranks a
library error, which outranks a keyword hint); an out-of-memory error is placed by its traceback frames, then by
the startup phase it happened in, and counted as `gpu_memory_in_use` when the message shows other processes
holding the memory, or as the startup profile run when its one allocation is larger than any weight tensor.
Consequences do not outrank causes: client connection errors after a server-side failure, and a generic symptom
(a bare assertion, a plea for a bug report) next to a message naming a specific cause, are ranked lower.
"""

from __future__ import annotations

import re

from oomguard.diagnose import lexicon
from oomguard.diagnose.facts import warnings as warning_signs
from oomguard.diagnose.model import Diagnosis, EvidenceLine, Finding, Fix
from oomguard.diagnose.planner import planned_weights_gib
from oomguard.diagnose.scan import SHORT_TEXT, ClassHits, OomEvent, Scanner
from oomguard.engines.llamacpp import fixes as llamacpp
from oomguard.engines.ollama import fixes as ollama
from oomguard.engines.sglang import fixes as sglang
from oomguard.engines.tgi import fixes as tgi
from oomguard.engines.vllm import fixes as vllm
from oomguard.engines.vllm.startup_log import PHASES, PROFILE_FRAMES, RUNTIME_FRAMES, WEIGHT_FRAMES, stage_of
from oomguard.failures import FailureClass

MAX_FINDINGS = 5
MIN_SCORE = 0.3


# -- out-of-memory placement -----------------------------------------------------------------------------------
def place_oom(event: OomEvent, facts: dict, final_phase: str = "start", hints: frozenset = frozenset(),
              restarted: bool = False, planned_weights: tuple[float, float] | None = None) -> tuple[str, float, str]:
    """(class, confidence, why) for one out-of-memory error: other processes first, then traceback frames, then
    whether the planner's weights for the model the log names fit the GPU at all, then the startup phase the run
    stopped in (logs of several processes interleave, so the phase printed after the error counts too), then the
    words around it, then the numbers."""
    n = event.numbers
    total = n.get("total_gib") or facts.get("total_gpu_memory_gib")
    other = n.get("other_total_gib", 0.0)
    if other and other >= 1.0 and (not total or other >= 0.04 * total):
        return FailureClass.GPU_MEMORY_IN_USE, 0.88, f"other processes hold {other:.2f} GiB of this GPU"
    reserved = (n.get("reserved_gib") or 0) + 0.5 if "reserved_gib" in n else None
    held_here = vllm.first_number(n.get("self_gib"), reserved)
    free = n.get("free_gib")
    if total and held_here is not None and free is not None:
        hidden = total - free - held_here
        if hidden >= max(2.0, 0.1 * total):
            return FailureClass.GPU_MEMORY_IN_USE, 0.8, f"about {hidden:.2f} GiB of this {total:.2f} GiB GPU is " \
                                                        "held outside " \
                                             "this process"
    frames = set(event.frames)
    text = event.text.lower()
    if "wake_up" in frames or "cumem_allocator" in text:
        # sleep mode (device_allocator/cumem.py) releases vLLM's memory for whatever shares the GPU, a trainer in RL
        # colocation, and maps it back on wake_up: what that tenant still holds is why it does not fit
        return FailureClass.GPU_MEMORY_IN_USE, 0.8, "it happened while vLLM woke from sleep mode, re-mapping the " \
                                                    "memory it had released to what shares the GPU"
    if "warming up sampler" in text or "sampler" in frames:
        return FailureClass.OOM_PROFILING_OR_GRAPH, 0.9, "it happened while warming up the sampler"
    if frames & PROFILE_FRAMES:
        where = "capturing CUDA graphs" if any("captur" in f for f in frames) else "the startup profile run"
        return FailureClass.OOM_PROFILING_OR_GRAPH, 0.88, f"the traceback is in {where}"
    if frames & WEIGHT_FRAMES:
        return FailureClass.OOM_WEIGHTS_LOAD, 0.88, "the traceback is in model loading"
    if "engine_recreated" in hints:
        return FailureClass.GPU_MEMORY_IN_USE, 0.75, "the text makes a second engine in the same Python process, " \
            "and the first one's GPU memory is freed only when the process ends"
    if planned_weights and planned_weights[0] >= planned_weights[1]:
        # the weights alone overflow the GPU: loading cannot finish, whatever phase the log stopped in
        weights, gpu_total = planned_weights
        tp = facts.get("tensor_parallel_size") or 1
        return FailureClass.OOM_WEIGHTS_LOAD, 0.86, f"{facts.get('model')} needs about {weights:.1f} GiB of weights " \
            f"per GPU at tensor parallel size {tp}, more than the {gpu_total:.1f} GiB GPU holds"
    logged_by = _SERVING_LOGGER.search(event.text)
    if logged_by:   # vLLM's log prefix names the module that logged the error: a request handler
        return FailureClass.OOM_RUNTIME, 0.82, f"vLLM's request handler ({logged_by.group(1)}) logged it: it happened " \
                                               "while serving a request"
    order = PHASES
    phase = event.phase
    if not restarted and order.index(final_phase) > order.index(phase):
        phase = final_phase
    if frames & RUNTIME_FRAMES and phase in ("ready", "serving", "start"):
        return FailureClass.OOM_RUNTIME, 0.85, "the traceback is in a serving step"
    if phase == "loading":
        return FailureClass.OOM_WEIGHTS_LOAD, 0.8, "it happened while the weights were loading"
    if phase in ("weights_loaded", "profiled"):
        return FailureClass.OOM_PROFILING_OR_GRAPH, 0.8, "it happened after the weights loaded, while vLLM " \
                                                         "profiled memory"
    if phase == "capturing":
        return FailureClass.OOM_PROFILING_OR_GRAPH, 0.82, "it happened while vLLM captured CUDA graphs"
    if phase == "captured":
        return FailureClass.OOM_PROFILING_OR_GRAPH, 0.8, "it happened after CUDA graph capture, in the warm-up " \
                                                        "before the server is up"
    if phase in ("ready", "serving"):
        return FailureClass.OOM_RUNTIME, 0.82, "it happened after startup, while serving"
    if str(facts.get("dtype", "")).lower() in ("float", "float32"):
        return FailureClass.OOM_WEIGHTS_LOAD, 0.7, "the model runs in float32, which doubles the weights"
    if frames & RUNTIME_FRAMES:
        return FailureClass.OOM_RUNTIME, 0.75, "the traceback is in a model step"
    if "capturing" in hints:
        return FailureClass.OOM_PROFILING_OR_GRAPH, 0.7, "the text speaks of CUDA graph capture"
    if "startup" in hints and "serving" not in hints:
        return FailureClass.OOM_PROFILING_OR_GRAPH, 0.7, "the text places it at startup, after loading"
    if "loading" in hints and "serving" not in hints:
        return FailureClass.OOM_WEIGHTS_LOAD, 0.7, "the text places it while loading the model"
    if "serving" in hints:
        return FailureClass.OOM_RUNTIME, 0.7, "the text places it while serving requests"
    if frames & {"forward", "__call__"}:
        return FailureClass.OOM_PROFILING_OR_GRAPH, 0.6, "the traceback is in a model forward pass outside any " \
                                                         "serving step " \
                                             "(the startup profile run)"
    tried = n.get("tried_gib") or 0.0
    if tried >= _ACTIVATION_GIB and "tried to allocate" in text:
        # PyTorch allocates weights tensor by tensor (the largest, an embedding, is 1-2 GiB); one request for more
        # is an activation of a full-size batch, which vLLM runs first in its startup profile
        return FailureClass.OOM_PROFILING_OR_GRAPH, 0.6, f"a single {tried:.2f} GiB allocation is larger than a " \
                                                         "weight tensor: an activation of the startup profile run"
    self_gib = n.get("self_gib")
    if total and self_gib and self_gib >= 0.8 * total:
        return FailureClass.OOM_RUNTIME, 0.55, "the process already held most of the GPU"
    return FailureClass.OOM_RUNTIME, 0.5, "the log does not show where it happened"


def _gpu_total_gib(event: OomEvent, facts: dict) -> float | None:
    """The GPU's total memory: from the out-of-memory message, the startup lines, else the GPU the log names."""
    total = event.numbers.get("total_gib") or facts.get("total_gpu_memory_gib")
    if total or not facts.get("gpu_name"):
        return total
    from oomguard.gpus.catalog import resolve_gpu
    try:
        return resolve_gpu(facts["gpu_name"]).total_memory_bytes / 2**30
    except Exception:   # a GPU outside the catalog: no total to compare with
        return None


# the size from which one PyTorch allocation is an activation rather than a weight tensor: the largest dense weight
# tensors are the embedding and LM head (vocab x hidden x 2 bytes: 152k x 8192 is 2.3 GiB; most are under 2). The
# fused expert tensors of the largest MoE models can be larger; such an error is only placed here when no frame,
# phase or word placed it.
_ACTIVATION_GIB = 3.0

# the module in a vLLM log line's prefix ("ERROR 02-11 08:25:49 [serving_chat.py:661]"): the OpenAI server's request
# handlers (entrypoints/openai/serving_*.py) run only while serving
_SERVING_LOGGER = re.compile(r"(?:\[|\s)(serving_\w+\.py):\d+\]")


# -- assembling ----------------------------------------------------------------------------------------------------
def _evidence(hits: ClassHits | None, extra: list[tuple[str, int, str]] = ()) -> list[EvidenceLine]:
    items = (hits.evidence.lines() if hits else []) + list(extra)
    seen, out = set(), []
    for source, line, text in sorted(items, key=lambda i: (i[0], i[1])):
        if (source, line) in seen:
            continue
        seen.add((source, line))
        out.append(EvidenceLine(line, text, source))
    return out[:8]


def build_findings(scanner: Scanner, facts: dict) -> list[Finding]:
    scored: list[tuple[float, int, Finding]] = []
    classes = dict(scanner.classes)

    # out-of-memory errors: placed by frames/phase; the first one is the root, later ones repeat it
    oom_class, oom_conf, oom_why, oom_numbers, oom_evidence = None, 0.0, "", {}, []
    if scanner.ooms:
        first = scanner.ooms[0]
        gpu_total = _gpu_total_gib(first, facts)
        planned = planned_weights_gib(facts, gpu_total)
        oom_class, oom_conf, oom_why = place_oom(first, facts, scanner.phase, frozenset(scanner.phase_hints),
                                                 "restart" in scanner.phase_seen,
                                                 (planned, gpu_total) if planned else None)
        if planned:
            oom_numbers["planned_weights_gib"] = round(planned, 2)
            oom_numbers.setdefault("total_gib", round(gpu_total, 2))   # a total read from the GPU the log names
        for event in scanner.ooms:
            for key, value in event.numbers.items():
                oom_numbers.setdefault(key, value)
            if len(oom_evidence) < 4:
                oom_evidence.append((event.source, event.line, event.text))

    hang = classes.get(FailureClass.NCCL)
    world = (facts.get("tensor_parallel_size") or 1) * (facts.get("pipeline_parallel_size") or 1)
    if hang is not None and set(hang.signatures) == {"generic.hang"} and world <= 1:
        del classes[FailureClass.NCCL]  # a hang on one GPU is not a communication problem
    generic: set = set()   # classes whose evidence is only a symptom any failure can print
    network_lines: set = set()   # lines where a network error is the inner cause of the line's error
    for cls in list(classes) + ([oom_class] if oom_class and oom_class not in classes else []):
        hits = classes.get(cls)
        if hits and hits.signatures and set(hits.signatures) <= GENERIC_SYMPTOMS:
            generic.add(cls)
        if hits and set(hits.signatures) & INNER_NETWORK_CAUSES:
            network_lines.add(hits.first_line)
        weight = hits.weight if hits else 0.0
        numbers = dict(hits.numbers) if hits else {}
        extra = []
        why = ""
        if cls == oom_class:
            weight = max(weight, oom_conf) + (0.03 if hits else 0.0)
            for key, value in oom_numbers.items():
                numbers.setdefault(key, value)
            extra = oom_evidence
            why = oom_why
        kind = hits.kind if hits else "error"
        if cls == oom_class and kind == "hint":   # a hint that agrees with an out-of-memory error is not a mere hint
            kind = "oom"
        oom_engine = None
        if cls == oom_class and hits is None:
            # an allocator's error names no engine: the engine whose own lines the log holds gives the fixes
            sig = scanner.ooms[0].signature
            oom_engine = sig.engine if sig is not None and sig.engine != "any" else \
                next((e for e in ("tgi", "sglang", "ollama", "llamacpp") if e in scanner.engines), None)
        summary, fixes = _build(cls, numbers, facts, hits, why, oom_engine)
        host_kill = _host_memory_kill(scanner) if cls == oom_class else None
        if host_kill is not None:
            summary, fixes = host_kill.describe(numbers), list(_HOST_MEMORY_FIXES)
        elif hits and hits.best and hits.best.id in KERNEL_OOM_KILLS:
            summary, fixes = hits.best.describe(numbers), list(_KERNEL_OOM_FIXES)
        finding = Finding(cls, min(weight, 0.99), summary, _evidence(hits, extra), fixes, numbers=numbers)
        if cls == oom_class and oom_why and cls.startswith("oom_"):
            finding.notes.append(f"placed as {cls} because {oom_why}")
        lines = ([hits.first_line] if hits else []) + [e[1] for e in extra]
        first_line = min(lines) if lines else 0
        scored.append((weight, first_line, finding, kind))

    if not scanner.error_lines and not _is_prose(scanner):
        # keyword hints alone, in a log without a single error line, are not findings; a person's short account of
        # a failure ("it works with vllm 0.7.3") is made of them
        scored = [s for s in scored if s[3] != "hint"]
    scored = _precedence(scored, generic, network_lines)
    _crash_after_oom(scored, oom_class)
    _known_regressions(scored, facts)
    _layers_in_host_ram(scored, facts)
    if scanner.error_lines:
        _fewer_gpus_than_ranks(scored, facts)
    scored.sort(key=lambda s: (-s[0], s[1]))
    findings = [f for w, _, f, _ in scored if w >= MIN_SCORE][:MAX_FINDINGS]
    for w, _, f, _ in scored:
        f.confidence = round(min(max(w, 0.05), 0.99), 2)
    stage = stage_of(scanner.frames)
    if not findings and (scanner.error_lines or stage):
        findings.append(_from_stage(scanner, stage))
    elif not findings and _is_prose(scanner):
        # a short paste with no error word (an issue's title, a one-line summary): its words, if they name a class
        worded = _from_words(scanner, None, False, [EvidenceLine(n, t, s) for s, n, t in scanner.head],
                             "a message oomguard knows", lines=[t for _, _, t in scanner.head])
        if worded is not None:
            findings.append(worded)
    if not findings and scanner.phase in _STARTING:
        findings.append(_stopped_while_starting(scanner))
    if findings:
        _rank_alternatives(findings[0], [f for w, _, f, _ in scored if f is not findings[0] and w > 0.05], stage,
                           _evidence_for(scanner, oom_numbers))
    return findings


def _is_prose(scanner: Scanner) -> bool:
    """A short paste with no log line in it: an issue's title or a person's one-paragraph account of a failure."""
    return scanner.lines <= SHORT_TEXT and bool(scanner.head) and \
        not any(_LOG_LINE.match(t) for _, _, t in scanner.head)


# the startup phases (engines/vllm/startup_log.py, engines/llamacpp/signatures.py) an engine's log can stop in
# without saying the server is up
_STARTING = {"loading": "loading the model's weights", "weights_loaded": "after loading the weights, before or during "
             "the memory profile", "profiled": "after sizing the KV cache", "capturing": "while capturing CUDA graphs",
             "captured": "after capturing CUDA graphs, in the warm-up that follows"}


def _stopped_while_starting(scanner: Scanner) -> Finding:
    """An engine log with no error that stops before the server was up: still starting, or a process killed from
    outside, which prints nothing (the kernel's OOM killer, a container's memory limit: exit 137)."""
    where = _STARTING[scanner.phase]
    last = [EvidenceLine(n, t, s) for s, n, t in [scanner.phase_line]] if scanner.phase_line else []
    return Finding(FailureClass.UNKNOWN, 0.25,
                   f"The log stops {where}, with no error and without the server coming up: the engine may still "
                   "have been starting, or was killed from outside, which leaves no message (the kernel's OOM "
                   "killer when host RAM runs out, a container's memory limit: exit code 137).", last,
                   [Fix("a process killed for host memory is in the kernel log",
                        action="check `dmesg -T | grep -i -E 'killed process|out of memory'` and the container's "
                               "exit code (137: killed)"),
                    Fix("the rest of the log says whether it came up", action="paste the log to its last line")],
                   notes=[f"the last startup phase seen: {scanner.phase}"])


_PASTE_WHOLE_LOG = Fix("the cause is in the lines the text does not show",
                       action="paste the whole log from the first ERROR or Traceback to its end")


def _engine_failure(confidence: float, summary: str, evidence: list, what: str, note: str,
                    first: Fix | None = None) -> Finding:
    """The weak reading of a failure no known check explains: the engine's own, with `unknown` beside it."""
    fixes = ([first] if first else []) + [Fix("a crash inside the engine is often fixed upstream",
                                              action=f"try the latest release of the engine, and search its issues "
                                                     f"for the {what}")]
    return Finding(FailureClass.ENGINE_BUG, confidence, summary, evidence, fixes, notes=[note],
                   alternatives=[{"class": FailureClass.UNKNOWN, "confidence": 0.2,
                                  "why": "no known message matched: the cause may be one oomguard does not know"}])


def _from_stage(scanner: Scanner, stage) -> Finding:
    """No known message: the words of a class in the error lines, the stage the traceback stands in, or `unknown`,
    saying what the text lacks."""
    evidence = [EvidenceLine(n, t, s) for s, n, t in scanner.error_lines]
    cut = bool(scanner.frames) and scanner.exception_line <= scanner.last_frame_line   # ends inside the frames
    missing = "the final exception line (the last lines of the traceback)" if cut else "a message oomguard knows"
    worded = _from_words(scanner, stage, cut, evidence, missing)
    if worded is not None:
        return worded
    if stage is None and scanner.engine_frames and cut:
        # a memory, configuration or access failure would have shown a known message: without one, an engine
        # traceback is most often the engine's own failure
        return Finding(FailureClass.ENGINE_BUG, 0.3,
                       f"The traceback stops inside the engine's own code without {missing}; with no message "
                       "oomguard knows (out-of-memory, configuration and access failures have known ones), the "
                       "engine's own failure is the likeliest reading.", evidence,
                       [Fix("the exception names the cause", action="paste the last lines of the traceback to confirm"),
                        Fix("a crash inside the engine is often fixed upstream",
                            action="try the latest release of the engine")],
                       notes=[f"inferred from the traceback's frames ({', '.join(scanner.frames[-3:])})"])
    if stage is None and scanner.exception_line and not cut:
        # the engines' user-facing checks (memory, configuration, access) raise known messages; an exception none
        # of them raises is most often the engine's (or a library's) own defect
        return _engine_failure(0.3, "The text ends in an exception that none of the known configuration, memory or "
                                    "access checks raises; an internal error of the engine or a library it calls is "
                                    "the likeliest reading.", evidence, "exception",
                               "inferred from an exception with no known message")
    if stage is None and evidence and not (scanner.frames and not scanner.engine_frames):
        # an error line that none of the engines' known checks (memory, configuration, access) prints: as for an
        # unknown exception, the engine's own failure is the likelier reading, and the rest of the log decides (not
        # a traceback wholly in the user's own code, which blames no engine)
        return _engine_failure(0.25, f"No known failure message matched and the text lacks {missing}; an error that "
                                     "none of the known configuration, memory or access checks prints is most often "
                                     "the engine's own failure.", evidence, "error",
                               "inferred from error lines with no known message", first=_PASTE_WHOLE_LOG)
    if stage is None:
        return Finding(FailureClass.UNKNOWN, 0.2, f"No known failure message matched, and the text lacks {missing}.",
                       evidence, [_PASTE_WHOLE_LOG])
    return Finding(stage.classes[0], 0.35,
                   f"The text stops inside {stage.where} without {missing}; there, the usual cause is "
                   f"{stage.classes[0].replace('_', ' ')}.", evidence,
                   [Fix("the exception names the cause", action="paste the last lines of the traceback to confirm")],
                   notes=[f"inferred from the traceback's frames ({', '.join(scanner.frames[-3:])})"])


# a log line (a level, a timestamp, a process prefix): a short text holding one is a log excerpt, whose words are a
# configuration's, not a person's summary of a failure
_LOG_LINE = re.compile(r"\s*(?:\(\w[\w ./-]* pid=\d+|\[?\d{4}-\d\d-\d\d|\[?\d\d:\d\d:\d\d|(?:INFO|DEBUG|WARNING|WARN|ERROR)\b"
                       r"|[a-z_][a-z0-9_]*:\s)")   # the last: llama.cpp's "function: message" lines


def _from_words(scanner: Scanner, stage, cut: bool, evidence: list, missing: str,
                lines: list | None = None) -> Finding | None:
    """No known message, but the error lines use a class's own terms (lexicon.py): that class, weakly, with the
    other worded classes as alternatives. The traceback's stage counts as one more term for its classes; a traceback
    cut inside the engine's own code, as one for the engine's failure."""
    lines = lines if lines is not None else [t for _, _, t in scanner.error_lines]
    scores = {cls: (count, words) for cls, count, words in lexicon.read(lines)}
    if not scores:
        return None
    memory = next((c for c in (stage.classes if stage else ()) if c.startswith("oom_")), None)
    if FailureClass.OOM_RUNTIME in scores and memory and memory != FailureClass.OOM_RUNTIME:
        scores[memory] = scores.pop(FailureClass.OOM_RUNTIME)   # memory words: the stage says which memory failure
    bonus = {}
    for rank, cls in enumerate(stage.classes if stage else ()):
        bonus[cls] = 1.0 if rank == 0 else 0.5
    if cut and scanner.engine_frames:
        bonus[FailureClass.ENGINE_BUG] = bonus.get(FailureClass.ENGINE_BUG, 0) + 1.0
    order = list(scores) + [c for c in bonus if c not in scores]   # terms first, then the stage's, then the engine
    ranked = sorted(order, key=lambda c: (-(scores.get(c, (0, []))[0] + bonus.get(c, 0)), order.index(c)))
    best = ranked[0]
    words = scores.get(best, (0, []))[1]
    said = f"its words ({', '.join(repr(w) for w in words[:3])}) are those of {best.replace('_', ' ')}" if words \
        else f"the traceback stands in {stage.where}" if stage and best in stage.classes \
        else "the traceback stops inside the engine's own code"
    finding = Finding(best, round(min(0.3 + 0.05 * len(words), 0.45), 2),
                      f"No failure message oomguard knows matched and the text lacks {missing}; {said}.", evidence,
                      [Fix("the exact error names the cause", action="paste the log from the first ERROR or "
                                                                     "Traceback to its end to confirm")],
                      notes=["inferred from the words of the error lines, not from a known message"])
    for cls in ranked[1:3]:
        got = scores.get(cls, (0, []))[1]
        finding.alternatives.append({"class": cls, "confidence": 0.2,
                                     "why": f"the text also says {', '.join(repr(w) for w in got[:3])}" if got
                                     else "the traceback's frames point there"})
    return finding


def _rank_alternatives(top: Finding, others: list[Finding], stage, evidence: dict | None = None) -> None:
    """Up to three other classes the text supports, most likely first: other findings, then the traceback's stage,
    then the classes whose failures show the same symptom as the top one (those the text gives a sign of first)."""
    seen = {top.cls} | {a["class"] for a in top.alternatives}
    for other in others:
        if other.cls not in seen and len(top.alternatives) < 3:
            seen.add(other.cls)
            top.alternatives.append({"class": other.cls, "confidence": other.confidence,
                                     "why": other.summary.split(". ")[0][:200]})
    for cls in stage.classes if stage else ():
        if cls not in seen and len(top.alternatives) < 3:
            seen.add(cls)
            top.alternatives.append({"class": cls, "confidence": 0.2,
                                     "why": f"the traceback stands in {stage.where}"})
    evidence = evidence or {}
    look_alikes = SHARED_SYMPTOM.get(top.cls, ())
    # a look-alike the text gives a sign of goes first; otherwise the table's order (the likelier cause first)
    ranked = sorted(enumerate(look_alikes), key=lambda item: (item[1][0] not in evidence, item[0]))
    for _, (cls, why) in ranked:
        if top.cls == FailureClass.UNKNOWN and cls not in evidence and not top.evidence:
            continue   # nothing matched and no error line: offer only what the text itself gives a sign of
        if cls not in seen and len(top.alternatives) < 3:
            seen.add(cls)
            sign = evidence.get(cls)
            top.alternatives.append({"class": cls, "confidence": 0.15 if sign else 0.1,
                                     "why": f"{why}; the text {sign}" if sign else why})


C = FailureClass
# What else a failure's symptom can mean: the classes whose failures print the same message, read from how each
# failure arises (not from any report). An allocator's out-of-memory reads the same whichever stage asked for the
# memory, or when another process holds it; a cache that cannot be sized reads the same whether the model or another
# process took the memory; a model that cannot be opened reads the same when the network, the file's format or a
# release too old for it is at fault. Most likely first: an engine that sizes its KV cache at startup (vLLM, Ollama's
# offload estimate) has memory for every step it admits, so running out while serving is its accounting falling short
# before it is the settings; a model that does not fit fails at loading, before the profile run. Every check an engine
# runs can also misfire in a release (a regression, a miscount, a format it mishandles): the engine's own failure is
# the second reading of every symptom, as it is the commonest cause in public failure reports.
SHARED_SYMPTOM: dict[str, tuple[tuple[str, str], ...]] = {
    C.OOM_RUNTIME: ((C.ENGINE_BUG, "an engine that misjudges its own memory needs fails the same way"),
                    (C.OOM_WEIGHTS_LOAD, "the same allocator error ends a model load that does not fit"),
                    (C.OOM_PROFILING_OR_GRAPH, "the same allocator error ends the startup profile run or graph "
                                                "capture"),
                    (C.GPU_MEMORY_IN_USE, "memory another process holds makes the same error")),
    C.OOM_PROFILING_OR_GRAPH: ((C.GPU_MEMORY_IN_USE, "memory another process holds makes the same error"),
                               (C.ENGINE_BUG, "an engine that under-reserves for its own profiling or graphs fails "
                                              "the same way"),
                               (C.OOM_WEIGHTS_LOAD, "the same allocator error ends a model load that does not fit"),
                               (C.OOM_RUNTIME, "the same allocator error ends a serving step")),
    C.OOM_WEIGHTS_LOAD: ((C.GPU_MEMORY_IN_USE, "memory another process holds makes the same error"),
                         (C.ENGINE_BUG, "a loader that holds more than the weights while loading (a release's "
                                        "regression) fails the same way"),
                         (C.OOM_PROFILING_OR_GRAPH, "the same allocator error ends the startup profile run"),
                         (C.OOM_RUNTIME, "the same allocator error ends a serving step")),
    C.GPU_MEMORY_IN_USE: ((C.OOM_PROFILING_OR_GRAPH, "the engine's own startup peak can leave the same shortfall"),
                          (C.ENGINE_BUG, "an engine that miscounts free memory reports the same"),
                          (C.OOM_WEIGHTS_LOAD, "a model larger than the GPU leaves the same shortfall")),
    C.NO_CACHE_BLOCKS: ((C.GPU_MEMORY_IN_USE, "memory another process holds leaves no room for the cache too"),
                        (C.ENGINE_BUG, "an engine that miscounts its memory leaves the same nothing"),
                        (C.KV_CACHE_TOO_SMALL, "a cache too small for the context is the same shortage")),
    C.KV_CACHE_TOO_SMALL: ((C.NO_CACHE_BLOCKS, "the same shortage, with no room left at all"),
                           (C.ENGINE_BUG, "an engine that miscounts its memory or the request's needs sizes the same "
                                          "shortfall"),
                           (C.GPU_MEMORY_IN_USE, "memory another process holds shrinks the cache the same way"),
                           (C.CONTEXT_TOO_LONG, "a request longer than the context reads alike")),
    C.CONTEXT_TOO_LONG: ((C.KV_CACHE_TOO_SMALL, "a cache smaller than the context rejects long requests too"),
                         (C.ENGINE_BUG, "a release that derives the context length wrongly (rope scaling) refuses "
                                        "alike"),
                         (C.TOKENIZER_CHAT_TEMPLATE, "a template that inflates the prompt makes the same excess")),
    C.TOKENIZER_CHAT_TEMPLATE: ((C.ENGINE_BUG, "a template the engine renders wrongly fails the same way"),
                                (C.MODEL_ACCESS, "a tokenizer that cannot be fetched fails the same way")),
    C.MODEL_ACCESS: ((C.CONNECTION, "a network that cannot reach the model store fails the same way"),
                     (C.ENGINE_BUG, "a release that predates the model or its format fails to open it alike"),
                     (C.QUANTIZATION_MISMATCH, "a checkpoint in a format the loader does not expect fails alike")),
    C.CONNECTION: ((C.ENGINE_BUG, "a server that crashed or never started answers the same way"),
                   (C.MODEL_ACCESS, "a model store that cannot be reached fails the same way")),
    C.QUANTIZATION_MISMATCH: ((C.DTYPE_CAPABILITY, "a GPU without the kernels for the format fails alike"),
                              (C.ENGINE_BUG, "a release that mishandles the format fails alike"),
                              (C.TP_MISCONFIG, "quantized shapes that do not split over the GPUs fail alike")),
    C.DTYPE_CAPABILITY: ((C.QUANTIZATION_MISMATCH, "a quantization the GPU lacks kernels for fails alike"),
                         (C.ENGINE_BUG, "a build without kernels for this GPU fails alike")),
    C.TP_MISCONFIG: ((C.NCCL, "the GPUs failing to talk stops the same parallel setup"),
                     (C.ENGINE_BUG, "a release that splits a layer wrongly over the GPUs fails the same check"),
                     (C.QUANTIZATION_MISMATCH, "quantized weights that do not split fail alike")),
    C.NCCL: ((C.TP_MISCONFIG, "a parallel layout the GPUs cannot hold fails the same setup"),
             (C.ENGINE_BUG, "a crash in one rank leaves the others waiting the same way")),
    C.ENGINE_BUG: ((C.OOM_RUNTIME, "a crash while serving is often memory running out"),
                   (C.MODEL_ACCESS, "a model or file format the release does not implement fails the same way: "
                                    "another checkpoint of the model is the other way out")),
    C.UNKNOWN: ((C.ENGINE_BUG, "an error that none of the known configuration, memory or access checks prints is "
                               "most often the engine's (or a library's) own failure"),),
}


def _evidence_for(scanner: Scanner, oom_numbers: dict) -> dict:
    """Signs in the text of each look-alike class (class -> a few words on what was seen), from what the scan kept:
    weak hits, the phases the log went through, words that place the failure, and the out-of-memory numbers."""
    signs: dict = {}
    for cls, hits in scanner.classes.items():
        signs.setdefault(cls, f"also has {hits.best.id if hits.best else cls} ({hits.evidence.count} line(s))")
    phases = scanner.phase_seen | scanner.phase_hints
    if phases & {"loading"}:
        signs.setdefault(C.OOM_WEIGHTS_LOAD, "shows the weights loading")
    if phases & {"weights_loaded", "profiled", "capturing", "captured", "startup"}:
        signs.setdefault(C.OOM_PROFILING_OR_GRAPH, "shows startup profiling or graph capture")
    if phases & {"ready", "serving"}:
        signs.setdefault(C.OOM_RUNTIME, "shows the server serving")
    if oom_numbers.get("other_total_gib") or oom_numbers.get("other_processes_gib"):
        signs.setdefault(C.GPU_MEMORY_IN_USE, "lists other processes on the GPU")
    if scanner.engine_frames:
        signs.setdefault(C.ENGINE_BUG, "stops inside the engine's own code")
    if "ollama" in scanner.engines:
        # Ollama picks how many layers go to the GPU from its own estimate: an allocator error is that estimate short
        signs.setdefault(C.ENGINE_BUG, "comes from Ollama, which sizes its GPU offload itself (an out-of-memory "
                                       "there is its estimate falling short, which its releases keep fixing)")
    return signs


# engines whose own messages bring their own fixes; vLLM's are the default (its flags are the users' usual ones)
_ENGINE_FIXES = {"llamacpp": llamacpp.build, "sglang": sglang.build, "ollama": ollama.build, "tgi": tgi.build}


def _build(cls: FailureClass, numbers: dict, facts: dict, hits: ClassHits | None, why: str,
           oom_engine: str | None = None) -> tuple[str, list[Fix]]:
    """The engine whose message is the evidence gives the fixes, in its own flags."""
    engine = hits.best.engine if hits and hits.best else oom_engine or "any"   # the surest message's engine (SGLang and vLLM
    if engine == "any" and hits:                                    # share some wordings)
        engine = next((s.engine for s in hits.signatures.values() if s.engine == "llamacpp"), "any")
    built = _ENGINE_FIXES[engine](cls, numbers, facts, hits, why) if engine in _ENGINE_FIXES else None
    return built or vllm.build(cls, numbers, facts, hits, why)


_SERVER_CLASSES = {FailureClass.OOM_WEIGHTS_LOAD, FailureClass.KV_CACHE_TOO_SMALL, FailureClass.NO_CACHE_BLOCKS,
                   FailureClass.OOM_PROFILING_OR_GRAPH, FailureClass.OOM_RUNTIME, FailureClass.GPU_MEMORY_IN_USE,
                   FailureClass.TP_MISCONFIG, FailureClass.DTYPE_CAPABILITY, FailureClass.QUANTIZATION_MISMATCH,
                   FailureClass.NCCL, FailureClass.MODEL_ACCESS}


# The transport errors an error chain ends in (Go's "op: ...: dial tcp ...: i/o timeout", the errno texts): on the
# line of an operation that failed, they are why it failed (common_signatures.py)
INNER_NETWORK_CAUSES = frozenset({"go.io_timeout", "go.no_such_host", "go.tls_timeout", "go.client_timeout",
                                  "net.reset", "net.unreachable", "net.no_route", "tls.x509_verify",
                                  "tls.python_verify"})


# Messages any failure can end in, whatever its cause: an engine's bare assertion or plea for a bug report
# (common_signatures.py). Where the text also names a specific cause, that cause explains them.
GENERIC_SYMPTOMS = frozenset({"py.assertion", "py.not_implemented", "bug.report", "bug.open_issue",
                              "bug.this_is_a_bug"})
_SPECIFIC = 0.4        # a specific class's weight from which it outranks a generic symptom


def _precedence(scored: list, generic: set = frozenset(), network_lines: set = frozenset()) -> list:
    """Causes before consequences; a specific cause before a generic symptom; a network failure a line's error chain
    ends in ("pull model manifest: Get ...: dial tcp ...: i/o timeout") before the operation it broke."""
    strong = {f.cls: w for w, _, f, kind in scored if kind in ("error", "oom") and w >= 0.75}
    out = []
    for weight, line, finding, kind in scored:
        cls = finding.cls
        if cls in _SERVER_CLASSES and line in network_lines:
            weight -= 0.3
        elif cls == FailureClass.CONNECTION and strong.keys() & _SERVER_CLASSES and line not in network_lines:
            weight -= 0.3   # a refused or dropped connection after a server failure is its consequence
        if cls == FailureClass.ENGINE_BUG and kind == "bug" and \
                any(c != FailureClass.ENGINE_BUG and w >= max(0.8, weight) for c, w in strong.items()):
            # a crash next to a specific error at least as sure: the specific one explains it (a defect message surer
            # than the error beside it, such as a check whose own numbers show it misfired, keeps its rank)
            weight = min(weight, 0.6)
        if kind == "hint":
            # a keyword alone only speaks when nothing firmer was found
            weight = min(weight, 0.25 if any(c != cls for c in strong) else 0.45)
        if cls in (FailureClass.OOM_RUNTIME, FailureClass.OOM_PROFILING_OR_GRAPH, FailureClass.OOM_WEIGHTS_LOAD,
                   FailureClass.NO_CACHE_BLOCKS) and \
                strong.get(FailureClass.GPU_MEMORY_IN_USE, 0) >= 0.9:
            weight -= 0.1   # memory held by another process explains the OOM
        if cls == FailureClass.NCCL and kind == "hint" and len(strong) == 0:
            weight = max(weight, 0.3)
        out.append((weight, line, finding, kind))
    # a bare assertion next to a message naming a specific cause (a GPU without the kernels, a quantization the
    # loader rejects, a context too long): the cause first; the assertion is where that cause surfaced
    specific = max((w for w, _, f, _ in out if f.cls not in generic and f.cls != FailureClass.UNKNOWN), default=0)
    for i, (weight, line, finding, kind) in enumerate(out):
        if finding.cls in generic and specific >= _SPECIFIC and weight >= specific:
            finding.notes.append("ranked below the specific cause the text also names: this message is a symptom "
                                 "any failure can end in")
            out[i] = (specific - 0.01, line, finding, kind)
    return out


# A process that dies after an out-of-memory error (an abort, a crash status, a heap the allocator left corrupt) dies
# of it: ggml aborts on a failed CUDA allocation, which a Go runner reports as exit status 2 and a Python worker as
# "core dumped". The crash is the consequence; the out-of-memory error, wherever it was placed, is the cause.
def _crash_after_oom(scored: list, oom_class) -> None:
    if oom_class is None:
        return
    oom_weight = max((w for w, _, f, _ in scored if f.cls == oom_class), default=0.0)
    for i, (weight, line, finding, kind) in enumerate(scored):
        crash = finding.cls == FailureClass.ENGINE_BUG and kind == "bug"
        if (crash or finding.cls == FailureClass.UNKNOWN) and weight >= oom_weight > 0:
            finding.notes.append("ranked below the out-of-memory error the text also holds: a process that exits "
                                 "after it exits of it")
            scored[i] = (oom_weight - 0.01, line, finding, kind)


# Out-of-memory kills of host RAM, not GPU memory (diagnose/layer_messages.json): their fixes are the host's
HOST_MEMORY_KILLS = frozenset({"ray.memory_monitor_kill", "ray.memory_pressure_summary"})


def _host_memory_kill(scanner: Scanner):
    """The host-RAM kill signature an out-of-memory event's line holds (one event per line: the line may also hold
    a generic needle such as ray.exceptions.OutOfMemoryError's class name), or None."""
    from oomguard.diagnose.scan import ALL_SIGNATURES
    kills = [sig for sig in ALL_SIGNATURES if sig.id in HOST_MEMORY_KILLS]
    for event in scanner.ooms:
        text = event.text.lower()
        for sig in kills:
            if sig.needle in text:
                return sig
    return None
_HOST_MEMORY_FIXES = [
    Fix("the node's host RAM ran out, not the GPU's", action="run fewer Ray workers/actors per node (more CPUs per "
        "task), or give the node more RAM"),
    Fix("host-side buffers grow with CPU offload, swap space and sleep mode",
        action="lower --cpu-offload-gb / --swap-space, or disable sleep mode"),
    Fix("Ray kills at 95% of host RAM by default", action="RAY_memory_usage_threshold raises the kill threshold "
        "(the kernel's OOM killer still applies)")]


# The kernel's OOM killer (diagnose/layer_messages.json os.*): host RAM ran out, most often with weights in it
KERNEL_OOM_KILLS = frozenset({"os.oom_killer_unit", "os.oom_kill_result", "os.oom_killed_process"})
_KERNEL_OOM_FIXES = [
    Fix("host RAM ran out, not the GPU's: less of the model in RAM", action="a smaller quantization, or more layers on "
        "the GPU (llama.cpp -ngl, Ollama num_gpu; vLLM: lower --cpu-offload-gb / --swap-space)"),
    Fix("the kernel kills the largest process when RAM and swap are full", action="add RAM or swap, or raise the "
        "container's memory limit (exit code 137 is its kill)")]


def _layers_in_host_ram(scored: list, facts: dict) -> None:
    """Ollama's placement line: what does not fit the GPUs runs from host RAM, unmapped where free RAM is short of
    the model (llm/server.go NewLlamaServer passes --no-mmap then), so the kernel kills the runner when the CPU's part
    nears the RAM and swap free. Ollama itself refuses only above them (its "requires more system memory" check)."""
    full, on_gpus = facts.get("memory_required_gib"), facts.get("gpu_required_gib")
    ram = facts.get("host_ram_free_gib")
    if not (full and on_gpus is not None and ram is not None):
        return
    in_ram, room = full - on_gpus, ram + (facts.get("host_swap_free_gib") or 0.0)
    if in_ram < 0.9 * room:
        return
    layers, offloaded = facts.get("model_layers"), facts.get("gpu_layers_offloaded")
    placed = f"{offloaded} of the model's {layers} layers" if layers and offloaded is not None else "part of the model"
    summary = (f"Ollama put {placed} on the GPU ({on_gpus:.1f} GiB); the other {in_ram:.1f} GiB of the "
               f"{full:.1f} GiB it needs go to host RAM, {'more than' if in_ram > room else 'nearly all of'} the "
               f"{room:.1f} GiB of RAM and swap free: the runner is killed when host memory runs out while it loads.")
    fixes = [Fix(f"the model, context included, must fit the {on_gpus:.1f} GiB on the GPU and the RAM free",
                 action=f"pull a smaller quantization or model (under about {on_gpus + 0.8 * room:.0f} GiB in all; "
                        f"under {on_gpus:.0f} GiB it runs on the GPU alone)"),
             Fix(f"{in_ram - 0.8 * room:.1f} GiB more host memory would hold the CPU's part",
                 action="close other programs, add swap or RAM"),
             Fix("a shorter context needs less memory on both", action="lower num_ctx")]
    weight = 0.8 if in_ram > room else 0.65
    for at, (other_weight, line, finding, kind) in enumerate(scored):
        if finding.cls == FailureClass.OOM_WEIGHTS_LOAD:   # the kill itself was read: these are its numbers
            finding.notes.append(summary)
            finding.fixes[:0] = fixes[:2]
            scored[at] = (max(weight, other_weight), line, finding, kind)
            return
    scored.append((weight, 0, Finding(FailureClass.OOM_WEIGHTS_LOAD, weight, summary, [], fixes,
                                      notes=["from Ollama's placement and system memory lines"]), "oom"))


def _known_regressions(scored: list, facts: dict) -> None:
    version = vllm.version_of(facts)
    if not version:
        return
    from oomguard.engines.vllm.releases import release
    for regression in release(version).regressions:
        for weight, _, finding, _ in scored:
            if finding.cls != regression.failure_class:
                continue
            if regression.needs_pipeline_parallel and not (facts.get("pipeline_parallel_size") or 1) > 1:
                continue
            finding.notes.append(regression.text)
            if regression.fixed_in:  # a real misbehaviour: report it as the engine's bug too
                scored.append((weight - 0.05, 0, Finding(
                    FailureClass.ENGINE_BUG, weight - 0.05, regression.text, list(finding.evidence),
                    [Fix("the check was fixed upstream", action=f"upgrade vLLM to {regression.fixed_in} or newer")]),
                    "bug"))
            break


def _fewer_gpus_than_ranks(scored: list, facts: dict) -> None:
    """The launch lets vLLM see fewer GPUs (CUDA_VISIBLE_DEVICES, docker's --gpus) than tensor x pipeline x data
    parallel ranks need, one GPU each (config/parallel.py world_size): whatever the error reads, that is its cause."""
    visible = vllm.first_number(facts.get("gpu_count"))
    tp, pp, dp = (int(vllm.first_number(facts.get(f"{kind}_parallel_size"), 1))
                  for kind in ("tensor", "pipeline", "data"))
    ranks = tp * pp * dp
    if not visible or ranks <= visible:
        return
    fixes = [Fix(f"one GPU per rank: expose {ranks}", action=f"set CUDA_VISIBLE_DEVICES (or docker --gpus) to {ranks} "
                                                             "GPUs")]
    fitting = 1 << (int(visible).bit_length() - 1)
    if tp > fitting:
        fixes.append(Fix(f"or fit the {int(visible)} GPU(s) vLLM can see", "--tensor-parallel-size", fitting))
    summary = (f"The launch exposes {int(visible)} GPU(s) to vLLM, but its parallel layout needs {ranks} "
               f"(tensor x pipeline x data parallel size), one GPU per rank.")
    scored.append((0.9, 0, Finding(FailureClass.TP_MISCONFIG, 0.9, summary, [], fixes,
                                   notes=["from the launch's GPU settings and parallel sizes"]), "error"))


def diagnose(scanner: Scanner, facts: dict) -> Diagnosis:
    findings = build_findings(scanner, facts)
    return Diagnosis(findings, facts.with_(warnings=warning_signs(facts)), scanner.lines)
