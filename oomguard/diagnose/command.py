"""`oomguard diagnose`: thin shell over the log pipeline, the metric rules and the renderers."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """Find the root cause and the fix, with numbers, in a vLLM or llama.cpp log, a traceback, a client
error, or a live Prometheus /metrics endpoint.

Exit status: 0 nothing wrong, 1 findings, 2 bad input (a missing file, an unreadable URL).

examples:
  oomguard diagnose server.log
  docker logs vllm 2>&1 | oomguard diagnose -
  oomguard diagnose crash.txt --command "vllm serve Qwen/Qwen2.5-7B-Instruct --max-model-len 32768" --json
  oomguard diagnose --metrics http://localhost:8000/metrics --watch 60
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", metavar="FILE", help="log files ('-' or nothing: standard input)")
    parser.add_argument("--metrics", metavar="URL", help="a live Prometheus endpoint (vLLM, llama-server, SGLang)")
    parser.add_argument("--watch", type=float, metavar="SECONDS", help="with --metrics: sample over a window")
    parser.add_argument("--interval", type=float, metavar="SECONDS", help="with --watch: seconds between scrapes")
    parser.add_argument("--command", metavar="'vllm serve ...'",
                        help="the launch command, when the log does not show the settings")
    parser.add_argument("--gpu", metavar="NAME", help="the GPU, when the log does not name it (as nvidia-smi prints it)")
    parser.add_argument("--vllm-version", metavar="X.Y.Z", help="the vLLM version, when the log does not print it")
    parser.add_argument("--no-planner", action="store_true", help="do not check fixes with the planner")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from oomguard.diagnose import render
    from oomguard.errors import UsageError

    if args.metrics is not None and not args.metrics.strip():
        raise UsageError("--metrics needs the server's base URL or /metrics URL, e.g. http://127.0.0.1:8000")
    if args.metrics:
        if args.files:
            raise UsageError("give log files or --metrics URL, not both")
        if args.watch is not None and args.watch <= 0:
            raise UsageError("--watch takes a positive number of seconds")
        from oomguard.diagnose.metrics_watch import diagnose_metrics
        diagnosis = diagnose_metrics(args.metrics, args.watch, args.interval)
    else:
        if args.watch is not None:
            raise UsageError("--watch needs --metrics URL")
        diagnosis = _diagnose_files(args)
        if not diagnosis.facts.get("lines_read"):
            raise UsageError("the input is empty: give the server's log (docker logs NAME 2>&1 | oomguard diagnose -)")
    if args.json:
        render.print_json(diagnosis)
    else:
        render.print_human(diagnosis)
    return 1 if diagnosis.findings else 0


def _command(text: str | None) -> dict | None:
    if not text:
        return None
    from oomguard.diagnose.facts import parse_serve_command
    from oomguard.errors import UsageError
    command = parse_serve_command(text)
    if command is None:
        raise UsageError("--command takes the launch line, e.g. --command \"vllm serve MODEL --max-model-len 8192\"")
    return command


def _diagnose_files(args: argparse.Namespace):
    import os

    from oomguard.diagnose.pipeline import diagnose_sources
    from oomguard.errors import UsageError

    names = args.files or ["-"]
    if names == ["-"] and sys.stdin is not None and sys.stdin.isatty():
        raise UsageError("give a log file, or pipe one in: docker logs vllm 2>&1 | oomguard diagnose -")
    for name in names:
        if name == "-":
            continue
        if not os.path.exists(name):
            raise UsageError(f"{name}: no such file")
        if os.path.isdir(name):
            raise UsageError(f"{name} is a directory; give the log file inside it")
        if not os.access(name, os.R_OK):
            raise UsageError(f"{name}: permission denied")
    command = _command(args.command)
    given = _given_facts(args)

    def sources():
        for name in names:
            if name == "-":
                stream = getattr(sys.stdin, "buffer", None)
                if stream is None:
                    raise UsageError("standard input is not readable")
                yield "-", stream
            else:
                try:
                    with open(name, "rb") as stream:
                        yield name, stream
                except OSError as exc:
                    raise UsageError(f"{name}: {exc.strerror or exc}") from None

    return diagnose_sources(sources(), command=command, use_planner=not args.no_planner, given=given)


def _given_facts(args: argparse.Namespace) -> dict:
    """What the user says of the setup (--gpu, --vllm-version): used where the log does not say it itself."""
    given: dict = {}
    if args.gpu:
        from oomguard.errors import UsageError
        from oomguard.gpus.catalog import resolve_gpu
        try:
            gpu = resolve_gpu(args.gpu)
        except UsageError:
            raise UsageError(f"--gpu {args.gpu!r} is not a GPU oomguard knows; see oomguard plan --list-gpus") from None
        cc = gpu.compute_capability
        given.update(gpu_name=gpu.name, total_gpu_memory_gib=round(gpu.total_memory_bytes / 2**30, 2),
                     compute_capability=f"{cc[0]}.{cc[1]}")
    if args.vllm_version:
        from oomguard.engines.vllm.versions import parse_version
        parse_version(args.vllm_version)   # one line and exit 2 for a version it cannot read
        given["vllm_version"] = args.vllm_version
    return given
