"""What vLLM prints while it starts, per version, as line patterns: the facts of a run and the startup phases.

Texts from the wheels 0.6.6 ... 0.33.0 (../shared/research/vllm-memory-model.md section 6 and the files named).
Each entry: (fact, needle, regex). The needle is a lower-case literal found in the line; the regex pulls the
value(s) out by named group (`v` for a single value). Facts with the same name: the last line wins, as in the run.
"""

from __future__ import annotations

from dataclasses import dataclass

import re
from oomguard.failures import FailureClass

_C = re.IGNORECASE

FACTS: tuple[tuple[str, str, re.Pattern], ...] = tuple((name, needle, re.compile(rx, _C)) for name, needle, rx in (
    # entrypoints/openai/api_server.py (all versions); v1/engine/core.py; engine/llm_engine.py (V0)
    ("vllm_version", "vllm api server version", r"vLLM API server version (?P<v>[\w.+-]+)"),
    ("vllm_version", "llm engine (v", r"LLM engine \(v(?P<v>[^)\s]+)\) with config"),
    ("engine_config", "with config: model=", r"with config: (?P<v>model=.*)"),
    ("non_default_args", "non-default args:", r"non-default args: (?P<v>\{.*\})"),  # entrypoints/utils.py (>= 0.10)
    ("args_namespace", "args: namespace(", r"args: Namespace\((?P<v>.*)\)"),        # api_server.py (<= 0.9)
    ("args_namespace", "] args: ", r"\] args: (?P<v>\w+=.*)"),                       # the same, flattened
    # platforms/cuda.py get_attn_backend_cls, attention/selector.py (V0)
    ("attention_backend", "backend", r"\bUsing (?P<v>(?:Flash ?Attention|FlashInfer|FlexAttention|Triton|XFormers|"
                                     r"Torch ?SDPA|TORCH_SDPA|ROCm|Rocm/Aiter|AITER|FlashMLA|Cutlass MLA|Triton MLA|"
                                     r"FlashInfer MLA|Tree Attention|Pallas|[A-Z_]+ATTN\w*)[\w ./-]*?) backend"),
    ("attention_fallback", "cannot use flashattention", r"(?P<v>Cannot use FlashAttention(?:-2)? backend[^.]*)"),
    # weights (section 6 rows 2, 2a-2c)
    ("weights_gib", "model loading took", r"Model loading took (?P<v>[\d.]+) ?GiB"),
    ("weights_gib", "loading model weights took", r"Loading model weights took (?P<v>[\d.]+) ?GB"),
    # V0 profiling summary (row 4), V1 DEBUG summary (row 4b)
    ("weights_gib", "model weights take", r"model weights take\s*(?P<v>[\d.]+) ?GiB"),
    ("non_torch_gib", "non_torch_memory takes", r"non_torch_memory takes\s*(?P<v>[\d.]+) ?GiB"),
    ("activation_peak_gib", "activation peak memory takes", r"activation peak memory takes\s*(?P<v>[\d.]+) ?GiB"),
    ("available_kv_gib", "reserved for kv cache is", r"reserved for KV Cache is\s*(?P<v>-?[\d.]+) ?GiB"),
    ("v0_budget", "total_gpu_memory (", r"total_gpu_memory \((?P<total_gpu_memory_gib>[\d.]+) ?GiB\) x "
                                        r"gpu_memory_utilization \((?P<gpu_memory_utilization>[\d.]+)\)"),
    ("v1_profile", "torch peak memory increase:", r"torch peak memory increase: (?P<activation_peak_gib>[\d.]+) ?GiB; "
                                                  r"non-torch forward increase memory: (?P<non_torch_gib>[\d.]+) ?GiB; "
                                                  r"weights memory: (?P<weights_gib>[\d.]+) ?GiB"),
    ("v1_budget", "requested memory:", r"Initial free memory: (?P<initial_free_gib>[\d.]+) GiB; Requested memory: "
                                       r"(?P<gpu_memory_utilization>[\d.]+) \(util\), (?P<requested_gib>[\d.]+) GiB"),
    ("available_kv_gib", "available kv cache memory:", r"Available KV cache memory: (?P<v>-?[\d.]+) ?GiB"),
    # v1/worker/gpu_worker.py --kv-cache-memory suggestion (row 11; DEBUG 0.11-0.25, INFO >= 0.26): what was used
    ("v1_actual", "actual usage is", r"Actual usage is (?P<weights_gib>[\d.]+) ?GiB for weight, "
                                     r"(?P<activation_peak_gib>[\d.]+) ?GiB for peak activation, "
                                     r"(?P<non_torch_gib>[\d.]+) ?GiB for non-torch memory, and "
                                     r"(?P<cuda_graph_gib>-?[\d.]+) ?GiB for CUDAGraph memory"),          # 0.11-0.26
    ("v1_actual_consumed", "actual usage is", r"Actual usage is (?P<consumed_gib>[\d.]+) ?GiB for consumed memory "
                                              r"\(weights \+ non-torch\), (?P<activation_peak_gib>[\d.]+) ?GiB for "
                                              r"peak activation, and (?P<cuda_graph_gib>-?[\d.]+) ?GiB for CUDAGraph "
                                              r"memory"),                                                     # >= 0.27
    ("v1_desired", "desired gpu memory utilization is (", r"Desired GPU memory utilization is \("
                                                          r"(?P<gpu_memory_utilization>[\d.]+), "
                                                          r"(?P<requested_gib>[\d.]+) ?GiB\)"),
    ("kv_in_use_gib", "current kv cache memory in use is", r"Current kv cache memory in use is (?P<v>[\d.]+) ?GiB"),
    ("kv_cache_tokens", "kv cache size:", r"KV cache size: (?P<v>[\d,]+) tokens"),
    ("max_concurrency", "maximum concurrency for", r"Maximum concurrency for (?P<max_concurrency_tokens>[\d,]+) "
                                                   r"tokens per request: (?P<max_concurrency>[\d.]+)x"),
    ("num_gpu_blocks", "blocks:", r"# (?:GPU|CUDA|[a-z]+) blocks: (?P<v>\d+)"),
    ("num_gpu_blocks", "num_gpu_blocks is:", r"num_gpu_blocks is: (?P<v>\d+)"),
    ("cuda_graph_gib", "graph capturing finished", r"Graph capturing finished in [\d.]+ secs?, took (?P<v>-?[\d.]+) GiB"),
    ("cuda_graph_gib", "cuda graph pool memory:", r"CUDA graph pool memory: (?P<v>-?[\d.]+) GiB \(actual\)"),
    ("cuda_graph_estimated_gib", "estimated cuda graph memory:", r"Estimated CUDA graph memory: (?P<v>[\d.]+) GiB"),
    ("max_num_batched_tokens", "chunked prefill is enabled with", r"max_num_batched_tokens=(?P<v>\d+)"),
    ("auto_fit", "auto-fit max_model_len:", r"(?:reduced from (?P<from_len>\d+) to (?P<max_model_len>\d+)|"
                                            r"full model context length (?P<full_len>\d+) fits)"),
    # numbers other messages carry about the GPU
    ("gpu_total", "has a total capac", r"has a total capac(?:i)?ty of (?P<v>[\d.]+) GiB"),    # PyTorch >= 2.1
    ("gpu_total", "gib total capacity;", r"(?<![\d.])(?P<v>[\d.]+) GiB total capacity;"),                 # PyTorch < 2.1
    ("free_total", "free memory on device", r"\((?P<free_gib>[\d.]+)\s*/\s*(?P<total_gpu_memory_gib>[\d.]+) GiB\)"),
    ("bf16_gpu", "gpu has compute capability", r"Your (?P<gpu_name>.+?) GPU has compute capability "
                                               r"(?P<compute_capability>[\d.]+)"),
    ("gpu_name", "nvidia", r"\bNVIDIA (?P<v>(?:GeForce |Tesla |Quadro )?(?:RTX ?)?(?:[AHLBTV]\d{1,3}|\d{4})"
                           r"(?:[ -](?:SXM\d?|PCIe|NVL|Ti|SUPER|Ada|\d+GB))*(?:-\d+GB)?)\b"),
    # the launch command, when the log (a pasted terminal, a docker-compose echo) shows it
    ("serve_command", "vllm serve ", r"(?<![\w./-])(?P<v>vllm serve\s+[^\s`'\"\\][^`]*)"),
    ("serve_command", "vllm.entrypoints.openai.api_server", r"(?P<v>python3?\s+-m\s+vllm\.entrypoints\.openai\."
                                                            r"api_server\s[^`]*)"),
    ("world_size", "world_size=", r"\bworld_size=(?P<v>\d+)"),
    ("cuda_visible_devices", "cuda_visible_devices", r"CUDA_VISIBLE_DEVICES['\"]?\s*[=:]\s*['\"]?(?P<v>\d+(?:,\d+)*)"),
))

# config keys of the "with config:" line we keep (config/__init__.py VllmConfig.__str__)
ENGINE_CONFIG_KEYS = ("model", "tokenizer", "dtype", "max_seq_len", "tensor_parallel_size", "pipeline_parallel_size",
                      "data_parallel_size", "quantization", "enforce_eager", "kv_cache_dtype", "enable_prefix_caching",
                      "chunked_prefill_enabled", "disable_custom_all_reduce", "served_model_name")

# startup phases, in order; a needle moves the run to that phase (a new API-server banner starts a new run)
# "captured": graphs are done but the warm-up that follows (gpu_worker.compile_or_warm_up_model: the sampler dummy
# run) is still startup; only "init engine ... took" says the engine is up
PHASES = ("start", "loading", "weights_loaded", "profiled", "capturing", "captured", "ready", "serving")
PHASE_MARKERS: tuple[tuple[str, str], ...] = (
    ("vllm api server version", "start"),
    ("starting to load model", "loading"),
    ("loading safetensors checkpoint shards", "loading"),
    ("loading pt checkpoint shards", "loading"),
    ("loading weights took", "weights_loaded"),
    ("model loading took", "weights_loaded"),
    ("loading model weights took", "weights_loaded"),
    ("starting profile run", "weights_loaded"),
    ("memory profiling takes", "profiled"),
    ("available kv cache memory", "profiled"),
    ("kv cache size:", "profiled"),
    ("# gpu blocks:", "profiled"),
    ("# cuda blocks:", "profiled"),
    ("capturing cudagraph", "capturing"),
    ("capturing cuda graph", "capturing"),
    ("capturing the model for cuda graphs", "capturing"),
    ("graph capturing finished", "captured"),
    ("init engine (profile, create kv cache, warmup model) took", "ready"),
    ("application startup complete", "serving"),
    ("uvicorn running on", "serving"),
    ("avg prompt throughput", "serving"),
    ("post /v1/", "serving"),
)

# Words that place an out-of-memory report that has no frames and no startup lines (a pasted description):
# used only when nothing firmer is known.
PHASE_HINTS: tuple[tuple[str, str], ...] = (
    ("on startup", "startup"), ("at startup", "startup"), ("during startup", "startup"),
    ("profile run", "startup"), ("profiling", "startup"), ("graph capture", "capturing"),
    # the warm-up is the engines' startup dummy run: vLLM's sampler/model warm-up, TGI's "Warming up model",
    # llama.cpp's "warming up the model with an empty run"
    ("warmup", "startup"), ("warm-up", "startup"), ("warming up", "startup"),
    ("capturing", "capturing"), ("loading the model", "loading"), ("loading weights", "loading"),
    ("prompt_logprobs", "serving"), ("logprobs", "serving"), ("concurrent requests", "serving"),
    ("while serving", "serving"), ("under load", "serving"), ("during inference", "serving"),
    # an engine made twice in one Python process: vLLM frees an LLM's GPU memory only when its process ends
    # (entrypoints/llm.py has no teardown before LLM.shutdown), so the second one finds the first's memory held
    ("= llm(", "engine_created"), ("del llm", "engine_recreated"), ("destroy_model_parallel", "engine_recreated"),
    ("cleanup_dist_env_and_memory", "engine_recreated"), ("second llm", "engine_recreated"),
)
# a hint seen a second time that means another: the same engine constructor twice
REPEATED_HINTS = {"engine_created": "engine_recreated"}

# Functions in a traceback that say where an out-of-memory error happened (vllm/v1/worker/*, worker/* V0,
# model_executor/model_loader/*).
# A tensor made inside `with torch.device(...)` passes through torch/utils/_device.py's DeviceContext: the loaders
# build the model that way (vLLM model_loader/base_loader.py load_model's `with target_device:`, SGLang's loader), so
# an allocation failing there is the weights being created
DEVICE_CONTEXT_FRAME = "<tensor made under a default device>"
DEVICE_CONTEXT_FILES = re.compile(r"torch[/\\]utils[/\\]_device\.py$")
KERNEL_WARMUP_FILES = re.compile(r"vllm[/\\]model_executor[/\\]warmup[/\\]\w+\.py$")
WEIGHT_FRAMES = frozenset({DEVICE_CONTEXT_FRAME,
    "load_model", "load_weights", "_load_weights", "get_model", "initialize_model", "_initialize_model",
    "weight_loader", "create_weights", "load_weights_and_postprocess", "_process_weights_after_loading",
    "process_weights_after_loading", "safetensors_weights_iterator", "download_model", "_prepare_weights",
    "default_weight_loader", "init_device_memory_and_load_model",
    "make_layers",   # model_executor/models/utils.py: builds (and allocates) the decoder layers at model init
})
PROFILE_FRAMES = frozenset({
    "profile_run", "_dummy_run", "_dummy_sampler_run", "_dummy_pooler_run", "determine_available_memory",
    "determine_num_available_blocks", "profile", "capture_model", "_capture_cudagraphs", "capture",
    "compile_or_warm_up_model", "_warmup_and_capture", "warming_up_model", "initialize_kv_cache",
    "_allocate_kv_cache_tensors", "initialize_kv_cache_tensors", "_init_cache_engine", "initialize_cache",
    "_initialize_kv_caches", "profile_cudagraph_memory", "_allocate", "_init_cache", "capture_graph",
    "_capture_graph", "warmup_model",
    # model_executor/warmup/ (0.11+): kernels warmed up after the KV cache is allocated (a frame in any of its files
    # reads as kernel_warmup, KERNEL_WARMUP_FILES)
    "kernel_warmup", "deep_gemm_warmup", "deepgemm_fp8_gemm_nt_warmup", "_deepgemm_fp8_gemm_nt_warmup",
    "deepgemm_grouped_fp8_gemm_nt_contiguous_warmup", "_deepgemm_grouped_fp8_gemm_nt_contiguous_warmup",
    "flashinfer_autotune", "_run_flashinfer_autotune_dummy_runs",
})
RUNTIME_FRAMES = frozenset({
    "execute_model", "step", "step_with_batch_queue", "_process_engine_step", "run_busy_loop", "sample",
    "_sample", "sample_tokens", "_prepare_inputs", "execute_model_async", "_execute_model", "_model_forward",
    "compute_logits", "_run_engine", "generate",
    "engine_step", "step_async", "run_engine_loop",   # engine/async_llm_engine.py: V0's serving loop
    "_process_reqs",   # vllm-ascend worker/model_runner_v1.py: execute_model's batch preparation (its dummy run skips it)
})


# a traceback frame inside an HTTP client library (the request never got a usable answer), by its file
HTTP_CLIENT_FRAME = "<http client request>"
HTTP_CLIENT_FILES = re.compile(r"[/\\](?:openai[/\\]_base_client|httpx[/\\]|httpcore[/\\]|requests[/\\]"
                               r"(?:adapters|sessions)|urllib3[/\\]|aiohttp[/\\]client)")


@dataclass(frozen=True)
class Stage:
    """Where a traceback stands, read from its frames, and the failure classes that stage usually ends in."""

    where: str
    classes: tuple[str, ...]
    frames: frozenset[str]


# Innermost first wins (a tokenizer call inside a request is a tokenizer problem). Function names from vLLM's
# worker, engine, loader and entrypoint modules, Ray's placement and torch.distributed's setup.
STAGES: tuple[Stage, ...] = (
    Stage("the tokenizer or chat template", (FailureClass.TOKENIZER_CHAT_TEMPLATE, FailureClass.ENGINE_BUG), frozenset({
        "apply_chat_template", "get_tokenizer", "cached_get_tokenizer", "_apply_hf_chat_template",
        "resolve_chat_template", "parse_chat_messages", "_tokenize_prompt_input", "init_tokenizer_from_configs",
        # the chat request's rendering: entrypoints/openai/serving_engine.py OpenAIServing._preprocess_chat (0.6+),
        # renderers/base.py render_chat / render_chat_async (0.2x+)
        "_preprocess_chat", "render_chat", "render_chat_async"})),
    Stage("request validation", (FailureClass.CONTEXT_TOO_LONG, FailureClass.ENGINE_BUG), frozenset({
        "_validate_model_input", "_validate_model_inputs", "_validate_input", "_validate_prompt_len",
        "_check_max_tokens"})),
    Stage("downloading or opening the model files", (FailureClass.MODEL_ACCESS, FailureClass.ENGINE_BUG), frozenset({
        "hf_hub_download", "snapshot_download", "get_config", "cached_file", "get_hf_file_to_dict",
        "file_or_path_exists", "download_weights_from_hf", "get_model_path", "maybe_model_redirect"})),
    Stage("Ray's placement of the workers", (FailureClass.TP_MISCONFIG, FailureClass.NCCL), frozenset({
        "initialize_ray_cluster", "_wait_until_pg_ready", "_init_workers_ray", "placement_group",
        "_verify_bundles"})),
    Stage("setting up the distributed group", (FailureClass.NCCL, FailureClass.TP_MISCONFIG), frozenset({
        "init_distributed_environment", "initialize_model_parallel", "ensure_model_parallel_initialized",
        "init_process_group", "init_world_group", "CustomAllreduce", "all_reduce", "_all_reduce_out_place",
        "broadcast", "barrier"})),
    # worker.py raise_if_cache_size_invalid (V0), kv_cache_utils.check_enough_kv_cache_memory (V1): the KV cache check
    Stage("the KV cache size check", (FailureClass.NO_CACHE_BLOCKS, FailureClass.KV_CACHE_TOO_SMALL), frozenset({
        "raise_if_cache_size_invalid", "check_enough_kv_cache_memory", "_check_enough_kv_cache_memory"})),
    Stage("the startup profile run or CUDA graph capture",
          (FailureClass.OOM_PROFILING_OR_GRAPH, FailureClass.ENGINE_BUG), PROFILE_FRAMES),
    Stage("model loading",
          (FailureClass.OOM_WEIGHTS_LOAD, FailureClass.QUANTIZATION_MISMATCH, FailureClass.MODEL_ACCESS), WEIGHT_FRAMES),
    # a stage is read only when no message matched, and every out-of-memory wording is known: a serving step that
    # failed without one is likelier the engine's own crash than memory
    Stage("a serving step", (FailureClass.ENGINE_BUG, FailureClass.OOM_RUNTIME), RUNTIME_FRAMES),
    Stage("the HTTP client's request", (FailureClass.CONNECTION,), frozenset({HTTP_CLIENT_FRAME})),
)


# every function name a stage knows (a truncated traceback's last source line may show the call into one)
STAGE_FUNCTIONS = frozenset().union(*(stage.frames for stage in STAGES)) - {HTTP_CLIENT_FRAME, DEVICE_CONTEXT_FRAME}


# The API server's wait for the engine process (v1/engine/utils.py wait_for_engine_startup, launch_core_engines;
# v1/engine/core_client.py): it stands outside the stages above, so it counts only when no frame of theirs is in the
# text. What fails there is the engine process's startup, whose own log is missing: its commonest ends are the checks
# it runs last, the KV cache's size against the context and the memory left for it
ENGINE_STARTUP_WAIT = Stage("the wait for the engine process's startup (its own log, above, has the cause)",
                            (FailureClass.KV_CACHE_TOO_SMALL, FailureClass.NO_CACHE_BLOCKS,
                             FailureClass.OOM_PROFILING_OR_GRAPH),
                            frozenset({"wait_for_engine_startup", "launch_core_engines"}))


def stage_of(frames) -> Stage | None:
    """The stage of the innermost frame any stage knows (frames outermost first, as a traceback prints them)."""
    frames = tuple(frames)
    for func in reversed(frames):
        for stage in STAGES:
            if func in stage.frames:
                return stage
    return ENGINE_STARTUP_WAIT if ENGINE_STARTUP_WAIT.frames.intersection(frames) else None
