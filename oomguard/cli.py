"""The `oomguard` command line: a thin shell that finds the subcommand, parses, runs, and maps errors to exit codes.

Exit codes: 0 ok / fits, 1 a verdict the user should act on (does not fit, findings), 2 bad input.
Each subcommand lives in `oomguard/<area>/command.py` with `add_arguments(parser)` and `run(args) -> int`;
only the chosen one is imported, so `oomguard --help` stays fast.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

from oomguard import __version__
from oomguard.errors import UsageError

COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("oomguard.plan.command", "predict vLLM's startup memory before launch; recommend a config for a workload"),
    "diagnose": ("oomguard.diagnose.command", "find the root cause and the fix in a vLLM/llama.cpp log, traceback or /metrics"),
    "loadtest": ("oomguard.loadtest.command", "peak-load test an OpenAI-compatible server while watching its /metrics"),
    "simulate": ("oomguard.simulate.command", "run a vLLM-compatible simulated server for what-if runs"),
    "proxy": ("oomguard.proxy.command", "OpenAI-compatible gateway with KV-aware admission control"),
    "serve": ("oomguard.serve.command", "launch an engine with a planned config behind the proxy; relaunch it safer "
                                        "after an OOM"),
}

EXIT_OK, EXIT_VERDICT, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 70


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error that points at --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _top_help() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        f"usage: oomguard <command> [options]        (oomguard {__version__})",
        "",
        "Keeps LLM inference servers from running out of GPU memory.",
        "",
        "commands:",
        *(f"  {name.ljust(width)}  {summary}" for name, (_, summary) in COMMANDS.items()),
        "",
        "Run `oomguard <command> --help` for a command's options.",
    ]
    return "\n".join(lines)


def _run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_top_help())
        return EXIT_OK
    if argv[0] in ("-V", "--version"):
        print(f"oomguard {__version__}")
        return EXIT_OK
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"did you mean `oomguard {close[0]}`?" if close else "run `oomguard --help` for the list"
        raise UsageError(f"unknown command {name!r}: {hint}")
    module_name, summary = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = _Parser(prog=f"oomguard {name}", description=getattr(module, "DESCRIPTION", summary),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    return int(module.run(args) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _run(argv)
    except UsageError as exc:
        print(f"oomguard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("oomguard: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:
        if exc.filename is None:
            return _internal(exc)
        # a path that cannot be used (too long, missing, a directory, no permission): the user's to fix
        name = str(exc.filename)
        shown = name if len(name) <= 120 else name[:120] + "..."
        print(f"oomguard: error: {exc.strerror or exc}: {shown!r}", file=sys.stderr)
        return EXIT_USAGE
    except RecursionError:   # JSON or text nested beyond what the parsers take
        print("oomguard: error: the input is nested too deeply to read (thousands of levels): check the file",
              file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug of ours: one line by default, the traceback on request
        return _internal(exc)


def _internal(exc: BaseException) -> int:
    if os.environ.get("OOMGUARD_DEBUG"):
        raise exc
    print(f"oomguard: internal error: {type(exc).__name__}: {exc} "
          "(set OOMGUARD_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
