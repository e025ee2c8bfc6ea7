"""vLLM's engine flags, with vLLM's own spellings (vllm/engine/arg_utils.py:EngineArgs.add_cli_args).

One table serves `oomguard plan`'s options and the parsing of a pasted `vllm serve ...` or
`python -m vllm.entrypoints.openai.api_server --model ...` command line.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import shlex
from dataclasses import dataclass, fields

from oomguard.errors import UsageError

_HUMAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)\s*$")


def human_int(text: str) -> int:
    """vLLM's human_readable_int: 1k=1000, 1K=1024, 8g=8e9, 8G=8*2**30 (utils/argparse_utils.py)."""
    match = _HUMAN.match(str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (examples: 8192, 32k, 32K, 8G)")
    number, suffix = match.groups()
    if suffix.isupper() and "." in number:
        raise argparse.ArgumentTypeError(f"{text!r}: binary suffixes (K, M, G) take whole numbers")
    power = "kmgt".index(suffix.lower()) + 1 if suffix else 0
    return int(float(number) * (1024 if suffix.isupper() else 1000) ** power)


def max_model_len(text: str) -> int:
    """--max-model-len: a length, or -1 / 'auto' to let vLLM fit it to memory (>= 0.14)."""
    if str(text).strip().lower() in ("auto", "-1"):
        return -1
    return human_int(text)


PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")   # config/vllm.py PerformanceMode


def performance_mode(text: str) -> str:
    if text not in PERFORMANCE_MODES:
        raise argparse.ArgumentTypeError(f"--performance-mode is one of {', '.join(PERFORMANCE_MODES)} (got {text!r})")
    return text


def _positive_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def json_object(text) -> dict:
    """A flag whose value is a JSON object (--speculative-config, --mm-processor-kwargs, --kv-transfer-config); a
    dict passes through (a log's non-default args print it so)."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object (example: '{{\"method\": \"ngram\", "
                                         "\"num_speculative_tokens\": 3}')")
    return value


def mm_limits(text) -> dict:
    """--limit-mm-per-prompt: JSON ('{"image": 2}') or the older key=value list ('image=2,video=1')."""
    if isinstance(text, dict) or str(text).lstrip().startswith("{"):
        value = json_object(text)
    else:
        value = {}
        for part in filter(None, (p.strip() for p in str(text).split(","))):
            key, eq, count = part.partition("=")
            if not eq or not count.strip().isdigit():
                raise argparse.ArgumentTypeError(f"{text!r}: use JSON ('{{\"image\": 2}}') or image=2,video=1")
            value[key.strip()] = int(count)
    for key, limit in value.items():
        count = limit.get("count", 1) if isinstance(limit, dict) else limit
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise argparse.ArgumentTypeError(f"--limit-mm-per-prompt {key}: a count of 0 or more, got {limit!r}")
    return value


def _non_negative_float(text: str) -> float:
    value = _positive_float(text)
    if not (value >= 0 and math.isfinite(value)):   # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


@dataclass(frozen=True)
class Flag:
    dest: str
    options: tuple[str, ...]
    type: object = None        # None: a boolean switch
    help: str = ""
    negatable: bool = False    # --x / --no-x (argparse.BooleanOptionalAction in vLLM)


FLAGS: tuple[Flag, ...] = (
    Flag("tensor_parallel_size", ("--tensor-parallel-size", "-tp"), int, "GPUs each layer is split over"),
    Flag("pipeline_parallel_size", ("--pipeline-parallel-size", "-pp"), int, "pipeline stages"),
    Flag("data_parallel_size", ("--data-parallel-size", "-dp"), int, "engine replicas"),
    Flag("gpu_memory_utilization", ("--gpu-memory-utilization",), _positive_float,
         "fraction of each GPU's total memory vLLM may use (default: the version's)"),
    Flag("max_model_len", ("--max-model-len",), max_model_len, "context length (default: the model's); -1/auto"),
    Flag("max_num_seqs", ("--max-num-seqs",), int, "requests scheduled at once"),
    Flag("max_num_batched_tokens", ("--max-num-batched-tokens",), human_int, "tokens per scheduler step"),
    Flag("dtype", ("--dtype",), str, "auto, half, float16, bfloat16, float32"),
    Flag("quantization", ("--quantization", "-q"), str, "fp8, awq, gptq, bitsandbytes, ..."),
    Flag("kv_cache_dtype", ("--kv-cache-dtype",), str, "auto, fp8, fp8_e4m3, fp8_e5m2, nvfp4, int8_per_token_head, ..."),
    Flag("block_size", ("--block-size",), int, "tokens per KV block"),
    Flag("enforce_eager", ("--enforce-eager",), None, "no CUDA graphs"),
    Flag("enable_prefix_caching", ("--enable-prefix-caching",), None, "prefix caching on/off", negatable=True),
    Flag("cpu_offload_gb", ("--cpu-offload-gb",), _non_negative_float, "GiB of weights per GPU kept in CPU memory"),
    Flag("kv_cache_memory_bytes", ("--kv-cache-memory-bytes", "--kv-cache-memory"), human_int,
         "fixed KV cache size per GPU (ignores --gpu-memory-utilization)"),
    Flag("enable_expert_parallel", ("--enable-expert-parallel",), None, "split MoE experts over GPUs"),
    Flag("performance_mode", ("--performance-mode",), performance_mode,
         "balanced, interactivity (small CUDA graphs 1-32) or throughput (twice the default batch) (vLLM 0.17+)"),
    # LoRA adapters (vllm/config/lora.py LoRAConfig)
    Flag("enable_lora", ("--enable-lora",), None, "serve LoRA adapters: slots are preallocated on every GPU"),
    Flag("max_loras", ("--max-loras",), int, "adapters in one batch (GPU slots)"),
    Flag("max_lora_rank", ("--max-lora-rank",), int, "the largest adapter rank (slots are this wide)"),
    Flag("max_cpu_loras", ("--max-cpu-loras",), int, "adapters cached in CPU memory"),
    Flag("fully_sharded_loras", ("--fully-sharded-loras",), None, "shard both LoRA matrices over TP ranks"),
    Flag("lora_extra_vocab_size", ("--lora-extra-vocab-size",), int, "extra vocabulary slots per adapter"),
    Flag("lora_dtype", ("--lora-dtype",), str, "auto, float16, bfloat16"),
    # speculative decoding (vllm/config/speculative.py SpeculativeConfig; the separate flags before 0.8)
    Flag("speculative_config", ("--speculative-config",), json_object,
         "JSON: method (draft model, eagle, eagle3, mtp, ngram, ...), model, num_speculative_tokens"),
    Flag("speculative_model", ("--speculative-model",), str, "draft model (before vLLM 0.8.5; --speculative-config after)"),
    Flag("num_speculative_tokens", ("--num-speculative-tokens",), int, "tokens proposed per step (before vLLM 0.8.5)"),
    Flag("speculative_draft_tensor_parallel_size", ("--speculative-draft-tensor-parallel-size",), int,
         "draft model TP (before vLLM 0.8.5)"),
    # multimodal inputs (vllm/config/multimodal.py MultiModalConfig)
    Flag("limit_mm_per_prompt", ("--limit-mm-per-prompt",), mm_limits,
         "items per prompt by modality, JSON or image=N,video=N; 0 turns a modality (and its profiling) off"),
    Flag("mm_processor_kwargs", ("--mm-processor-kwargs",), json_object,
         "JSON for the model's processor, e.g. {\"max_pixels\": 1003520}"),
    Flag("skip_mm_profiling", ("--skip-mm-profiling",), None, "no encoder in the profile run (its memory unseen)"),
    # offloading: host memory (vllm/config/cache.py swap_space, kv_offloading_*; kv_transfer_config connectors)
    Flag("swap_space", ("--swap-space",), _non_negative_float, "GiB of CPU memory per GPU for preempted requests (V0)"),
    Flag("kv_offloading_size", ("--kv-offloading-size",), _non_negative_float,
         "GiB of CPU memory for offloaded KV blocks (all ranks together)"),
    Flag("kv_offloading_backend", ("--kv-offloading-backend",), str, "native or lmcache"),
    Flag("kv_transfer_config", ("--kv-transfer-config",), json_object,
         "JSON: a KV connector, e.g. {\"kv_connector\": \"LMCacheConnectorV1\", \"kv_role\": \"kv_both\"}"),
)

ENGINE_DESTS = {f.dest for f in FLAGS}
# the flags of LoRA, speculative decoding, multimodal inputs and offloading: EngineConfig turns them into typed configs
FEATURE_DESTS = {f.dest for f in FLAGS[FLAGS.index(next(f for f in FLAGS if f.dest == "enable_lora")):]}


def _underscored(option: str) -> str:
    return "--" + option[2:].replace("-", "_")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add vLLM's flags (dashes or underscores, as vLLM's FlexibleArgumentParser accepts)."""
    group = parser.add_argument_group("vLLM engine flags (vLLM's spellings)")
    for flag in FLAGS:
        options = list(flag.options) + [_underscored(o) for o in flag.options if o.startswith("--") and "-" in o[2:]]
        if flag.type is None:
            action = argparse.BooleanOptionalAction if flag.negatable else "store_true"
            group.add_argument(*options, dest=flag.dest, action=action, default=None, help=flag.help)
        else:
            metavar = "N" if flag.type in (int, human_int) else "JSON" if flag.type in (json_object, mm_limits) else None
            group.add_argument(*options, dest=flag.dest, type=flag.type, default=None, metavar=metavar,
                               help=flag.help)


def flags_from_args(args: argparse.Namespace) -> dict:
    """The vLLM flags the user gave (None ones dropped)."""
    return {f.dest: getattr(args, f.dest) for f in FLAGS if getattr(args, f.dest, None) is not None}


@dataclass(frozen=True)
class VllmCommand:
    model: str | None
    flags: dict
    ignored: tuple[str, ...]        # the options oomguard does not model, by name
    extra: tuple[str, ...] = ()     # those options with their values, verbatim, for a rewritten command


class _QuietParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"in the pasted vLLM command: {message}")


def parse_vllm_command(argv: list[str] | str) -> VllmCommand:
    """Read `vllm serve MODEL [flags]` or `python -m vllm.entrypoints.openai.api_server --model MODEL [flags]`."""
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    words = [w for w in words if w != "\\"]
    # strip the launcher: env assignments, python -m module, vllm serve
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    if words[:1] and words[0].endswith(("python", "python3")) or words[:1] == ["uv"]:
        while words and words[0] != "-m":
            words.pop(0)
        words = words[2:]  # "-m module"
    elif words[:2] == ["vllm", "serve"] or words[:1] and words[0].endswith("vllm") and words[1:2] == ["serve"]:
        words = words[2:]
    parser = _QuietParser(add_help=False)
    add_flags(parser)
    parser.add_argument("--model", dest="model_flag")
    parser.add_argument("model_pos", nargs="?")
    args, unknown = parser.parse_known_args(words)
    model = args.model_flag or args.model_pos
    ignored = tuple(u for u in unknown if u.startswith("-"))
    return VllmCommand(model=model, flags=flags_from_args(args), ignored=ignored, extra=tuple(unknown))


def vllm_args(flags: dict, extra: tuple[str, ...] = ()) -> list[str]:
    """The words after `vllm serve MODEL`, unquoted: the set flags with vLLM's spellings in the table's order, then
    `extra` (the user's other options) verbatim. One home for the command line that `format_vllm_command` prints and
    the deployment manifests (oomguard/deploy) carry."""
    words: list[str] = []
    for flag, value in _set_flags(flags):
        option = flag.options[0]
        if flag.type is None:
            words.append(option if value else f"--no-{option[2:]}")
        else:
            words += [option, _flag_text(value)]
    return words + list(extra)


def format_vllm_command(model: str, flags: dict, extra: tuple[str, ...] = ()) -> str:
    """A `vllm serve` line with vLLM's spellings, flags in the table's order, then `extra` (the user's other options,
    verbatim, except an --api-key value, which becomes $VLLM_API_KEY: vLLM reads that variable too)."""
    parts = ["vllm", "serve", shlex.quote(model)] + [shlex.quote(w) for w in vllm_args(flags)]
    hide_next = False
    for word in extra:
        if hide_next:
            parts.append('"$VLLM_API_KEY"')
        elif word.startswith("--api-key="):
            parts.append('--api-key="$VLLM_API_KEY"')
        else:
            parts.append(shlex.quote(word))
        hide_next = word == "--api-key"
    return " ".join(parts)


def _flag_text(value) -> str:
    """A flag value as vLLM reads it: JSON for objects, else its text."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else str(value)


def engine_config_fields() -> set[str]:
    from oomguard.engines.vllm.memory import EngineConfig
    return {f.name for f in fields(EngineConfig)}


def set_flags(flags: dict) -> dict:
    """The flags (by dest) a command line carries: unset ones and switches left off dropped."""
    return {flag.dest: value for flag, value in _set_flags(flags)}


def _set_flags(flags: dict):
    """(Flag, value) pairs worth writing, in the table's order."""
    for flag in FLAGS:
        value = flags.get(flag.dest)
        if value is None or value is False and not flag.negatable:
            continue
        yield flag, value


def format_llm_kwargs(model: str, flags: dict) -> str:
    """The same settings as Python keyword arguments of `vllm.LLM(...)` (EngineArgs field names)."""
    args = [f"model={model!r}"] + [f"{flag.dest}={value!r}" for flag, value in _set_flags(flags)]
    return "LLM(" + ", ".join(args) + ")"


def format_yaml_config(model: str, flags: dict) -> str:
    """A file for `vllm serve --config FILE`: the long option names without dashes as keys (vllm/utils/argparse_utils.py
    FlexibleArgumentParser.load_config_file), written with PyYAML. Strings are double-quoted; a JSON object is its JSON
    text in single quotes (every vLLM version parses that string; only newer ones turn a YAML mapping into JSON);
    booleans are true/false (false becomes --no-X)."""
    import yaml   # only here: the CLI's import path stays light

    def value(v):
        return _Quoted(json.dumps(v), "'") if isinstance(v, dict) else _Quoted(v, '"') if isinstance(v, str) else v
    config = {"model": _Quoted(model, '"'), **{flag.options[0][2:]: value(v) for flag, v in _set_flags(flags)}}
    return yaml.dump(config, Dumper=_quoting_dumper(), sort_keys=False, width=1 << 16, allow_unicode=True)


class _Quoted(str):
    """A string value written in the given YAML quote style (keys stay plain)."""

    def __new__(cls, text: str, style: str) -> _Quoted:
        obj = super().__new__(cls, text)
        obj.style = style
        return obj


@functools.cache
def _quoting_dumper():
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(_Quoted, lambda d, q: d.represent_scalar("tag:yaml.org,2002:str", str(q), style=q.style))
    return Dumper
