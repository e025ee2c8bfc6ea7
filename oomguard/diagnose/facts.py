"""The startup summary: what the engine printed about its configuration and memory, and the warning signs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import ast
import re

from oomguard.failures import to_number
from oomguard.engines.vllm.startup_log import ENGINE_CONFIG_KEYS

# vLLM argparse dests we carry into a rewritten `vllm serve` line (oomguard.engines.vllm.flags.FLAGS)
_SLOW_BACKENDS = re.compile(r"xformers|triton|flex|sdpa|torch", re.I)
_KV_PAIR = re.compile(r"(?<!\w)(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,()]+?)(?=, \w+=|\)?$)")
_DICT_PAIR = re.compile(r"'(\w+)':\s*('(?:[^'\\]|\\.)*'|\"[^\"]*\"|[^,{}]+)")


def _value(text: str):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    if text.startswith("torch."):
        return text[6:]
    return to_number(text)


def parse_pairs(text: str, pair: re.Pattern = _KV_PAIR) -> dict:
    return {k: _value(v) for k, v in pair.findall(text[:20000])}


def parse_dict(text: str) -> dict:
    if len(text) < 20000:
        try:
            value = ast.literal_eval(text)
            if isinstance(value, dict):
                return {str(k): v for k, v in value.items()}
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            pass
    return parse_pairs(text, _DICT_PAIR)


def _num(raw: dict, name: str, key: str = "v"):
    value = raw.get(name, {}).get(key)
    return None if value is None else to_number(value)


@dataclass(frozen=True)
class StartupFacts(Mapping):
    """What a log showed of the setup (engine, version, GPU, model, settings, the startup's memory figures), keyed by
    the engine's own argument names. Frozen: a later source of facts makes a new one (`with_defaults`, `with_`)."""

    values: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __getitem__(self, key: str):
        return self.values[key]

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def with_defaults(self, more: Mapping) -> "StartupFacts":
        """These facts, and `more`'s where the log did not say (a user's --gpu, a --command's flags)."""
        return StartupFacts(MappingProxyType({**more, **self.values}))

    def with_(self, **more) -> "StartupFacts":
        return StartupFacts(MappingProxyType({**self.values, **more}))

    def to_dict(self) -> dict:
        return dict(self.values)


def build(raw: dict, engines: set[str]) -> tuple[StartupFacts, dict | None]:
    """Structured facts from the scanner's raw matches (keys absent when the log did not show them), and the
    `vllm serve` command the log printed ({model, flags}, or None), which stands in for --command."""
    facts: dict = {}
    if "vllm" in engines or any(k in raw for k in ("vllm_version", "engine_config", "non_default_args")):
        facts["engine"] = "vllm"
    elif "llamacpp" in engines or any(k.startswith("llamacpp_") for k in raw):
        facts["engine"] = "llamacpp"
    if "vllm_version" in raw:
        facts["vllm_version"] = raw["vllm_version"]["v"].lstrip("v")

    args: dict = {}
    if "args_namespace" in raw:
        args.update(parse_pairs(raw["args_namespace"]["v"]))
    if "non_default_args" in raw:
        args.update(parse_dict(raw["non_default_args"]["v"]))
    config: dict = {}
    if "engine_config" in raw:
        pairs = parse_pairs(raw["engine_config"]["v"])
        config = {k: pairs[k] for k in ENGINE_CONFIG_KEYS if k in pairs}
    if args:
        facts["non_default_args"] = {k: v for k, v in args.items() if _jsonable(v)}

    model = args.get("model") or args.get("model_tag") or config.get("model")
    if model:
        facts["model"] = str(model)
    for key in ("dtype", "quantization", "kv_cache_dtype"):
        value = config.get(key, args.get(key))
        if value is not None:
            facts[key] = str(value)
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        value = config.get(key, args.get(key))
        if isinstance(value, (int, float)):
            facts[key] = int(value)
    max_len = config.get("max_seq_len", args.get("max_model_len"))
    if isinstance(max_len, (int, float)):
        facts["max_model_len"] = int(max_len)
    for key in ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "block_size", "cpu_offload_gb"):
        if isinstance(args.get(key), (int, float)) and not isinstance(args.get(key), bool):
            facts[key] = args[key]
    for key in ("enforce_eager", "enable_prefix_caching"):
        value = config.get(key, args.get(key))
        if isinstance(value, bool):
            facts[key] = value

    if "attention_backend" in raw:
        facts["attention_backend"] = raw["attention_backend"]["v"].strip()
    if "attention_fallback" in raw:
        facts["attention_fallback"] = raw["attention_fallback"]["v"].strip()
    for name in ("weights_gib", "available_kv_gib", "cuda_graph_gib", "cuda_graph_estimated_gib", "num_gpu_blocks",
                 "max_num_batched_tokens", "non_torch_gib", "activation_peak_gib"):
        value = _num(raw, name)
        if value is not None and not (name == "max_num_batched_tokens" and name in facts):
            facts[name] = value
    if "kv_cache_tokens" in raw:
        facts["kv_cache_tokens"] = to_number(raw["kv_cache_tokens"]["v"])
    if "max_concurrency" in raw:
        facts["max_concurrency"] = to_number(raw["max_concurrency"]["max_concurrency"])
        facts["max_concurrency_tokens"] = to_number(raw["max_concurrency"]["max_concurrency_tokens"])
        facts.setdefault("max_model_len", facts["max_concurrency_tokens"])
    for name in ("v0_profile", "v1_profile", "v1_actual", "v1_actual_consumed"):
        for key, value in raw.get(name, {}).items():
            facts.setdefault(key, to_number(value))
    if "v0_budget" in raw:
        facts["total_gpu_memory_gib"] = to_number(raw["v0_budget"]["total_gpu_memory_gib"])
        facts.setdefault("gpu_memory_utilization", to_number(raw["v0_budget"]["gpu_memory_utilization"]))
    if "kv_in_use_gib" in raw:
        facts.setdefault("available_kv_gib", to_number(raw["kv_in_use_gib"]["v"]))
    if "v1_desired" in raw:
        facts.setdefault("gpu_memory_utilization", to_number(raw["v1_desired"]["gpu_memory_utilization"]))
    if "v1_budget" in raw:
        facts.setdefault("gpu_memory_utilization", to_number(raw["v1_budget"]["gpu_memory_utilization"]))
    if "free_total" in raw:
        facts.setdefault("total_gpu_memory_gib", to_number(raw["free_total"]["total_gpu_memory_gib"]))
    if "gpu_total" in raw:
        facts.setdefault("total_gpu_memory_gib", to_number(raw["gpu_total"]["v"]))
    if "auto_fit" in raw and raw["auto_fit"].get("max_model_len"):
        facts["max_model_len"] = int(raw["auto_fit"]["max_model_len"])
    if "gpu_name" in raw:
        facts["gpu_name"] = "NVIDIA " + raw["gpu_name"]["v"].strip()
    if "bf16_gpu" in raw:
        facts.setdefault("gpu_name", raw["bf16_gpu"]["gpu_name"].strip())
        facts["compute_capability"] = str(raw["bf16_gpu"]["compute_capability"])
    if "cuda_visible_devices" in raw:
        facts["gpu_count"] = len(raw["cuda_visible_devices"]["v"].split(","))
    if "llamacpp_gpu" in raw:
        facts["gpu_count"] = int(raw["llamacpp_gpu"]["v"])
    if "llamacpp_device" in raw:
        facts.setdefault("gpu_name", raw["llamacpp_device"]["name"].strip())
        facts["compute_capability"] = raw["llamacpp_device"]["cc"]
    _llamacpp(raw, facts)
    _ollama(raw, facts)
    command = parse_serve_command(raw["serve_command"]["v"], need_path=True) if "serve_command" in raw else None
    if command:   # what vLLM itself printed still wins over the command's flags
        facts["serve_command"] = raw["serve_command"]["v"].strip()[:2000]
    return StartupFacts(MappingProxyType(facts)), command


def parse_serve_command(text: str, need_path: bool = False) -> dict | None:
    """{"model", "flags" (vLLM dest names), "extra" (the options oomguard does not model, with their values, kept
    verbatim so a rewritten line stays complete)} from a `vllm serve ...` or `python -m vllm.entrypoints...` line;
    None when it has no model (or, with need_path, a model without a '/': a word of prose, not an id or path)."""
    import shlex

    from oomguard.engines.vllm.flags import parse_vllm_command
    from oomguard.errors import UsageError
    try:
        words = shlex.split(text.strip()[:2000])
    except ValueError:  # unbalanced quotes
        return None
    visible = _visible_gpus(words)
    # `docker run [docker's options] vllm/vllm-openai[:tag] [vLLM's arguments]`: the container's arguments only
    image = next((i for i, w in enumerate(words) if _VLLM_IMAGE.search(w) and not w.startswith("-")), None)
    if words[:1] in (["docker"], ["podman"]) and image is not None:
        words = ["vllm", "serve"] + words[image + 1:]
    # vLLM's parser takes --max_model_len as --max-model-len (FlexibleArgumentParser)
    words = [w.split("=", 1)[0].replace("_", "-") + w[len(w.split("=", 1)[0]):] if w.startswith("--") else w
             for w in words]
    try:
        parsed = parse_vllm_command(words)
    except (ValueError, SystemExit, UsageError):  # a flag without its value, an ambiguous abbreviation
        return None
    ignored = set(parsed.ignored)

    def follows_unknown_option(i: int) -> bool:
        return i > 0 and words[i - 1] in ignored

    at = words.index(parsed.model) if parsed.model in words else -1
    if parsed.model and ("/" not in parsed.model or follows_unknown_option(at)):
        # an option oomguard does not know took the model's place (`--served-model-name chat org/model`, or its
        # value was taken for the model: `--chat-template ./t.jinja org/model`): try the words that look like a
        # model id or path, those that follow no unknown option first, right after the launcher
        after = next((i + 1 for i, w in enumerate(words) if w == "serve" or w.endswith("api_server")), 0)
        found = [i for i, w in enumerate(words) if "/" in w and not w.startswith("-") and i >= after]
        for i in sorted(found, key=follows_unknown_option):
            word = words[i]
            trial = words[:after] + [word] + words[after:i] + words[i + 1:]
            try:
                candidate = parse_vllm_command(trial)
            except (ValueError, SystemExit):
                continue
            if candidate.model == word:
                words, parsed = trial, candidate
                break
    if not parsed.model or (need_path and "/" not in parsed.model):
        return None
    extra: list[str] = []
    ignored = set(parsed.ignored)
    keep = False
    for word in words:
        if word.startswith("-"):
            keep = word in ignored
        elif word == parsed.model:
            keep = False
        if keep:
            extra.append(word)
    return {"model": parsed.model, "flags": dict(parsed.flags), "extra": extra,
            **({"visible_gpus": visible} if visible else {})}


# vLLM's container image as docker runs it (vllm/vllm-openai:v0.11.0, a registry's copy, the ROCm image)
_VLLM_IMAGE = re.compile(r"(?:^|/)vllm-openai(?:-rocm)?(?::[\w.-]{1,64})?$")


def _visible_gpus(words: list[str]) -> int | None:
    """How many GPUs the command lets vLLM see: CUDA_VISIBLE_DEVICES set before the command or with docker's -e (it
    narrows what docker exposes), else docker's --gpus ('device=0,1' or a count); None when it does not say."""
    for word in words:
        env = re.fullmatch(r"CUDA_VISIBLE_DEVICES=(\d{1,3}(?:,\d{1,3}){0,63})", word)
        if env:
            return len(env.group(1).split(","))
    for i, word in enumerate(words):
        value = words[i + 1] if word == "--gpus" and i + 1 < len(words) else word[7:] if word.startswith("--gpus=") \
            else None
        devices = re.fullmatch(r"device=(\d{1,3}(?:,\d{1,3}){0,63})", value or "")
        if devices:
            return len(devices.group(1).split(","))
        if value and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def _llamacpp(raw: dict, facts: dict) -> None:
    mapping = {"llamacpp_build": "llamacpp_build", "llamacpp_model_name": "model", "llamacpp_n_ctx_train":
               "n_ctx_train", "llamacpp_n_ctx": "n_ctx", "llamacpp_n_seq_max": "n_parallel"}
    for name, key in mapping.items():
        if name in raw:
            facts.setdefault(key, to_number(raw[name]["v"]))
    if "llamacpp_model_path" in raw:
        facts.setdefault("model", raw["llamacpp_model_path"]["v"])
    if "llamacpp_slots" in raw:
        facts["n_parallel"] = int(raw["llamacpp_slots"]["slots"])
        facts["n_ctx_slot"] = int(raw["llamacpp_slots"]["ctx"])
    if "llamacpp_offloaded" in raw:
        facts["gpu_layers_offloaded"] = int(raw["llamacpp_offloaded"]["offloaded"])
        facts["model_layers"] = int(raw["llamacpp_offloaded"]["layers"])
    for name, key in (("llamacpp_model_buffer", "weights_gib"), ("llamacpp_kv_buffer", "kv_cache_gib"),
                      ("llamacpp_compute_buffer", "compute_buffer_gib")):
        if name in raw:
            facts.setdefault(key, round(float(raw[name]["mib"]) / 1024, 2))


def _ollama(raw: dict, facts: dict) -> None:
    """The server's placement line (llm/server.go): layers on the GPU of the model's, the memory the whole model and
    the GPUs' part need, the VRAM free, and the host's free RAM and swap; sizes in GiB, summed over the GPUs."""
    from oomguard.diagnose.oom import sizes_gib
    for name, key in (("ollama_layers_model", "model_layers"), ("ollama_layers_offload", "gpu_layers_offloaded")):
        if name in raw:
            facts.setdefault(key, int(raw[name]["v"]))
    for name, key in (("ollama_vram_available", "gpu_free_gib"), ("ollama_required_full", "memory_required_gib"),
                      ("ollama_required_allocations", "gpu_required_gib"), ("ollama_ram_free", "host_ram_free_gib"),
                      ("ollama_swap_free", "host_swap_free_gib")):
        sizes = sizes_gib(raw[name]["v"]) if name in raw else []
        if sizes:
            facts.setdefault(key, round(sum(sizes), 2))


def _jsonable(value) -> bool:
    return isinstance(value, (str, int, float, bool, type(None), list, dict))


def warnings(facts: dict) -> list[str]:
    """Warning signs in a healthy-looking startup (a slow attention backend, TP 1 on a multi-GPU box, a near-empty
    KV cache, ...), each one sentence that says what to change and why."""
    out: list[str] = []
    backend = facts.get("attention_backend", "")
    cc = _cc(facts.get("compute_capability"))
    if backend and _SLOW_BACKENDS.search(backend) and (cc is None or cc >= 8.0):
        where = "this GPU" if cc else "an Ampere/Hopper GPU"
        out.append(f"attention backend {backend} is a slow path on {where} (FlashAttention is the fast one); "
                   "unless the model needs it (fp8 KV cache or attention sinks before Hopper), check why FlashAttention "
                   "was not picked and force it with --attention-backend FLASH_ATTN")
    if facts.get("attention_fallback"):
        out.append(f"vLLM fell back from FlashAttention: {facts['attention_fallback']}")
    gpus = facts.get("gpu_count")
    parallel = facts.get("tensor_parallel_size", 1) * facts.get("pipeline_parallel_size", 1) * \
        facts.get("data_parallel_size", 1)
    if gpus and gpus > 1 and parallel == 1:
        out.append(f"tensor_parallel_size is 1 on a {gpus}-GPU machine: {gpus - 1} GPU(s) sit idle; "
                   f"use --tensor-parallel-size {gpus} (if it divides the head count) or --data-parallel-size {gpus}")
    tokens, max_len = facts.get("kv_cache_tokens"), facts.get("max_model_len")
    blocks, kv_gib = facts.get("num_gpu_blocks"), facts.get("available_kv_gib")
    if (blocks == 0 or tokens == 0 or (isinstance(kv_gib, (int, float)) and kv_gib < 0.5)
            or (tokens and max_len and tokens < max_len)):
        out.append("the KV cache is near zero" + (f" ({tokens:,} tokens" if tokens is not None else " (")
                   + (f", {kv_gib} GiB)" if kv_gib is not None else ")")
                   + ": the weights took nearly all of the budget; lower --max-model-len, raise "
                   "--gpu-memory-utilization, quantize, or add GPUs")
    if facts.get("enforce_eager") is True:
        out.append("enforce_eager is set: no CUDA graphs, so decoding is slower; drop --enforce-eager unless graph "
                   "capture runs out of memory")
    util = facts.get("gpu_memory_utilization")
    if isinstance(util, (int, float)) and util >= 0.95:
        out.append(f"gpu_memory_utilization {util} leaves under 5% of the GPU for the CUDA context, NCCL and "
                   "runtime spikes; 0.90-0.92 is safer")
    conc = facts.get("max_concurrency")
    if isinstance(conc, (int, float)) and 0 < conc < 2 and max_len:
        out.append(f"max_model_len {max_len:,} is far above what the KV cache serves concurrently "
                   f"({conc:.2f} full-length requests fit): requests will queue or be preempted; lower "
                   f"--max-model-len to what requests need")
    if facts.get("model_layers") and facts.get("gpu_layers_offloaded", 0) < facts["model_layers"]:
        out.append(f"only {facts['gpu_layers_offloaded']}/{facts['model_layers']} layers are on the GPU; the rest run "
                   "on the CPU (slow): raise -ngl (Ollama: num_gpu) or use a smaller quantization")
    return out


def _cc(value) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
