"""Byte units. Bytes are integers internally; GiB (2**30) only at the edges, as vLLM prints."""

GiB = 1 << 30
MiB = 1 << 20


def gib(n_bytes: float) -> float:
    return n_bytes / GiB


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as vLLM's utils.cdiv."""
    return -(-a // b)
