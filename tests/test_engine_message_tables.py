"""The SGLang, Ollama and TGI message tables (oomguard/engines/{sglang,ollama,tgi}/messages.json): schema, and that every
`pattern` pulls its numbers out of a line rendered the way the engine prints it."""

from __future__ import annotations

import json
import re
import string
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from oomguard.diagnose.model import LOG_CLASSES

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("sglang", "ollama", "tgi")
MIN_ROWS = {"tgi": 5}   # TGI's table holds only the messages its launcher, router and warm-up fail with
STAGES = {"config", "model_access", "weights_load", "profile", "graph_capture", "kv_alloc", "startup_other",
          "request", "runtime", "client", "shutdown"}
KEYS = {"id", "needle", "pattern", "class", "stage", "weight", "source", "cause", "require"}
REQUIRED = KEYS - {"pattern", "require"}


def load(engine: str) -> dict:
    text = resources.files(f"oomguard.engines.{engine}").joinpath("messages.json").read_text(encoding="utf-8")
    return json.loads(text)


def rows(engine: str) -> list[dict]:
    return load(engine)["messages"]


ALL = [(engine, row) for engine in ENGINES for row in rows(engine)]

# A line per patterned row, written from the engine's format string (file named in the row's `source`),
# with the numbers the pattern must return.
SAMPLES = {
    "sglang.not_enough_memory": (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
        "mem_fraction_static=0.88", {"mem_fraction_static": "0.88"}),
    "sglang.weights_leave_no_kv": (
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.8. Raise "
        "--mem-fraction-static above 0.871 (minimum viable = 1 - available/pre = 0.8703). If using speculative "
        "decoding, draft weights are now counted.",
        {"mem_fraction_static": "0.8", "suggested_mem_fraction_static": "0.871"}),
    "sglang.hybrid_state_no_memory": (
        "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
        "max_mamba_cache_size=-3 (total_rest_memory=1.25 GB, mamba_cache_per_req=48.00 MB). Try: ...",
        {"max_mamba_cache_size": "-3", "rest_gb": "1.25", "per_req_mb": "48.00"}),
    "sglang.hybrid_state_too_small": (
        "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
        "max_mamba_cache_size=0, mamba_ratio=0.9, resulting max_num_reqs=0. Try: ...",
        {"max_mamba_cache_size": "0", "mamba_ratio": "0.9", "max_num_reqs": "0"}),
    "sglang.swa_pool_no_room": (
        "RuntimeError: SWA pool cap (65536 tokens, 3.00 GiB) leaves no room for the full KV pool within the "
        "available 2.50 GiB. Reduce --max-running-requests, ...", {"available_gb": "2.50"}),
    "sglang.max_total_tokens_capped": (
        "WARNING max_total_tokens=500000 is larger than the profiled value 123456. Use the profiled value instead.",
        {"max_total_tokens": "500000", "profiled_tokens": "123456"}),
    "sglang.kv_pool_lt_context": (
        "WARNING KV pool holds 20000 tokens, fewer than --context-length 32768. One full-length request cannot fit",
        {"kv_tokens": "20000", "context_length": "32768"}),
    "sglang.memory_unbalanced": (
        "ValueError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
        "min_per_gpu_memory=40.12, local_gpu_memory=78.5, local_gpu_memory * 0.9=70.65",
        {"min_free_gb": "40.12", "local_free_gb": "78.5"}),
    "sglang.other_ranks_failed_load": (
        "TP rank 0 could finish the model loading, but there are other ranks that didn't finish loading. It is "
        "likely due to unexpected failures (e.g., OOM) or a slow node.", {"tp_rank": "0"}),
    "sglang.no_weights_with": (
        "RuntimeError: Cannot find any model weights with `/models/foo`", {"model": "/models/foo"}),
    "sglang.no_weights_found": ("RuntimeError: No model weights found in: `/models/foo`", {"model": "/models/foo"}),
    "sglang.arch_not_supported": (
        "ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported architectures: ...",
        {"architecture": "FooForCausalLM"}),
    "sglang.arch_unsupported_v03": (
        "ValueError: Unsupported architectures: FooForCausalLM. Supported list: [...]",
        {"architecture": "FooForCausalLM"}),
    "sglang.quant_capability": (
        "ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 89. "
        "Current capability: 80.", {"quantization": "fp8", "required_capability": "89", "compute_capability": "80"}),
    "sglang.quant_mismatch": (
        "ValueError: Quantization method specified in the model config (awq) does not match the quantization method "
        "specified in the `quantization` argument (gptq).", {"checkpoint_quantization": "awq", "quantization": "gptq"}),
    "sglang.unknown_quant": (
        "ValueError: Unknown quantization method: foo8. Must be one of ['awq', ...].", {"quantization": "foo8"}),
    "sglang.ensure_divisibility": ("AssertionError: 14336 is not divisible by 3",
                                   {"numerator": "14336", "denominator": "3"}),
    "sglang.cuda_graph_capture_failed": (
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 20.00 MiB.",
        {"error": "CUDA out of memory. Tried to allocate 20.00 MiB."}),
    "sglang.input_longer_than_context": (
        "ValueError: The input (40000 tokens) is longer than the model's context length (32768 tokens).",
        {"prompt_tokens": "40000", "context_length": "32768"}),
    "sglang.requested_tokens_exceed": (
        "ValueError: Requested token count exceeds the model's maximum context length of 8192 tokens. You "
        "requested a total of 9000 tokens: 1000 tokens from the input messages and 8000 tokens for the completion.",
        {"context_length": "8192", "requested_tokens": "9000", "prompt_tokens": "1000", "completion_tokens": "8000"}),
    "sglang.requested_tokens_truncated": (
        "WARNING Requested token count (1000 input + 8000 new) exceeds the model's context length (8192 tokens). "
        "Truncating max_new_tokens.", {"prompt_tokens": "1000", "completion_tokens": "8000", "context_length": "8192"}),
    "sglang.input_exceeds_max_allowed": (
        "Input length (50000 tokens) exceeds the maximum allowed length (32767 tokens). Use a shorter input or "
        "enable --allow-auto-truncate.", {"prompt_tokens": "50000", "max_req_input_len": "32767"}),
    "sglang.context_length_override": (
        "ValueError: Warning: User-specified context_length (65536) is greater than the derived context_length "
        "(32768). This may lead to incorrect model outputs or CUDA errors.",
        {"context_length": "65536", "derived_context_length": "32768"}),
    "sglang.decode_oom_retract": (
        "Decode out of memory happened. #retracted_reqs: 3, #new_token_ratio: 0.4000 -> 0.6000",
        {"retracted_reqs": "3"}),
    "sglang.kv_pool_full_retract": (
        "KV cache pool is full. Retract requests. #retracted_reqs: 7, #new_token_ratio: 0.3000 -> 0.5000",
        {"retracted_reqs": "7"}),
    "sglang.prefill_oom": (
        "Prefill out of memory. Try to lower your batch size. Try to allocate 8192 tokens. Avaliable tokens: 100",
        {"requested_tokens": "8192"}),
    "sglang.chat_template_unknown": (
        "RuntimeError: Chat template my-template is not a built-in template name or a valid chat template file path.",
        {"chat_template": "my-template"}),
    "sglang.port_in_use": (
        "ValueError: nccl_port at 29500 is not available in 30 seconds. nccl_port is used by a process already. "
        "process.name()='python3'", {"port_name": "nccl_port"}),
    "sglang.port_already_in_use": (
        "Port is already in use. dist_init_port=None port_base=30000 detokenizer_port=30001 nccl_port=30002 "
        "scheduler_input_port=30003", {"nccl_port": "30002"}),
    "sglang.watchdog_timeout": ("Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
                                {"watchdog_timeout": "300"}),
    "ollama.system_memory": (
        "Error: model requires more system memory (12.5 GiB) than is available (8.0 GiB)",
        {"required": "12.5", "required_unit": "GiB", "available": "8.0", "available_unit": "GiB"}),
    "ollama.request_too_large": (
        'level=WARN source=server.go:137 msg="model request too large for system" requested="12.5 GiB" '
        'available=8589934592 total="15.5 GiB" free="7.0 GiB" swap="1.0 GiB"',
        {"required": "12.5", "required_unit": "GiB"}),
    "ollama.template_function": ('Error: template: :3: function "currentDate" not defined',
                                 {"function": "currentDate"}),
    "ollama.layout_cannot_alloc": ("Error: memory layout cannot be allocated with num_gpu = 99", {"num_gpu": "99"}),
    "ollama.startup_oom": (
        "Error: llama-server reported out-of-memory during startup: cudaMalloc failed: out of memory",
        {"error": "cudaMalloc failed: out of memory"}),
    "ollama.cudamalloc_failed": (
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9216.00 MiB on device 0: cudaMalloc failed: out of "
        "memory", {"requested_mib": "9216.00", "device": "0"}),
    "ollama.gpu_too_little_memory": (
        'level=DEBUG source=memory.go:201 msg="gpu has too little memory to allocate any layers" id=GPU-1 '
        'library=cuda total="11.8 GiB" available="437.2 MiB" minimum_memory=479199232 layer_size="426.0 MiB"',
        {"available": "437.2", "available_unit": "MiB"}),
    "ollama.runner_terminated": ("Error: llama runner process has terminated: signal: killed",
                                 {"reason": "signal: killed"}),
    "ollama.runner_no_longer_running": ("llama runner process no longer running: -1 error:failed to load model",
                                        {"exit_status": "-1"}),
    "ollama.runner_start_timeout": ("Error: timed out waiting for llama runner to start - progress 0.42 - ",
                                    {"load_progress": "0.42"}),
    "ollama.error_running_model": ("Error: an error was encountered while running the model: unexpected EOF",
                                   {"error": "unexpected EOF"}),
    "ollama.model_not_found": ('{"error":"model \\"llama3.1:70b\\" not found, try pulling it first"}'
                               .replace('\\"', '"'), {"model": "llama3.1:70b"}),
    "ollama.pull_manifest": (
        "Error: pull model manifest: 412: The model you are attempting to pull requires a newer version of Ollama.",
        {"http_status": "412",
         "registry_message": "The model you are attempting to pull requires a newer version of Ollama."}),
    "ollama.error_loading_model": (
        "llama_model_load: error loading model: error loading model architecture: unknown model architecture: "
        "'gemma3'", {"error": "error loading model architecture: unknown model architecture: 'gemma3'"}),
    "ollama.unable_to_load_model": ("Error: unable to load model: ~/.ollama/models/blobs/sha256-abc",
                                    {"model_path": "~/.ollama/models/blobs/sha256-abc"}),
    "ollama.ctx_too_large_for_model": (
        'level=WARN source=server.go:167 msg="requested context size too large for model" num_ctx=32768 '
        'n_ctx_train=8192', {"num_ctx": "32768", "n_ctx_train": "8192"}),
    "ollama.prompt_truncated": (
        'level=WARN source=runner.go:129 msg="truncating input prompt" limit=2048 prompt=3001 keep=5 new=2048',
        {"num_ctx": "2048", "prompt_tokens": "3001"}),
    "ollama.shift_context": ("unable to shift context - keep exceeds context (keep: 4096 context: 2048)",
                             {"num_keep": "4096", "num_ctx": "2048"}),
    "ollama.kv_size_batch": (
        "kv size must be at least as large as batch size * parallel (kv: 512 batch: 512 parallel: 4)",
        {"kv_size": "512", "batch_size": "512", "parallel": "4"}),
    "ollama.kv_per_parallel": (
        "must have at least one kv cache entry per parallel sequence (kv: 2 parallel: 4)",
        {"kv_size": "2", "parallel": "4"}),
    "ollama.cuda_gpu_too_old": ("[0] CUDA GPU is too old. Compute Capability detected: 3.5",
                                {"compute_capability": "3.5"}),
    # Go's os/exec ExitError as Ollama wraps it (llm/server.go WaitUntilRunning)
    "ollama.runner_crash_status": ("Error: llama runner process has terminated: exit status 0xc000001d",
                                   {"exit_status": "0xc000001d"}),
    "ollama.runner_fault": ("Error: llama runner process has terminated: error:fault", {"reason": "fault"}),
    "ollama.runner_binary_missing": (
        "Error: error starting the external llama server: fork/exec /tmp/ollama1/runners/metal/ollama_llama_server: "
        "no such file or directory", {"path": "/tmp/ollama1/runners/metal/ollama_llama_server"}),
    "ollama.convert_unsupported_arch": ('Error: unsupported architecture "DbrxForCausalLM"',
                                        {"architecture": "DbrxForCausalLM"}),
    "ollama.input_truncated": ('INFO [update_slots] input truncated | n_ctx=2048 n_erase=14097 n_keep=4 n_left=2044',
                               {"n_ctx": "2048", "n_erase": "14097"}),
    # TGI: the f-string of flash_causal_lm.py warmup; the thiserror formats of router/src/validation.rs and
    # backends/v3/src/lib.rs
    "tgi.warmup_prefill": ("RuntimeError: Not enough memory to handle 4096 prefill tokens. You need to decrease "
                           "`--max-batch-prefill-tokens`", {"prefill_tokens": "4096"}),
    "tgi.not_enough_memory_total": ("Error: Backend(NotEnoughMemory(8192)) Not enough memory to handle "
                                    "`max_total_tokens=8192`", {"max_model_len": "8192"}),
    "tgi.max_total_tokens": ("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 "
                             "`inputs` tokens and 512 `max_new_tokens`",
                             {"max_model_len": "4096", "prompt_tokens": "4000", "max_tokens": "512"}),
    "tgi.input_length": ("Input validation error: `inputs` must have less than 4095 tokens. Given: 5000",
                         {"max_model_len": "4095", "prompt_tokens": "5000"}),
    # flash_causal_lm.py warmup's 1.x f-string, when --max-batch-total-tokens was given
    "tgi.warmup_total_tokens": ("Not enough memory to handle 16000 total tokens with 2 prefill tokens. You need to "
                                "decrease `--max-batch-total-tokens` or `--max-batch-prefill-tokens`",
                                {"max_batch_total_tokens": "16000", "prefill_tokens": "2"}),
    # layers/attention/flash_attn.py's f-string on a V100
    "tgi.flash_attn_capability": ("ImportError: GPU with CUDA capability 7 0 is not supported for Flash Attention V2",
                                  {"major": "7", "minor": "0"}),
    # models/__init__.py FLASH_ATT_ERROR_MESSAGE.format("Sharded Llama"); utils/weights.py Weights.get_sharded
    "tgi.requires_flash_attention": ("NotImplementedError: Sharded Llama requires Flash Attention enabled models.",
                                     {"what": "Sharded Llama"}),
    "tgi.size_not_shardable": ("AssertionError: The choosen size 50432 is not compatible with sharding on 3 shards",
                               {"size": "50432", "shards": "3"}),
    # models/__init__.py get_model's last line: raise ValueError(f"Unsupported model type {model_type}")
    "tgi.unsupported_model_type": ("ValueError: Unsupported model type mistral", {"model_type": "mistral"}),
    # router/src/main.rs: tracing::warn!("Unable to parse tokenizer config: {}", e) with serde's error
    "tgi.tokenizer_config_unparsed": ("WARN text_generation_router: Unable to parse tokenizer config: invalid type: "
                                      "map, expected a string at line 4 column 16",
                                      {"reason": "invalid type: map, expected a string at line 4 column 16"}),
}


def test_top_level_shape():
    for engine in ENGINES:
        table = load(engine)
        assert set(table) == {"_about", "messages"}, engine
        assert isinstance(table["_about"], str) and table["_about"].strip()
        assert MIN_ROWS.get(engine, 20) <= len(table["messages"]) <= 120, engine


def test_classes_match_the_diagnose_contract():
    # the allowed classes are the findings' log classes; a table must not invent one
    for engine, row in ALL:
        assert row["class"] in LOG_CLASSES, row["id"]


@pytest.mark.parametrize("engine,row", ALL, ids=[row["id"] for _, row in ALL])
def test_row_schema(engine, row):
    assert REQUIRED <= set(row) <= KEYS, sorted(set(row) ^ KEYS)
    assert re.fullmatch(rf"{engine}\.[a-z0-9_]+", row["id"])
    needle = row["needle"]
    assert isinstance(needle, str) and needle == needle.lower() == needle.strip()
    assert len(needle) >= 12
    assert not re.search(r"%[-+ #0-9.]*[sdvqwfx]|\{[^}]*\}", needle), "a format placeholder is not literal text"
    assert row["stage"] in STAGES
    assert isinstance(row["weight"], float) and 0.5 <= row["weight"] <= 0.97
    assert row["source"].strip() and re.search(r"\.(py|go|cpp|rs)\b", row["source"]) and "(" in row["source"]
    if row.get("require"):
        assert row["require"] is True and "pattern" in row, "a required pattern needs a pattern"
    assert row["cause"].strip() and row["cause"].rstrip().endswith((".", ")"))
    placeholders = {name for _, name, _, _ in string.Formatter().parse(row["cause"]) if name}
    if "pattern" in row:
        regex = re.compile(row["pattern"], re.IGNORECASE)
        assert regex.groupindex, f"{row['id']}: a pattern exists to pull out numbers by name"
        assert placeholders <= set(regex.groupindex), placeholders - set(regex.groupindex)
    else:
        assert not placeholders, f"{row['id']}: cause names {placeholders} but there is no pattern"


def test_ids_unique_and_needles_distinct():
    for engine in ENGINES:
        ids = [row["id"] for row in rows(engine)]
        needles = [row["needle"] for row in rows(engine)]
        assert len(ids) == len(set(ids)), engine
        assert len(needles) == len(set(needles)), engine


def test_every_pattern_has_a_sample():
    patterned = {row["id"] for _, row in ALL if "pattern" in row}
    assert patterned == set(SAMPLES), (patterned ^ set(SAMPLES))


@pytest.mark.parametrize("rid", sorted(SAMPLES))
def test_pattern_reads_the_rendered_message(rid):
    row = next(row for _, row in ALL if row["id"] == rid)
    line, expected = SAMPLES[rid]
    assert row["needle"] in line.lower(), "the needle must find the rendered message"
    match = re.compile(row["pattern"], re.IGNORECASE).search(" ".join(line.split()))
    assert match, f"{rid}: pattern does not match {line!r}"
    got = {key: value for key, value in match.groupdict().items() if value is not None}
    assert {key: got.get(key) for key in expected} == expected
    row["cause"].format(**got)  # every placeholder of the cause is filled from this line


def test_json_ships_with_the_package():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    tool = pyproject["tool"]["setuptools"]
    assert "*.json" in tool["package-data"]["*"]
    assert any(pattern in ("oomguard*", "oomguard.*") for pattern in tool["packages"]["find"]["include"])
    for engine in ENGINES:
        package = ROOT / "oomguard" / "engines" / engine
        assert (package / "__init__.py").is_file(), f"{package} must be a package for its data to ship"
        assert (package / "messages.json").is_file()
