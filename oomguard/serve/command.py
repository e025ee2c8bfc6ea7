"""`oomguard serve`: plan, launch and guard an engine behind `oomguard proxy`, relaunching it with a safer
configuration when it runs out of memory."""

from __future__ import annotations

import argparse
import math
import sys

from oomguard.errors import UsageError

DESCRIPTION = """\
Plan, launch and guard an LLM engine; relaunch it with a safer configuration when it fails.

Plans a vLLM command first (refuses with exit 2 when it cannot start and no nearby configuration does; adjusts and
says so when one does), launches the engine on a loopback port, and serves `oomguard proxy` on --listen in front of
it, so clients keep one address while the engine restarts. Watches the engine's log (diagnose's scanner), its
/health, and GPU memory (NVML); on an exit, a crash or a hang it diagnoses the log and relaunches on the axis the
diagnosis points to (fewer sequences, fewer batched tokens, a shorter context, eager mode; llama.cpp: -c, -ngl,
a q8_0 KV cache), with backoff, up to --max-restarts.

Events are JSON lines on stderr; the engine's own log goes to stdout. Its own /status, /metrics and /health are on
--status-listen (default: the --listen port + 1).

exit codes: 0 stopped cleanly (SIGTERM/SIGINT: the proxy drains, then the engine stops), 1 gave up after
--max-restarts (or nothing left to lower), 2 bad input (including an engine command the engine refuses).

examples:
  oomguard serve --listen 0.0.0.0:8000 --state-dir /var/lib/oomguard --proxy-arg=--api-key-file=keys.txt \\
      -- vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 16384
  oomguard serve --listen 127.0.0.1:9000 -- llama-server -m model.gguf -c 8192 -ngl 99
  oomguard serve --listen 127.0.0.1:9000 -- oomguard simulate my-model --num-gpu-blocks 300 --crash-on-kv-exhaustion
  oomguard serve --status http://127.0.0.1:9001 --json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("engine", nargs=argparse.REMAINDER, metavar="-- ENGINE COMMAND",
                   help="vllm serve MODEL ..., python -m vllm.entrypoints.openai.api_server ..., llama-server ..., "
                        "or oomguard simulate MODEL ...")
    p.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT",
                   help="where clients connect: the proxy (default 127.0.0.1:8000)")
    p.add_argument("--status-listen", metavar="HOST:PORT",
                   help="serve's own /status and /metrics (default: the --listen host, its port + 1)")
    p.add_argument("--status", metavar="URL", help="print the state of a running serve (its status address), then exit")
    p.add_argument("--json", action="store_true", help="with --status: JSON instead of text")
    p.add_argument("--state-dir", metavar="DIR",
                   help="remember restarts, the last configuration that started and what each start measured here "
                        "(default $OOMGUARD_STATE_DIR); start and plan from them next time")
    p.add_argument("--max-restarts", type=int, default=5, metavar="N", help="give up after N restarts (default 5)")
    p.add_argument("--gpu", metavar="NAME", help="the GPU for planning (default: NVML's, or the command's --gpu)")
    p.add_argument("--vllm-version", metavar="X.Y.Z", help="the vLLM version to plan for (default: newest modelled)")
    p.add_argument("--restart-backoff", type=float, default=1.0, metavar="S",
                   help="seconds before the first relaunch, doubling on each failure in a row up to 30 (default 1)")
    p.add_argument("--ready-timeout", type=float, default=900.0, metavar="S",
                   help="seconds a launch may take to answer /health before it is killed (default 900)")
    p.add_argument("--hang-timeout", type=float, default=30.0, metavar="S",
                   help="kill a started engine that has not answered /health for this long (default 30)")
    p.add_argument("--health-interval", type=float, default=1.0, metavar="S", help="seconds between /health polls")
    p.add_argument("--gpu-poll", type=float, default=60.0, metavar="S", help="seconds between NVML reads (default 60)")
    p.add_argument("--alert-at", type=float, default=0.85, metavar="FRACTION",
                   help="alert when a GPU's used memory reaches this fraction (default 0.85)")
    p.add_argument("--on-alert", metavar="CMD",
                   help="shell command run on an alert (env: OOMGUARD_GPU_INDEX, OOMGUARD_GPU_USED_FRACTION, ...)")
    p.add_argument("--queue-timeout", type=float, default=60.0, metavar="S",
                   help="seconds the proxy holds a request (through a restart) before 429 (default 60)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGTERM, seconds the proxy may take to finish before it is killed (default 30)")
    p.add_argument("--proxy-arg", action="append", default=[], metavar="ARG",
                   help="an extra argument for `oomguard proxy` (repeatable), e.g. --proxy-arg=--api-key-file=F")
    p.add_argument("--no-plan", action="store_true", help="launch the command as given, without the planner")


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"{name} must be a positive number of seconds (got {value})")


def run(args: argparse.Namespace) -> int:
    if args.status:
        from .status import print_status
        return print_status(args.status, args.json)
    words = list(args.engine)
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        raise UsageError("give the engine command after `--`, e.g. `oomguard serve -- vllm serve MODEL`")
    if words[0].startswith("-"):
        raise UsageError(f"serve's options go before `--`; the engine command after it (got {words[0]!r})")
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more (got {args.max_restarts})")
    for name in ("restart_backoff", "ready_timeout", "hang_timeout", "health_interval", "gpu_poll", "queue_timeout",
                 "drain_timeout"):
        _positive("--" + name.replace("_", "-"), getattr(args, name), allow_zero=name == "restart_backoff")
    if not 0 < args.alert_at <= 1:
        raise UsageError(f"--alert-at must be a fraction in (0, 1] (got {args.alert_at})")
    from oomguard.proxy.command import parse_listen
    listen = parse_listen(args.listen)
    if listen[1] == 0:
        raise UsageError("--listen needs a fixed port (clients must know it)")
    status_listen = parse_listen(args.status_listen) if args.status_listen else (listen[0], listen[1] + 1)
    if status_listen == listen:
        raise UsageError("--status-listen must differ from --listen")

    from .engine import parse_engine_command
    engine = parse_engine_command(words)
    gpu = args.gpu or _command_gpu(engine)

    from oomguard.plan.measured import state_dir as chosen_state_dir
    from .supervisor import ServeConfig, Supervisor, emit
    chosen = chosen_state_dir(args.state_dir)
    state_dir = str(chosen) if chosen else None
    if state_dir:
        from .state import StateDir
        remembered = StateDir(state_dir).last_good(engine.key())
        if remembered is not None and remembered != engine.flags:
            emit("remembered_configuration", flags=remembered, state_dir=state_dir)
            engine = type(engine)(**{**engine.__dict__, "flags": remembered})
    if not args.no_plan and engine.is_vllm_like:
        from .plancheck import check
        verdict = check(engine, gpu, args.vllm_version, state_dir)
        if verdict.verdict == "fails":
            raise UsageError(verdict.note)
        if verdict.verdict == "adjusted":
            print(f"oomguard serve: {verdict.note}", file=sys.stderr)
            engine = engine.with_flags(verdict.changes)
        emit("plan", verdict=verdict.verdict, note=verdict.note, flags=engine.flags)

    import shutil
    program = engine.argv()[0]
    if shutil.which(program) is None:
        raise UsageError(f"cannot run the engine {program!r}: not found (or not executable)")
    proxy_args = ["--queue-timeout", str(args.queue_timeout), *args.proxy_arg]
    config = ServeConfig(engine=engine, listen=listen, status_listen=status_listen, state_dir=state_dir,
                         max_restarts=args.max_restarts, restart_backoff=args.restart_backoff,
                         ready_timeout=args.ready_timeout, hang_timeout=args.hang_timeout, gpu_poll=args.gpu_poll,
                         alert_at=args.alert_at, on_alert=args.on_alert, health_interval=args.health_interval,
                         drain_timeout=args.drain_timeout, proxy_args=tuple(proxy_args), planner_gpu=gpu,
                         vllm_version=args.vllm_version)
    import asyncio
    return asyncio.run(Supervisor(config).run())


def _command_gpu(engine) -> str | None:
    words = list(engine.extra)
    for i, w in enumerate(words):
        if w == "--gpu" and i + 1 < len(words):
            return words[i + 1]
        if w.startswith("--gpu="):
            return w.split("=", 1)[1]
    return None
