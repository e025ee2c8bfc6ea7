"""Ask llama.cpp's own fit logic (`llama-fit-params`, common/fit.cpp) for a layer split on a device of known size.

A CPU-only machine has no GPU to fit to, so the device is emulated: `ggml-rpc-server` serves this machine's CPU
as a remote ggml device, which llama.cpp treats like a GPU (layers, KV cache and compute buffers are placed on
it). Its memory is what ggml's CPU backend reports: free = total = physical RAM (ggml-cpu.cpp
ggml_backend_cpu_device_get_memory), a fixed number, so a fit target (margin) of RAM - D MiB makes
llama-fit-params fit to exactly D MiB. `llama-fit-params --fit-print on` prints llama.cpp's own per-device
memory breakdown (model, context, compute; MiB) for a given -ngl.

The models are loaded with no_alloc: nothing is allocated and no tensor data is read, so shape-only GGUFs
(`shapegguf.py`) of full-size models work. The RPC device differs from a CUDA GPU in its compute buffers
(ggml-cuda's own kernels and its offload of large-batch matmuls), so this checks the split arithmetic, not
CUDA's exact scratch sizes.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

MiB = 1 << 20


def host_memory_bytes() -> int:
    """What ggml's CPU device reports as its total and free memory on Linux (sysconf pages x page size)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def rpc_device(rpc_server: Path, *, threads: int = 1, timeout_s: float = 30.0) -> Iterator[str]:
    """Start ggml-rpc-server on a free loopback port; yields its endpoint ("127.0.0.1:PORT")."""
    port = _free_port()
    proc = subprocess.Popen([str(rpc_server), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ggml-rpc-server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ggml-rpc-server did not listen on port {port} within {timeout_s:.0f} s")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class FitResult:
    n_ctx: int
    n_gpu_layers: int      # -1 (llama.cpp's "all") is reported as n_layer + 1 by `fit_layers`
    overrides: str         # -ot patterns llama-fit-params printed (MoE partial layers), "" when none
    stdout: str
    stderr: str


def _context_args(n_ctx: int, n_parallel: int, cache_type: str, flash_attn: bool) -> list[str]:
    return ["-c", str(n_ctx), "-np", str(n_parallel), "-ctk", cache_type, "-ctv", cache_type,
            "-fa", "on" if flash_attn else "off"]


def fit_layers(fit_params: Path, model: Path, endpoint: str, *, device_bytes: int, n_ctx: int, n_parallel: int = 1,
               cache_type: str = "f16", flash_attn: bool = False, n_layer: int, timeout_s: float = 300) -> FitResult:
    """llama-fit-params' -ngl for a device with `device_bytes` free (to within 1 MiB below, see module doc)."""
    margin_mib = (host_memory_bytes() - device_bytes) // MiB
    if margin_mib < 0:
        raise ValueError("the emulated device cannot be larger than this machine's RAM")
    cmd = [str(fit_params), "--rpc", endpoint, "-m", str(model), *_context_args(n_ctx, n_parallel, cache_type, flash_attn),
           "-fitt", str(margin_mib)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-fit-params failed ({proc.returncode}): {proc.stderr[-3000:]}")
    m = re.search(r"-c (\d+) -ngl (-?\d+)(?: -ot \"([^\"]*)\")?", proc.stdout)
    if not m:
        raise RuntimeError(f"unexpected llama-fit-params output: {proc.stdout!r}")
    ngl = int(m.group(2))
    return FitResult(int(m.group(1)), n_layer + 1 if ngl < 0 else ngl, m.group(3) or "", proc.stdout, proc.stderr)


def fit_print(fit_params: Path, model: Path, endpoint: str | None, *, n_gpu_layers: int, n_ctx: int,
              n_parallel: int = 1, cache_type: str = "f16", flash_attn: bool = False, extra: tuple[str, ...] = (),
              timeout_s: float = 300) -> dict[str, tuple[int, int, int]]:
    """llama.cpp's memory breakdown for a given -ngl: device name -> (model, context, compute) in MiB."""
    cmd = [str(fit_params), "-m", str(model), "-ngl", str(n_gpu_layers),
           *_context_args(n_ctx, n_parallel, cache_type, flash_attn), *extra, "--fit-print", "on"]
    if endpoint:
        cmd[1:1] = ["--rpc", endpoint]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-fit-params --fit-print failed ({proc.returncode}): {proc.stderr[-3000:]}")
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            out[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
    if not out:
        raise RuntimeError(f"unexpected llama-fit-params --fit-print output: {proc.stdout!r}")
    return out
