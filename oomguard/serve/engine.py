"""The engine command `oomguard serve` runs, as a frozen value: which engine, its model, the memory settings serve may
change (by name), and the user's other words verbatim. Rewriting the listen address and the settings is pure.

Kinds: "vllm" (`vllm serve MODEL ...` or `python -m vllm.entrypoints.openai.api_server --model MODEL ...`),
"simulate" (`oomguard simulate MODEL ...`, vLLM's flags, a stand-in where no GPU is present) and "llamacpp"
(`llama-server -m FILE ...`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field, replace

from oomguard.errors import UsageError

VLLM_MODULE = "vllm.entrypoints.openai.api_server"

# llama-server's memory settings serve may change: dest -> its spellings (the first is the one serve writes)
LLAMA_FLAGS: dict[str, tuple[str, ...]] = {
    "ctx_size": ("-c", "--ctx-size"),
    "n_gpu_layers": ("-ngl", "--n-gpu-layers", "--gpu-layers"),
    "cache_type_k": ("-ctk", "--cache-type-k"),
    "cache_type_v": ("-ctv", "--cache-type-v"),
    "ubatch_size": ("-ub", "--ubatch-size"),
    "batch_size": ("-b", "--batch-size"),
}
_LLAMA_INT = {"ctx_size", "n_gpu_layers", "ubatch_size", "batch_size"}
_ADDRESS = {"--host": "host", "--port": "port"}
# `oomguard simulate`'s own options (simulate/command.py), kept verbatim: vLLM's flag parser would read `--gpu` as an
# abbreviation of its --gpu-memory-utilization
_SIMULATE_OWN = {"--gpu": True, "--gpu-count": True, "--model-config": True, "--vllm-version": True,
                 "--num-gpu-blocks": True, "--num-gpu-blocks-override": True, "--speed": True,
                 "--crash-on-kv-exhaustion": False}


@dataclass(frozen=True)
class EngineCommand:
    kind: str                          # "vllm" | "simulate" | "llamacpp"
    launcher: tuple[str, ...]          # the words before the model/flags: ("vllm", "serve"), (python, "-m", module)
    model: str | None
    flags: dict = field(default_factory=dict)      # vLLM dests, or LLAMA_FLAGS dests
    extra: tuple[str, ...] = ()        # the user's other words, verbatim, without --host/--port
    model_as_flag: bool = False        # python -m ...api_server takes --model MODEL

    @property
    def is_vllm_like(self) -> bool:
        return self.kind in ("vllm", "simulate")

    def with_flags(self, changes: dict) -> "EngineCommand":
        return replace(self, flags={**self.flags, **changes})

    def argv(self, host: str = "127.0.0.1", port: int | None = None) -> list[str]:
        """The command line to run, listening on host:port (the user's --host/--port were taken out)."""
        words = list(self.launcher)
        if self.kind == "llamacpp":
            for dest, value in self.flags.items():
                if value is not None:
                    words += [LLAMA_FLAGS[dest][0], str(value)]
            words += list(self.extra)
        else:
            from oomguard.engines.vllm.flags import vllm_args
            if self.model is not None:
                words += ["--model", self.model] if self.model_as_flag else [self.model]
            words += vllm_args(self.flags, self.extra)
        if port is not None:
            words += ["--host", host, "--port", str(port)]
        return words

    def display(self) -> str:
        import shlex
        return " ".join(shlex.quote(w) for w in self.argv())

    def key(self) -> str:
        """Names the user's command (not serve's changes to it): the state directory remembers per key."""
        text = json.dumps([self.kind, self.launcher[-2:], self.model, sorted(self.extra)], default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "flags": dict(self.flags), "argv": self.argv()}


def parse_engine_command(words: list[str]) -> EngineCommand:
    """Read the engine command after `--`; raises UsageError with one line when it is not one serve runs."""
    words = [w for w in words if w != "\\"]
    if not words:
        raise UsageError("give the engine command after `--`, e.g. `oomguard serve -- vllm serve MODEL`")
    first = os.path.basename(words[0])
    if first == "llama-server" or first.startswith("llama-server"):
        return _parse_llama(words)
    if first == "oomguard" or words[1:3] == ["-m", "oomguard"]:
        rest = words[1:] if first == "oomguard" else words[3:]
        if rest[:1] != ["simulate"]:
            raise UsageError(f"the only oomguard command serve runs is `oomguard simulate MODEL ...` (got "
                             f"{' '.join(words[:3])!r})")
        return _parse_vllm(rest[1:], "simulate", (sys.executable, "-m", "oomguard", "simulate"), False)
    if first == "vllm" or first.endswith("vllm"):
        if words[1:2] != ["serve"]:
            raise UsageError("the vLLM command must be `vllm serve MODEL ...`")
        return _parse_vllm(words[2:], "vllm", tuple(words[:2]), False)
    if first.startswith("python") and "-m" in words:
        i = words.index("-m")
        if words[i + 1:i + 2] != [VLLM_MODULE]:
            raise UsageError(f"`python -m` must run {VLLM_MODULE} (got {' '.join(words[i:i + 2])!r})")
        return _parse_vllm(words[i + 2:], "vllm", tuple(words[:i + 2]), True)
    raise UsageError(f"not an engine command serve knows: {words[0]!r} (use `vllm serve MODEL ...`, "
                     f"`python -m {VLLM_MODULE} ...`, `llama-server ...` or `oomguard simulate MODEL ...`)")


def _without_address(words: list[str]) -> list[str]:
    """The words without --host/--port and their values: serve chooses the engine's address."""
    return _apart(words, dict.fromkeys(_ADDRESS, True))[0]


def _parse_vllm(words: list[str], kind: str, launcher: tuple[str, ...], model_as_flag: bool) -> EngineCommand:
    from oomguard.engines.vllm.flags import parse_vllm_command
    words = _without_address(words)
    own: list[str] = []
    if kind == "simulate":
        words, own = _apart(words, _SIMULATE_OWN)
    if not model_as_flag and (not words or words[0].startswith("-")):
        raise UsageError(f"the engine command names no model: `{' '.join(launcher[-2:])} MODEL ...`")
    try:
        parsed = parse_vllm_command(["vllm", "serve", *words])
    except UsageError as exc:
        raise UsageError(f"engine command: {exc}") from None
    if not parsed.model:
        raise UsageError("the engine command names no model (--model MODEL)")
    extra = list(parsed.extra)
    if not model_as_flag and extra[:1] == [parsed.model]:
        extra = extra[1:]
    return EngineCommand(kind, launcher, parsed.model, dict(parsed.flags), tuple(extra + own), model_as_flag)


def _apart(words: list[str], options: dict[str, bool]) -> tuple[list[str], list[str]]:
    """The words without `options` (name -> takes a value), and those options with their values."""
    rest: list[str] = []
    taken: list[str] = []
    i = 0
    while i < len(words):
        name, eq, _ = words[i].partition("=")
        if name in options:
            takes = options[name] and not eq
            taken += words[i:i + 1 + takes]
            i += 1 + takes
            continue
        rest.append(words[i])
        i += 1
    return rest, taken


def _parse_llama(words: list[str]) -> EngineCommand:
    rest = _without_address(words[1:])
    spelled = {s: dest for dest, spellings in LLAMA_FLAGS.items() for s in spellings}
    flags: dict = {}
    extra: list[str] = []
    i = 0
    while i < len(rest):
        w = rest[i]
        name, eq, inline = w.partition("=")
        if name in spelled:
            value = inline if eq else (rest[i + 1] if i + 1 < len(rest) else None)
            if value is None:
                raise UsageError(f"engine command: {name} needs a value")
            dest = spelled[name]
            if dest in _LLAMA_INT:
                try:
                    flags[dest] = int(value)
                except ValueError:
                    raise UsageError(f"engine command: {name} wants a whole number (got {value!r})") from None
            else:
                flags[dest] = value
            i += 1 if eq else 2
            continue
        extra.append(w)
        i += 1
    model = None
    for j, w in enumerate(extra):
        if w in ("-m", "--model") and j + 1 < len(extra):
            model = extra[j + 1]
        elif w.startswith("--model="):
            model = w.split("=", 1)[1]
    if model is None and not any(w in ("-hf", "--hf-repo", "-mu", "--model-url") for w in extra):
        raise UsageError("the llama-server command names no model (-m FILE.gguf)")
    return EngineCommand("llamacpp", (words[0],), model, flags, tuple(extra))
