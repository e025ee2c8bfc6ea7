"""Run `oomguard simulate` as a child process (for tests, and for supervisors that must see it die).

    with SimulatorProcess(num_gpu_blocks=400, max_model_len=2048, speed=100) as sim:
        sim.url                      # http://127.0.0.1:PORT (it picked a free port and said so in its log)
        sim.output()                 # what it printed (startup lines; the OOM traceback after a crash)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

_LISTEN = re.compile(r"Starting vLLM API server on http://([^:\s]+):(\d+)")


class SimulatorError(RuntimeError):
    pass


class SimulatorProcess:
    def __init__(self, model: str = "sim-model", *, num_gpu_blocks: int | None = 1000, max_model_len: int = 4096,
                 block_size: int = 16, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 speed: float = 100.0, vllm_version: str | None = None, gpu: str | None = None,
                 crash_on_kv_exhaustion: bool = False, extra_args: Sequence[str] = (), host: str = "127.0.0.1",
                 startup_timeout: float = 30.0, log_path: str | os.PathLike | None = None):
        args = [sys.executable, "-m", "oomguard", "simulate", model, "--host", host, "--port", "0",
                "--speed", str(speed), "--max-model-len", str(max_model_len), "--block-size", str(block_size)]
        if num_gpu_blocks is not None:
            args += ["--num-gpu-blocks", str(num_gpu_blocks)]
        if max_num_seqs is not None:
            args += ["--max-num-seqs", str(max_num_seqs)]
        if max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
        if vllm_version:
            args += ["--vllm-version", vllm_version]
        if gpu:
            args += ["--gpu", gpu]
        if crash_on_kv_exhaustion:
            args.append("--crash-on-kv-exhaustion")
        self.argv = args + list(extra_args)
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="oomguard-sim-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None
        self.host, self.port = host, 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def start(self) -> "SimulatorProcess":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            text = self.output()
            match = _LISTEN.search(text)
            if match and "Application startup complete" in text:
                self.port = int(match.group(2))
                if self._healthy():
                    return self
            if self.process.poll() is not None:
                raise SimulatorError(f"oomguard simulate exited with code {self.process.returncode}:\n{text[-3000:]}")
            time.sleep(0.05)
        self.stop()
        raise SimulatorError(f"oomguard simulate did not start in {self.startup_timeout} s:\n{self.output()[-3000:]}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait(self, timeout: float | None = None) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        return proc.returncode

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> "SimulatorProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
