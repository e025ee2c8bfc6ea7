"""Build a CPU-only `llama-server` from the llama.cpp vendored in the `llama-cpp-python` source package.

The binary (and the vendored `models/ggml-vocab-llama-spm.gguf`, the vocabulary of the tiny test model) is
cached under `${OOMGUARD_CACHE:-~/.cache/oomguard}/llama-server/<version>/` and rebuilt only when missing.
A file lock keeps two processes (two pytest runs, xdist workers) from building at once: the second waits
and then finds the binary.

The cache is keyed by version and binary: each requested target is looked up on its own, and a build (one
configure, one compile) makes every tool of `ALL_TARGETS` the vendored tree has, not only the one asked for,
so the llama.cpp fit tools (`llama-fit-params`, `ggml-rpc-server`, `llama-quantize`, used to check the
llama.cpp tiering plan) cost one build with llama-server in CI. A cache made before these tools existed is
completed by one more build the first time a tool is asked for; llama-server is left as it is.

    python -m testsupport.llamacpp.build          # prints the binary's path, building it if needed
    python -m testsupport.llamacpp.build --target llama-fit-params --target ggml-rpc-server

The build needs pip (to fetch the sdist from the package index), CMake and a C/C++ compiler; about 7-12
minutes on 2 cores. Nothing is downloaded at build time besides the sdist: the web UI's prebuilt assets,
curl and OpenSSL are all switched off.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

from oomguard.cache import cache_root

# Newest llama-cpp-python whose vendored llama.cpp builds here (checked: 0.3.36, llama.cpp ggml 0.25.3).
PINNED_VERSION = "0.3.36"
SERVER_TARGET = "llama-server"
FIT_PARAMS_TARGET = "llama-fit-params"  # tools/fit-params in the same vendored tree
RPC_SERVER_TARGET = "ggml-rpc-server"    # tools/rpc: serves this machine's CPU as a remote ggml device
QUANTIZE_TARGET = "llama-quantize"       # tools/quantize
FIT_TARGETS = (FIT_PARAMS_TARGET, RPC_SERVER_TARGET, QUANTIZE_TARGET)
ALL_TARGETS = (SERVER_TARGET, *FIT_TARGETS)
_TARGET_FOLDERS = {SERVER_TARGET: "server", FIT_PARAMS_TARGET: "fit-params", RPC_SERVER_TARGET: "rpc",
                   QUANTIZE_TARGET: "quantize"}
VOCAB_NAME = "ggml-vocab-llama-spm.gguf"
LOCK_TIMEOUT_S = 45 * 60

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",          # portable across x86-64 machines with AVX2 (ggml's default variant)
    "-DGGML_CUDA=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",        # no npm
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # no download of the web UI at build time
    "-DBUILD_SHARED_LIBS=OFF",     # one self-contained binary that can be copied into the cache
    "-DGGML_RPC=ON",               # the RPC backend: ggml-rpc-server, and --rpc in the tools
)

Progress = Callable[[str], None]


class BuildError(RuntimeError):
    """llama-server could not be built; the message says why and where the log is."""


def install_dir(version: str = PINNED_VERSION) -> Path:
    return cache_root() / "llama-server" / version


def binary_path(version: str = PINNED_VERSION, target: str = SERVER_TARGET) -> Path:
    return install_dir(version) / target


def vocab_path(version: str = PINNED_VERSION) -> Path:
    return install_dir(version) / VOCAB_NAME


def cached(version: str = PINNED_VERSION, targets: tuple[str, ...] = (SERVER_TARGET,)) -> bool:
    """True when every requested binary and the vocabulary are already in the cache."""
    return vocab_path(version).is_file() and all(
        os.access(binary_path(version, t), os.X_OK) for t in targets)


def _quiet(_: str) -> None:
    pass


def _stderr(line: str) -> None:
    print(f"[llama-server build] {line}", file=sys.stderr, flush=True)


def missing_tools() -> list[str]:
    """Build tools that are not installed (empty when a build can be attempted)."""
    missing = [tool for tool in ("cmake",) if shutil.which(tool) is None]
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        missing.append("a C++ compiler (g++ or clang++)")
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        missing.append("a C compiler (gcc or clang)")
    return missing


@contextlib.contextmanager
def _locked(path: Path, progress: Progress, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout_s
        said = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    progress(f"another process is building llama-server (lock {path}); waiting")
                    said = True
                if time.monotonic() > deadline:
                    raise BuildError(f"gave up after {timeout_s:.0f} s waiting for the build lock {path}")
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(cmd: list[str], log: Path, progress: Progress, *, cwd: Path | None = None,
         every: float = 15.0) -> None:
    """Run a command, appending its output to `log`; report progress lines (ninja/make `[n/N]`) now and then."""
    progress("$ " + " ".join(cmd))
    tail: deque[str] = deque(maxlen=40)
    last = 0.0
    with open(log, "a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            line = line.rstrip()
            tail.append(line)
            now = time.monotonic()
            if line.startswith("[") and now - last >= every:
                progress(line[:160])
                last = now
        code = proc.wait()
    if code != 0:
        raise BuildError(f"`{' '.join(cmd[:4])} ...` failed with exit code {code}; full log: {log}\n"
                         + "\n".join(tail))


def _download_sdist(version: str, dest: Path, log: Path, progress: Progress) -> Path:
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          "--disable-pip-version-check", f"llama-cpp-python=={version}", "-d", str(dest)], log, progress)
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz")) + sorted(dest.glob("llama-cpp-python-*.tar.gz"))
    if not found:
        raise BuildError(f"pip downloaded no llama-cpp-python {version} source package into {dest}")
    return found[0]


def _unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # Python < 3.11.4 has no filter argument
            tar.extractall(dest)
    roots = [p for p in dest.iterdir() if p.is_dir()]
    for root in roots:
        source = root / "vendor" / "llama.cpp"
        if (source / "CMakeLists.txt").is_file():
            return source
    raise BuildError(f"{archive.name} has no vendor/llama.cpp/CMakeLists.txt")


def vendored_targets(source: Path) -> dict[str, bool]:
    """Which tools of interest the vendored llama.cpp defines (read from its CMake files)."""
    found = {}
    for target, folder in _TARGET_FOLDERS.items():
        cmake = source / "tools" / folder / "CMakeLists.txt"
        found[target] = cmake.is_file() and f"set(TARGET {target})" in cmake.read_text(errors="replace")
    return found


def build(version: str = PINNED_VERSION, *, targets: tuple[str, ...] = (SERVER_TARGET,), jobs: int = 2,
          progress: Progress = _stderr, keep_sources: bool = False, also: tuple[str, ...] = ALL_TARGETS) -> Path:
    """Build the targets into the cache unconditionally (under the lock); returns the first binary's path.

    The tools in `also` that the vendored tree defines are built in the same compile (they share libllama
    and ggml, so they add little); a requested target the tree lacks is an error."""
    missing = missing_tools()
    if missing:
        raise BuildError("cannot build llama-server: missing " + ", ".join(missing)
                         + " (Debian: apt-get install cmake g++)")
    dest = install_dir(version)
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob(".work-*"):  # left by a build that was killed (we hold the lock: nobody else builds)
        shutil.rmtree(stale, ignore_errors=True)
    log = dest / "build.log"
    log.write_text("")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=dest))
    try:
        progress(f"downloading llama-cpp-python {version} source package")
        archive = _download_sdist(version, work / "sdist", log, progress)
        progress(f"unpacking {archive.name}")
        source = _unpack(archive, work / "src")
        available = vendored_targets(source)
        for target in targets:
            if not available.get(target, True):
                raise BuildError(f"the llama.cpp vendored in llama-cpp-python {version} has no {target} target")
        requested = targets
        # the other tools come along when missing (an existing llama-server is not replaced)
        targets = tuple(dict.fromkeys([*targets, *(t for t in also if available.get(t) and not (dest / t).is_file())]))
        build_dir = work / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        progress(f"configuring with CMake ({'Ninja' if generator else 'default generator'})")
        _run(["cmake", "-S", str(source), "-B", str(build_dir), *generator, *CMAKE_FLAGS], log, progress)
        progress(f"compiling {', '.join(targets)} with {jobs} jobs (about 7-12 minutes on 2 cores)")
        _run(["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs),
              "--target", *targets], log, progress)
        for target in targets:
            candidates = [build_dir / "bin" / target, build_dir / "bin" / "Release" / target]
            built = next((c for c in candidates if c.is_file()), None)
            if built is None:
                raise BuildError(f"the build finished but produced no {target} binary; log: {log}")
            tmp = dest / f".{target}.tmp"
            shutil.copy2(built, tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, dest / target)
        tmp_vocab = dest / f".{VOCAB_NAME}.tmp"
        shutil.copy2(source / "models" / VOCAB_NAME, tmp_vocab)
        os.replace(tmp_vocab, dest / VOCAB_NAME)
        present = [t for t in ALL_TARGETS if (dest / t).is_file()]
        info = {"llama_cpp_python": version, "targets": present, "built_now": list(targets), "available_targets": available,
                "cmake_flags": list(CMAKE_FLAGS), "seconds": round(time.monotonic() - started, 1)}
        (dest / "BUILD_INFO.json").write_text(json.dumps(info, indent=2) + "\n")
        if keep_sources:
            kept = dest / "src"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.move(str(work / "src"), kept)
        progress(f"built {', '.join(targets)} in {time.monotonic() - started:.0f} s -> {dest}")
        return dest / requested[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_llama_server(version: str = PINNED_VERSION, *, targets: tuple[str, ...] = (SERVER_TARGET,),
                        jobs: int | None = None, progress: Progress | None = _stderr) -> Path:
    """Path of the cached llama-server binary, building it first when missing (never twice at once)."""
    progress = progress or _quiet
    if cached(version, targets):
        return binary_path(version, targets[0])
    jobs = jobs or int(os.environ.get("OOMGUARD_BUILD_JOBS", "0")) or min(2, os.cpu_count() or 1)
    with _locked(install_dir(version).parent / f"{version}.lock", progress):
        if cached(version, targets):  # built by whoever held the lock before us
            return binary_path(version, targets[0])
        return build(version, targets=targets, jobs=jobs, progress=progress)


def ensure_fit_tools(version: str = PINNED_VERSION, *, jobs: int | None = None,
                     progress: Progress | None = _stderr) -> dict[str, Path]:
    """Paths of llama-fit-params, ggml-rpc-server and llama-quantize, building them first when missing."""
    ensure_llama_server(version, targets=FIT_TARGETS, jobs=jobs, progress=progress)
    return {t: binary_path(version, t) for t in FIT_TARGETS}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m testsupport.llamacpp.build",
                                     description="Print the path of the cached llama-server, building it if needed.")
    parser.add_argument("--version", default=PINNED_VERSION, help=f"llama-cpp-python version (default {PINNED_VERSION})")
    parser.add_argument("--target", action="append", dest="targets",
                        help=f"CMake target to build (default {SERVER_TARGET}; repeatable, e.g. {FIT_PARAMS_TARGET})")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs (default: up to 2)")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    targets = tuple(args.targets or (SERVER_TARGET,))
    progress = _quiet if args.quiet else _stderr
    try:
        if args.force:
            with _locked(install_dir(args.version).parent / f"{args.version}.lock", progress):
                path = build(args.version, targets=targets, jobs=args.jobs or 2, progress=progress)
        else:
            path = ensure_llama_server(args.version, targets=targets, jobs=args.jobs, progress=progress)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for target in targets:
        print(path.parent / target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
