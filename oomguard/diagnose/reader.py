"""Lines from files or streams of any size, in bounded memory: bytes in, clean text lines out.

Decodes UTF-8 with errors="replace", strips ANSI colour/cursor codes and carriage returns (CRLF and tqdm-style
redraws), drops NUL and other control bytes, and caps each line at MAX_LINE characters (the rest of an overlong
line is skipped without being held in memory). Line numbers count newline-terminated lines from 1.
"""

from __future__ import annotations

import re
from typing import BinaryIO, Iterator

MAX_LINE = 8192          # characters kept of one line
CHUNK = 1 << 16          # bytes read at a time

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean(text: str) -> str:
    """ANSI codes and control characters out; a carriage return keeps what was drawn last (tqdm, CRLF)."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    if _CONTROL.search(text):
        text = _CONTROL.sub(" ", text)
    return text


def iter_lines(stream: BinaryIO, max_line: int = MAX_LINE) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of a binary stream; memory stays under CHUNK + 4 x max_line bytes."""
    limit = max_line * 4  # bytes kept of one line (UTF-8 is at most 4 bytes a character)
    buffer = b""
    overflow = False      # the current line already passed the limit: skip to its end
    number = 0
    while True:
        chunk = stream.read(CHUNK)
        if not chunk:
            break
        if isinstance(chunk, str):  # a text stream slipped in: be forgiving
            chunk = chunk.encode("utf-8", "replace")
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                rest = chunk[start:]
                if not overflow:
                    buffer += rest
                    if len(buffer) > limit:
                        buffer, overflow = buffer[:limit], True
                break
            if not overflow:
                buffer += chunk[start:end]
            number += 1
            yield number, _decode(buffer, max_line)
            buffer, overflow = b"", False
            start = end + 1
    if buffer or overflow:
        number += 1
        yield number, _decode(buffer, max_line)


def iter_text_lines(text: str, max_line: int = MAX_LINE) -> Iterator[tuple[int, str]]:
    """The same for text already in memory (tests, the benchmark, pasted snippets)."""
    for number, line in enumerate(text.split("\n"), 1):
        yield number, clean(line[: max_line * 2])[:max_line]


def _decode(raw: bytes, max_line: int) -> str:
    return clean(raw[: max_line * 4].decode("utf-8", errors="replace"))[:max_line]
