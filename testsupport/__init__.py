"""What the tests and benchmarks run against, kept out of the shipped package (pyproject finds `oomguard*` only).

- `testsupport.upstream`: the fake OpenAI-compatible engine (raw asyncio; in-process or `python -m`)
- `testsupport.llamacpp`: a real llama-server built from the llama-cpp-python sdist, its process wrapper, and
  the tiny random-weight GGUF it serves
- `testsupport.hub`: a local stand-in for the Hugging Face hub's file endpoints

Imported from the repository root: pytest puts it on the path (pyproject `pythonpath`), `python -m` from the root
does, and the benchmarks add the root themselves.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Callable


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (for a server that must be told its port before it starts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> None:
    """Poll `predicate` on the running loop until it holds; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)
