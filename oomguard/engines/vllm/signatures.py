"""vLLM's own error texts, per version, as diagnose signatures.

Every needle is a verbatim piece of a message vLLM raises or logs; the comment or `source` names the file and
the versions (wheels read: 0.6.6 ... 0.33.0, see ../shared/research/vllm-memory-model.md sections 1.2, 4.6, 5, 6).
Texts that come from PyTorch, NCCL, Hugging Face or HTTP clients live in `oomguard/diagnose/common_signatures.py`.
"""

from __future__ import annotations

from oomguard.failures import FailureClass, Signature

_N = r"(\d[\d,]*)"
_F = r"(-?\d+(?:\.\d+)?)"

C = FailureClass   # short, for the tables below

# the cause of vLLM's free-memory check at startup, in every wording of it
FREE_BELOW_REQUESTED = ("Only {free_gib} of {total_gib} GiB was free when vLLM started, less than the {requested_gib} "
                        "GiB that gpu_memory_utilization {gpu_memory_utilization} asks for: another process holds GPU "
                        "memory.")

SIGNATURES: tuple[Signature, ...] = (
    # --- KV cache cannot hold one request of max_model_len (v1/core/kv_cache_utils.py, 0.8.5 ... 0.33) ---
    Signature(
        "vllm.kv_too_small", C.KV_CACHE_TOO_SMALL, "to serve at least one request with the model", 0.97,
        "v1/core/kv_cache_utils.py:check_enough_kv_cache_memory (V1 0.8.5-0.33; 'models's' typo until 0.21)",
        pattern=r"max seq len \((?P<max_model_len>\d+)\),?\s*\(?(?P<needed_gib>[\d.]+) GiB KV cache is needed, which is"
                r" larger than the available KV cache memory \((?P<available_gib>-?[\d.]+) GiB\)\.?"
                r"(?:\s*Based on the available memory,\s*(?:the estimated maximum model length is "
                r"(?P<estimated_max_model_len>\d+))?)?",
        cause="vLLM's KV cache ({available_gib} GiB per GPU) cannot hold one request of max_model_len "
              "{max_model_len} ({needed_gib} GiB)."),
    Signature(
        "vllm.v0_kv_too_small", C.KV_CACHE_TOO_SMALL, "is larger than the maximum number of tokens that can be stored",
        0.97, "worker/worker.py:raise_if_cache_size_invalid (V0 0.6-0.10)",
        pattern=r"max seq len \((?P<max_model_len>\d+)\) is larger than the maximum number of tokens that can be "
                r"stored in KV cache \((?P<kv_tokens>\d+)\)",
        cause="vLLM's KV cache holds {kv_tokens} tokens, fewer than one request of max_model_len {max_model_len}."),
    # --- no room at all for KV blocks ---
    Signature("vllm.no_cache_blocks", C.NO_CACHE_BLOCKS, "no available memory for the cache blocks", 0.97,
              "v1/core/kv_cache_utils.py, worker/worker.py (all versions)",
              cause="After weights, activations and non-torch memory, nothing was left of the "
                    "gpu_memory_utilization budget for the KV cache."),
    Signature("vllm.autofit_none", C.NO_CACHE_BLOCKS, "cannot auto-fit max_model_len", 0.96,
              "v1/core/kv_cache_utils.py:_auto_fit_max_model_len (>= 0.14)",
              cause="With --max-model-len auto, not even one token of KV cache fits in the memory budget."),
    Signature("vllm.zero_blocks", C.NO_CACHE_BLOCKS, "blocks: 0", 0.9,
              "executor/executor_base.py '# %s blocks: %d, # CPU blocks: %d' (V0), v1 '# GPU blocks: %d' (<=0.7)",
              pattern=r"# (?:gpu|cuda|[a-z]+) blocks: 0\b(?:, # CPU blocks: (?P<cpu_blocks>\d+))?",
              cause="vLLM allocated 0 GPU KV-cache blocks."),
    Signature("vllm.zero_kv_tokens", C.NO_CACHE_BLOCKS, "kv cache size: 0 tokens", 0.9,
              "v1/core/kv_cache_utils.py 'GPU KV cache size: %s tokens' (0.8-0.33)",
              cause="vLLM's KV cache holds 0 tokens."),
    Signature("vllm.negative_kv", C.NO_CACHE_BLOCKS, "available kv cache memory: -", 0.92,
              "v1/worker/gpu_worker.py 'Available KV cache memory: %s GiB' (0.9-0.33)",
              pattern=r"Available KV cache memory: (?P<available_gib>-[\d.]+) GiB",
              cause="The KV budget came out negative ({available_gib} GiB): weights + activations exceed "
                    "gpu_memory_utilization x total."),
    Signature("vllm.v0_negative_kv", C.NO_CACHE_BLOCKS, "reserved for kv cache is -", 0.92,
              "worker/worker.py memory profiling summary (V0 0.6.5-0.10)",
              pattern=r"reserved for KV Cache is (?P<available_gib>-[\d.]+) ?GiB",
              cause="The KV budget came out negative ({available_gib} GiB)."),
    # --- memory held by someone else at startup (v1/worker/utils.py:request_memory >= 0.14; gpu_worker 0.9-0.13) ---
    Signature(
        "vllm.free_lt_requested", C.GPU_MEMORY_IN_USE, "on startup is less than desired gpu memory utilization", 0.97,
        "v1/worker/gpu_worker.py:init_device (0.9-0.13), v1/worker/utils.py:request_memory (>= 0.14)",
        pattern=r"Free memory on device\s*(?:[\w:]+\s*)?\((?P<free_gib>[\d.]+)\s*/\s*(?P<total_gib>[\d.]+) GiB\) on "
                r"startup is less than desired GPU memory utilization \((?P<gpu_memory_utilization>[\d.]+),\s*"
                r"(?P<requested_gib>[\d.]+) GiB\)",
        cause=FREE_BELOW_REQUESTED),
    # the same check as builds after 0.33 and vendor containers word it (NVIDIA's GB10 images): "Free memory on cuda:0
    # (38.74/121.63 GiB) < desired utilization (0.35, 42.57 GiB)"
    Signature("vllm.free_lt_desired", C.GPU_MEMORY_IN_USE, "< desired utilization", 0.95,
              "v1/worker/utils.py:request_memory (a later wording)",
              pattern=r"\((?P<free_gib>[\d.]+)\s*/\s*(?P<total_gib>[\d.]+) GiB\) < desired utilization "
                      r"\((?P<gpu_memory_utilization>[\d.]+),\s*(?P<requested_gib>[\d.]+) GiB\)",
              cause=FREE_BELOW_REQUESTED),
    Signature("vllm.external_weights", C.GPU_MEMORY_IN_USE, "exceed the desired gpu memory utilization", 0.9,
              "v1/worker/utils.py:request_memory (0.33, externally held weights)",
              pattern=r"\((?P<external_gib>[\d.]+)\s*/\s*(?P<total_gib>[\d.]+) GiB\) exceed the desired GPU memory "
                      r"utilization \((?P<gpu_memory_utilization>[\d.]+),\s*(?P<requested_gib>[\d.]+) GiB\)",
              cause="Externally held weights ({external_gib} GiB) exceed the gpu_memory_utilization budget."),
    Signature("vllm.budget_after_external", C.GPU_MEMORY_IN_USE, "than the engine's budget after excluding external",
              0.9, "v1/worker/utils.py:request_memory (0.33)",
              pattern=r"\((?P<free_gib>[\d.]+)\s*/\s*(?P<total_gib>[\d.]+) GiB\) on startup is less than the engine's "
                      r"budget after excluding external process's weights \((?P<gpu_memory_utilization>[\d.]+),\s*"
                      r"(?P<requested_gib>[\d.]+) GiB\)",
              cause="Free memory at startup is below the engine's budget: another process holds GPU memory."),
    # a size the profiler measured below zero: memory the engine freed inside its own measurement (a miscount; the
    # budget it sizes the KV cache from is wrong by as much)
    Signature("vllm.negative_graph_estimate", C.ENGINE_BUG, "estimated cuda graph memory: -", 0.8,
              "v1/worker/gpu_model_runner.py:profile_cudagraph_memory (0.18+)",
              pattern=r"Estimated CUDA graph memory: (?P<estimate_gib>-[\d.]+) GiB",
              cause="vLLM estimated its CUDA-graph pool at {estimate_gib} GiB, a negative size: its profiler "
                    "miscounted (memory freed during the estimate), and the KV cache it sized from that budget is too "
                    "large by as much. Upgrade vLLM, or cap the KV cache with --kv-cache-memory-bytes."),
    Signature("vllm.profiling_inconsistent", C.GPU_MEMORY_IN_USE, "error in memory profiling", 0.93,
              "v1/worker/gpu_worker.py / worker/worker.py:determine_available_memory (all versions)",
              pattern=r"Initial (?:free|used) memory (?P<initial_gib>[\d.e+]+)(?: GiB)?, current(?:ly)? "
                      r"(?:free|used) memory (?P<current_gib>[\d.e+]+)",
              cause="GPU memory used by another process changed while vLLM was profiling, so vLLM could not "
                    "measure its own usage."),
    # --- OOM while warming up the sampler (v1/worker/gpu_model_runner.py:_dummy_sampler_run, 0.8-0.33) ---
    Signature("vllm.sampler_warmup_oom", C.OOM_PROFILING_OR_GRAPH, "occurred when warming up sampler", 0.97,
              "v1/worker/gpu_model_runner.py:_dummy_sampler_run",
              pattern=r"warming up sampler with (?P<dummy_requests>\d+) dummy requests",
              cause="vLLM ran out of memory sampling {dummy_requests} dummy requests at startup "
                    "(max_num_seqs sets that count)."),
    Signature("vllm.warmup_oom", C.OOM_PROFILING_OR_GRAPH, "out of memory occurred when warming up", 0.93,
              "v1/worker/gpu_model_runner.py (pooler / encoder warm-up)",
              pattern=r"with (?P<dummy_requests>\d+) dummy requests",
              cause="vLLM ran out of memory in a warm-up run at startup."),
    # --- weights do not fit (v1/worker/gpu_model_runner.py:load_model, >= 0.14) ---
    Signature("vllm.weights_oom", C.OOM_WEIGHTS_LOAD, "failed to load model - not enough gpu memory", 0.97,
              "v1/worker/gpu_model_runner.py:load_model (>= 0.14)",
              cause="The model's weights do not fit in this GPU's memory."),
    # --- parallel layout (config/model.py:verify_with_parallel_config, distributed/utils.py, executor/ray_utils.py) ---
    Signature("vllm.tp_heads", C.TP_MISCONFIG, "must be divisible by tensor parallel size", 0.97,
              "config/model.py:verify_with_parallel_config (all versions)",
              pattern=r"Total number of attention heads \((?P<num_attention_heads>\d+)\)\s*must be divisible by "
                      r"tensor parallel size \((?P<tensor_parallel_size>\d+)\)",
              cause="The model's {num_attention_heads} attention heads cannot be split evenly over "
                    "tensor_parallel_size {tensor_parallel_size}."),
    Signature("vllm.ensure_divisibility", C.TP_MISCONFIG, "is not divisible by", 0.8,
              "distributed/utils.py:ensure_divisibility (AssertionError '{} is not divisible by {}')", require=True,
              pattern=r"(?<![\w.])(?P<numerator>\d+) is not divisible by (?P<denominator>\d+)\b",
              cause="A tensor dimension ({numerator}) cannot be split evenly over {denominator} tensor-parallel "
                    "ranks."),
    Signature("vllm.ray_not_enough_gpus", C.TP_MISCONFIG, "you don't have enough gpus available", 0.95,
              "executor/ray_utils.py:_verify_bundles", cause="tensor_parallel_size x pipeline_parallel_size asks "
              "for more GPUs than the node has."),
    Signature("vllm.pg_required_gpus", C.TP_MISCONFIG, "number of required gpus exceeds the total number of available",
              0.95, "executor/ray_utils.py (placement group)",
              cause="tensor_parallel_size x pipeline_parallel_size asks for more GPUs than are available."),
    Signature("vllm.pg_timeout", C.TP_MISCONFIG, "cannot provide a placement group of", 0.85,
              "executor/ray_utils.py:wait_for_placement_group (timeout)",
              cause="Ray could not find the GPUs the parallel layout asks for."),
    Signature("vllm.ray_required", C.TP_MISCONFIG, "ray is required for multi-node inference", 0.85,
              "config/parallel.py (world size above this node's GPU count)",
              cause="tensor_parallel_size x pipeline_parallel_size is larger than this node's GPU count."),
    Signature("vllm.tp_gt_experts", C.TP_MISCONFIG, "is greater than the number of experts", 0.9,
              "model_executor/models/*_moe.py ('Tensor parallel size {tp} is greater than the number of experts')",
              pattern=r"Tensor parallel size (?P<tensor_parallel_size>\d+) is greater than the number of experts "
                      r"(?P<num_experts>\d+)",
              cause="tensor_parallel_size exceeds the MoE model's expert count."),
    Signature("vllm.quant_tp_align", C.TP_MISCONFIG, "not aligned with the quantized weight shape", 0.92,
              "model_executor/layers/quantization/*: 'This can be caused by too large tensor parallel size.'",
              cause="The quantized weight shape cannot be split over this tensor_parallel_size."),
    Signature("vllm.block_quant_tp", C.TP_MISCONFIG, "is not divisible by weight quantization block", 0.9,
              "model_executor/layers/quantization/fp8.py (block-quantized weights per TP rank)",
              pattern=r"partition_size = (?P<partition_size>\d+) is not divisible by weight quantization "
                      r"block_[nk] = (?P<block>\d+)",
              cause="A weight shard ({partition_size}) is not a multiple of the quantization block ({block}) at this "
                    "tensor_parallel_size."),
    Signature("vllm.tp_heads_paraphrase", C.TP_MISCONFIG, "attention heads", 0.75,
              "the TP/heads rule in other words (config/model.py)", require=True,
              pattern=r"divisib\w*.{0,60}attention heads|attention heads.{0,60}divisib",
              cause="tensor_parallel_size must divide the model's attention heads."),
    Signature("vllm.tp_divide", C.TP_MISCONFIG, "tensor parallel world size must divide", 0.88,
              "model_executor/layers/mamba/mamba_mixer2.py", cause="tensor_parallel_size does not divide a model "
              "dimension."),
    # --- context length (entrypoints/openai/serving_engine.py <= 0.17, renderers/params.py >= 0.18,
    #     v1/engine/processor.py, config/model.py:_get_and_verify_max_len) ---
    Signature("vllm.ctx_openai", C.CONTEXT_TOO_LONG, "this model's maximum context length is", 0.95,
              "entrypoints/openai/serving_engine.py:_validate_input (0.6-0.17), renderers/params.py (0.18-0.33)",
              pattern=r"maximum context length is (?P<max_model_len>\d+) tokens\.?\s*However, (?:you requested "
                      r"(?:(?P<requested_tokens>\d+) tokens(?: \((?P<prompt_tokens>\d+) in the messages, "
                      r"(?P<completion_tokens>\d+) in the completion\))?|(?P<completion_tokens_b>\d+) output tokens "
                      r"and your prompt contains (?:at least )?(?P<prompt_tokens_b>\d+) input tokens)|your request has "
                      r"(?P<prompt_tokens_c>\d+) input tokens(?: plus (?P<completion_tokens_c>\d+) 'max_tokens')?|your prompt contains (?:at least )?"
                      r"(?P<prompt_tokens_d>\d+) input tokens)",
              cause="The request needs more tokens than max_model_len {max_model_len}."),
    Signature("vllm.ctx_max_tokens", C.CONTEXT_TOO_LONG, "'max_tokens' or 'max_completion_tokens' is too large", 0.95,
              "entrypoints/openai/serving_engine.py (0.10-0.17)",
              pattern=r"is too large: (?P<completion_tokens>\d+)\.\s*This model's maximum context length is "
                      r"(?P<max_model_len>\d+) tokens and your request has (?P<prompt_tokens>\d+) input tokens",
              cause="max_tokens {completion_tokens} plus the {prompt_tokens}-token prompt exceed max_model_len "
                    "{max_model_len}."),
    Signature("vllm.ctx_engine", C.CONTEXT_TOO_LONG, "is longer than the maximum model length of", 0.95,
              "v1/engine/processor.py (0.8-0.32), v1/engine/input_processor.py (0.33)",
              pattern=r"prompt \(length (?P<prompt_tokens>\d+)\) is longer than the maximum model length of "
                      r"(?P<max_model_len>\d+)",
              cause="A {prompt_tokens}-token prompt is longer than max_model_len {max_model_len}."),
    Signature("vllm.ctx_v0_scheduler", C.CONTEXT_TOO_LONG, "is too long and exceeds limit of", 0.92,
              "core/scheduler.py (V0): 'Input prompt (%d tokens) is too long and exceeds limit of %d'",
              pattern=r"Input prompt \((?P<prompt_tokens>\d+) tokens\) is too long and exceeds limit of "
                      r"(?P<max_model_len>\d+)",
              cause="A {prompt_tokens}-token prompt exceeds the limit of {max_model_len}."),
    Signature("vllm.ctx_input_length", C.CONTEXT_TOO_LONG, "exceeds model's maximum context length", 0.95,
              "entrypoints/serve/utils/api_utils.py (0.33)",
              pattern=r"Input length \((?P<prompt_tokens>\d+)\) exceeds model's maximum context length "
                      r"\((?P<max_model_len>\d+)\)",
              cause="A {prompt_tokens}-token input exceeds max_model_len {max_model_len}."),
    Signature("vllm.max_output_tokens", C.CONTEXT_TOO_LONG, "cannot be greater than max_total_tokens", 0.9,
              "renderers/params.py (0.18-0.30)",
              pattern=r"max_output_tokens=(?P<completion_tokens>\d+) cannot be greater than "
                      r"max_total_tokens=(?:max_total_tokens=)?(?P<max_model_len>\d+)",
              cause="max_tokens {completion_tokens} is above max_model_len {max_model_len}."),
    Signature("vllm.max_len_derived", C.CONTEXT_TOO_LONG, "is greater than the derived max_model_len", 0.95,
              "config/model.py:_get_and_verify_max_len (all versions)",
              pattern=r"User-specified max_model_len \((?P<max_model_len>\d+)\) is greater than the derived "
                      r"max_model_len \((?:max_position_embeddings=)?(?P<derived_max_model_len>\d+)",
              cause="--max-model-len {max_model_len} is above the model's own limit {derived_max_model_len}."),
    # --- dtype / compute capability (config/model.py:_check_valid_dtype, model_loader/utils.py) ---
    Signature("vllm.bf16_cc", C.DTYPE_CAPABILITY, "is only supported on gpus with compute capability of at least", 0.97,
              "platforms/cuda.py / config/model.py (all versions)",
              pattern=r"compute capability of at least (?P<required_capability>[\d.]+)\.?\s*Your (?P<gpu_name>.+?) "
                      r"GPU has compute capability (?P<compute_capability>[\d.]+)",
              cause="bfloat16 needs compute capability 8.0; this {gpu_name} GPU has {compute_capability}."),
    # a quantization method's kernels missing on this GPU: a quantization problem (another checkpoint), not a dtype one
    Signature("vllm.quant_capability", C.QUANTIZATION_MISMATCH, "is not supported for the current gpu", 0.95,
              "model_executor/model_loader/utils.py:get_quant_config (all versions)",
              pattern=r"quantization method (?P<quantization>\S+) is not supported for the current GPU\.\s*Minimum "
                      r"capability: (?P<required_capability>\d+)\.\s*Current capability: (?P<compute_capability>\d+)",
              cause="The {quantization} kernels need compute capability {required_capability}; this GPU has "
                    "{compute_capability}."),
    Signature("vllm.fa_ampere", C.DTYPE_CAPABILITY, "flashattention only supports ampere gpus or newer", 0.9,
              "vllm_flash_attn / flash_attn", cause="FlashAttention needs an Ampere (8.0) or newer GPU."),
    # --- quantization (config/model.py:_verify_quantization, model_loader/utils.py) ---
    Signature("vllm.quant_mismatch", C.QUANTIZATION_MISMATCH,
              "does not match the quantization method specified in the `quantization` argument", 0.97,
              "config/model.py:_verify_quantization (all versions)",
              pattern=r"model config \((?P<model_quantization>[^)]+)\) does not match the quantization method "
                      r"specified in the `quantization` argument \((?P<quantization>[^)]+)\)",
              cause="--quantization {quantization} contradicts the checkpoint's own method ({model_quantization})."),
    Signature("vllm.quant_unknown", C.QUANTIZATION_MISMATCH, "unknown quantization method", 0.95,
              "config/model.py:_verify_quantization",
              pattern=r"Unknown quantization method: (?P<quantization>[^.\s]+)",
              cause="vLLM does not know the quantization method {quantization}."),
    Signature("vllm.quant_dtype", C.QUANTIZATION_MISMATCH, "is not supported for quantization method", 0.95,
              "model_executor/model_loader/utils.py:get_quant_config",
              pattern=r"(?<![\w.])(?P<dtype>torch\.\w+|\w+) is not supported for quantization method (?P<quantization>[^.\s]+)\."
                      r"\s*Supported dtypes: (?P<supported>\[[^\]]*\])",
              cause="The {quantization} kernels do not take {dtype} activations (supported: {supported})."),
    Signature("vllm.quant_config_missing", C.QUANTIZATION_MISMATCH, "cannot find the config file for", 0.9,
              "model_executor/model_loader/weight_utils.py:get_quant_config",
              pattern=r"Cannot find the config file for (?P<quantization>\S+)",
              cause="--quantization {quantization} was given but the checkpoint has no quantization config for it."),
    Signature("vllm.bnb_load_format", C.QUANTIZATION_MISMATCH, "only support 'bitsandbytes'", 0.9,
              "config/model.py / config/load.py (BitsAndBytes load format and quantization must go together)",
              cause="bitsandbytes quantization and load format were not set together."),
    Signature("vllm.quant_platform", C.QUANTIZATION_MISMATCH, "quantization is currently not supported in", 0.9,
              "platforms/rocm.py:verify_quantization", cause="This quantization method is not supported on this "
              "platform."),
    Signature("vllm.gguf_arch", C.QUANTIZATION_MISMATCH, "gguf model with architecture", 0.8,
              "transformers_utils/config.py (GGUF)", cause="This GGUF architecture is not supported."),
    # --- chat template / tokenizer (entrypoints/chat_utils.py, transformers_utils/tokenizer.py) ---
    Signature("vllm.no_chat_template", C.TOKENIZER_CHAT_TEMPLATE, "default chat template is no longer allowed", 0.97,
              "entrypoints/chat_utils.py (>= 0.6, transformers >= 4.44)",
              cause="The tokenizer has no chat template and none was given with --chat-template."),
    Signature("vllm.chat_template_apply", C.TOKENIZER_CHAT_TEMPLATE, "error in applying chat template from request",
              0.9, "entrypoints/openai/serving_chat.py", cause="The chat template failed on this request."),
    Signature("vllm.tool_choice", C.TOKENIZER_CHAT_TEMPLATE, "tool choice requires --enable-auto-tool-choice", 0.85,
              "entrypoints/openai/serving_chat.py", cause="tool_choice 'auto' needs --enable-auto-tool-choice and "
              "--tool-call-parser."),
    Signature("vllm.mistral_tokenizer", C.TOKENIZER_CHAT_TEMPLATE, "tokenizer-mode mistral", 0.6,
              "transformers_utils/tokenizer.py", cause="A Mistral-format model needs --tokenizer-mode mistral."),
    # --- custom all-reduce and distributed setup (distributed/device_communicators/custom_all_reduce.py) ---
    Signature("vllm.custom_ar_p2p", C.NCCL, "custom allreduce is disabled because your platform lacks gpu p2p", 0.5,
              "distributed/device_communicators/custom_all_reduce.py (warning)", kind="hint",
              cause="The GPUs cannot talk peer to peer."),
    Signature("vllm.custom_ar_error", C.NCCL, "custom_all_reduce", 0.7,
              "csrc/custom_all_reduce.cuh (CUDA error inside vLLM's custom all-reduce)", require=True,
              pattern=r"custom_all_reduce\S*[^\n]{0,160}(?:error|failed|assert)",
              cause="vLLM's custom all-reduce kernel failed."),
    # --- engine bugs and internal assertions ---
    Signature("vllm.internal_bug_text", C.ENGINE_BUG, "this should never happen", 0.7, "vllm internal assertion",
              kind="bug", cause="vLLM hit an internal assertion."),
)
