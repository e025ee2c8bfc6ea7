"""The words each failure class is told in: the fallback for text that holds no message oomguard knows.

A signature needs the engine's exact wording; a failure told in other words (a wrapper's own message, a newer
release's rewording, a person's summary) matches none. Each class is also recognisable by the few terms its
failures cannot be told without: a context that is exceeded, a model that is not found, a chat template, a
quantization scheme, a compute capability, a tensor-parallel size, NCCL, a refused connection, another process's
memory, an assertion. The terms below are read from what each class is (../shared/data/README.md's definitions and
the engines' own messages for it), not from any report; every one must name its class's subject, so that a word
common to all failures ("error", "failed", "model") counts for none.
"""

from __future__ import annotations

import re
from typing import Iterable

from oomguard.failures import FailureClass

C = FailureClass

LEXICON: dict[str, tuple[str, ...]] = {
    C.CONTEXT_TOO_LONG: (r"context (?:window|length|size)", r"max(?:imum)?[_ ]model[_ ]len", r"too many tokens",
                         r"(?:prompt|input|request|messages?)\b[^.]{0,40}\b(?:too long|longer than|exceeds?)",
                         r"\bn_ctx\b", r"exceeds? (?:the )?(?:available )?context"),
    C.MODEL_ACCESS: (r"\bnot found\b", r"no such file", r"does not exist", r"\b40[134]\b", r"invalid magic",
                     r"(?:unable|failed|could not|cannot|can't) (?:to )?(?:load|open|find|read|download) (?:the )?model",
                     r"\brepo(?:sitory)?\b", r"permission denied", r"\bggml(?:v\d)?\b", r"manifest"),
    C.TOKENIZER_CHAT_TEMPLATE: (r"chat[_ -]?template", r"\bjinja", r"\btokeni[sz]", r"conversation roles",
                                r"\b[be]os token"),
    C.QUANTIZATION_MISMATCH: (r"quanti[sz]", r"\bawq\b", r"\bgptq\b", r"bitsandbytes", r"\bfp8\b", r"marlin",
                              r"compressed[-_]tensors", r"\bw\d+a\d+\b", r"\bmxfp4|nvfp4\b"),
    C.DTYPE_CAPABILITY: (r"compute capability", r"(?<![/\w])sm_?\d{2,3}\b", r"\bbfloat16\b|\bbf16\b", r"kernel image",
                         r"no operator found", r"\b(?:volta|turing|pascal|blackwell|ampere)\b",
                         r"not supported (?:on|by|for) (?:this |the |your )?(?:gpu|device|hardware|architecture)",
                         r"cuda arch"),
    C.TP_MISCONFIG: (r"tensor[-_ ]parallel", r"divisible", r"placement group", r"world[_ ]size",
                     r"pipeline[-_ ]parallel", r"exceeds? (?:the )?(?:available|number of) gpus",
                     r"\b(?:tp|pp)[_ ]?size\b"),
    C.NCCL: (r"\bnccl\b", r"all[_ ]?reduce|all[_ ]?gather|collective", r"\bp2p\b|peer[- ]to[- ]peer",
             r"process ?group", r"\bgloo\b", r"rendezvous"),
    C.CONNECTION: (r"connection (?:refused|reset|error|aborted|closed)", r"\brefused\b", r"unreachable",
                   r"name or service not known|getaddrinfo|temporary failure in name resolution",
                   r"\b50[234]\b", r"bad gateway", r"(?:read|connect) time ?out", r"\bendpoints?\b",
                   r"\b404\b[^.\n]{0,60}\b(?:endpoints?|routes?|url|path)\b"),
    C.GPU_MEMORY_IN_USE: (r"(?:other|another) process", r"already (?:in use|occupied|allocated)", r"\boccupied\b",
                          r"free memory on device",
                          # processes outliving their run and the memory they keep
                          r"(?:orphan|zombie|leftover|stale|lingering)\w* (?:\S+ ){0,2}process",
                          r"(?:memory|vram|gpu)\b[^.]{0,30}\bnot (?:be(?:en|ing) )?(?:released|freed)",
                          r"占用", r"(?:未|没有|没)(?:得到)?释放"),
    C.OOM_RUNTIME: (r"out of memory", r"\boom\b", r"(?:failed|unable|cannot) (?:to )?allocate", r"alloc(?:ation)? failed",
                    r"not enough memory|insufficient memory"),
    C.ENGINE_BUG: (r"assert", r"segmentation fault|segfault|core dumped|sigsegv|sigabrt", r"illegal memory access",
                   r"device-side assert|index out of bounds", r"\bnan\b", r"\bbug\b", r"not implemented|unimplemented|not (?:yet )?supported yet",
                   r"\bcrash", r"unknown model architecture|architectures? .{0,40}not supported"),
}

_COMPILED = {cls: tuple(re.compile(p, re.IGNORECASE) for p in terms) for cls, terms in LEXICON.items()}
_ORDER = {cls: i for i, cls in enumerate(LEXICON)}
# what is not the failure's words: a traceback's frame lines (function and file names) and any path or file name
# (a model directory called "...-GPTQ-Int4" says nothing of why it failed)
_FRAME_LINE = re.compile(r'File "[^"]*", line \d+')
_PATHLIKE = re.compile(r"<?\S*[/\\]\S*>?")


def words_of(lines: Iterable[str]) -> str:
    """The error lines without frame lines and paths: the text the terms are looked for in."""
    return "\n".join(_PATHLIKE.sub(" ", line) for line in lines if not _FRAME_LINE.search(line))


def read(lines: Iterable[str]) -> list[tuple[str, int, list[str]]]:
    """(class, how many of its terms the lines hold, the words found), most terms first, ties in the table's order;
    classes with none left out. A term counts once however often it recurs (a repeated line is one piece of
    evidence)."""
    text = words_of(lines)
    found = []
    for cls, terms in _COMPILED.items():
        words = []
        for term in terms:
            match = term.search(text)
            if match:
                words.append(match.group(0))
        if words:
            found.append((cls, len(words), words))
    return sorted(found, key=lambda item: (-item[1], _ORDER[item[0]]))
