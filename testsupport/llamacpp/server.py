"""Start and stop a real `llama-server` process (for the tests and benchmarks).

    with LlamaServer(binary, model, ctx_size=2048, parallel=2) as server:
        urllib.request.urlopen(server.url + "/v1/models")

Flags used (llama.cpp vendored in llama-cpp-python 0.3.36, common/arg.cpp): `--host`, `--port`, `-m`,
`-c/--ctx-size` (the whole KV pool, shared by the slots), `-np/--parallel` (slots), `--metrics`, `-t/--threads`,
`--no-webui`, `--log-file`. With `--kv-unified` off (the default when `-np` is given) each slot gets
`ctx_size / parallel` tokens of context.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from testsupport import free_port


class LlamaServerError(RuntimeError):
    """llama-server did not start (the message carries the end of its log)."""


class LlamaServer:
    """A llama-server child process on a loopback port; a context manager that waits for /health."""

    def __init__(self, binary: str | os.PathLike, model: str | os.PathLike, ctx_size: int = 2048,
                 parallel: int = 1, port: int = 0, extra_args: Sequence[str] = (), *, host: str = "127.0.0.1",
                 threads: int | None = None, startup_timeout: float = 60.0, log_path: str | os.PathLike | None = None,
                 metrics: bool = True, alias: str | None = None, env: dict[str, str] | None = None):
        self.binary = Path(binary)
        self.model = Path(model)
        self.ctx_size = int(ctx_size)
        self.parallel = int(parallel)
        self.host = host
        self.requested_port = int(port)
        self.port = int(port)
        self.extra_args = list(extra_args)
        self.threads = threads
        self.startup_timeout = startup_timeout
        self.metrics = metrics
        self.alias = alias
        self.env = env
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path is not None else Path(
            tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    # ---------------------------------------------------------------- properties
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def argv(self) -> list[str]:
        args = [str(self.binary), "--host", self.host, "--port", str(self.port), "-m", str(self.model),
                "-c", str(self.ctx_size), "-np", str(self.parallel), "--no-webui"]
        if self.metrics:
            args.append("--metrics")
        if self.threads:
            args += ["-t", str(self.threads)]
        if self.alias:
            args += ["-a", self.alias]
        return args + self.extra_args

    def log_text(self, tail_chars: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text if tail_chars is None else text[-tail_chars:]

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> "LlamaServer":
        if self.running:
            return self
        if not self.binary.is_file():
            raise LlamaServerError(f"no llama-server binary at {self.binary}")
        if not self.model.is_file():
            raise LlamaServerError(f"no model file at {self.model}")
        attempts = 3 if self.requested_port == 0 else 1
        for attempt in range(attempts):
            if self.requested_port == 0:
                self.port = free_port(self.host)
            self._spawn()
            try:
                self._wait_healthy()
                return self
            except LlamaServerError:
                log = self.log_text()
                self.stop()
                bind_race = "bind" in log.lower() and ("address" in log.lower() or "port" in log.lower())
                if attempt + 1 < attempts and bind_race:
                    continue
                raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(self.argv()) + "\n").encode())
            log.flush()
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            assert self.process is not None
            code = self.process.poll()
            if code is not None:
                raise LlamaServerError(f"llama-server exited with code {code} before it was healthy "
                                       f"(log {self.log_path}):\n{self.log_text(3000)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:  # 503 while the model loads
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, ConnectionError, socket.timeout, OSError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise LlamaServerError(f"llama-server not healthy after {self.startup_timeout:.0f} s ({last}); "
                               f"log {self.log_path}:\n{self.log_text(3000)}")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code (None if it never started)."""
        proc, self.process = self.process, None
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
            except ProcessLookupError:
                pass
        return proc.returncode

    def kill(self) -> None:
        """Kill it hard, as a crash would (for tests of what a client sees when the server dies)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def cleanup(self) -> None:
        """Stop and remove the log file when we created it."""
        self.stop()
        if self._own_log:
            try:
                self.log_path.unlink()
            except OSError:
                pass

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<LlamaServer {self.url} ctx={self.ctx_size} np={self.parallel} {state} log={self.log_path}>"
