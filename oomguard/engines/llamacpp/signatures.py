"""llama.cpp's own error texts (src/llama-*.cpp, ggml/src/ggml-cuda/ggml-cuda.cu, ggml-alloc.c,
tools/server/server.cpp, common/chat.cpp), as diagnose signatures.

Memory failures carry the phase in their function name: `load_tensors`/`llama_model_load` (weights),
`llama_kv_cache*`/`llama_init_from_model` (KV cache for -c/--ctx-size), `ggml_gallocr_reserve_n`
(compute buffers, sized by -b/-ub).
"""

from __future__ import annotations

from oomguard.failures import FailureClass, Signature

C = FailureClass   # short, for the tables below

SIGNATURES: tuple[Signature, ...] = (
    Signature("llamacpp.model_buffer", C.OOM_WEIGHTS_LOAD, "unable to allocate cuda", 0.95,
              "src/llama-model.cpp: 'unable to allocate %s buffer'", engine="llamacpp",
              cause="llama.cpp could not allocate the GPU buffer for the model's layers."),
    Signature("llamacpp.alloc_tensor_range", C.OOM_WEIGHTS_LOAD, "alloc_tensor_range: failed to allocate", 0.9,
              "ggml/src/ggml-alloc.c:alloc_tensor_range", engine="llamacpp",
              pattern=r"failed to allocate (?P<device>\w+) buffer of size (?P<buffer_bytes>\d+)",
              cause="llama.cpp could not allocate the GPU buffer for the model's layers."),
    Signature("llamacpp.kv_alloc", C.KV_CACHE_TOO_SMALL, "failed to allocate buffer for kv cache", 0.93,
              "src/llama-kv-cache.cpp", engine="llamacpp",
              cause="The KV cache for this context size (-c) does not fit in GPU memory."),
    Signature("llamacpp.kv_init", C.KV_CACHE_TOO_SMALL, "llama_kv_cache_init: failed", 0.9, "src/llama-kv-cache.cpp",
              engine="llamacpp", cause="The KV cache for this context size (-c) does not fit in GPU memory."),
    Signature("llamacpp.ctx_init", C.KV_CACHE_TOO_SMALL, "failed to initialize the context", 0.75,
              "src/llama-context.cpp / llama_init_from_model", engine="llamacpp",
              cause="llama.cpp could not create the context (KV cache and compute buffers) for this -c."),
    Signature("llamacpp.compute_buffers", C.OOM_PROFILING_OR_GRAPH, "failed to allocate compute buffers", 0.9,
              "src/llama-context.cpp", engine="llamacpp",
              cause="The compute buffers (sized by the batch -b / micro-batch -ub) do not fit in GPU memory."),
    Signature("llamacpp.gallocr", C.OOM_PROFILING_OR_GRAPH, "ggml_gallocr_reserve_n: failed to allocate", 0.88,
              "ggml/src/ggml-alloc.c", engine="llamacpp",
              pattern=r"failed to allocate (?P<device>\w+) buffer of size (?P<buffer_bytes>\d+)",
              cause="The compute buffers (sized by -b / -ub) do not fit in GPU memory."),
    Signature("llamacpp.cuda_malloc", C.OOM_RUNTIME, "cudamalloc failed: out of memory", 0.85,
              "ggml/src/ggml-cuda/ggml-cuda.cu: 'allocating %.2f MiB on device %d: cudaMalloc failed: %s'",
              engine="llamacpp", kind="oom",
              pattern=r"allocating (?P<tried_mib>[\d.]+) MiB on device (?P<device>\d+)"),
    Signature("llamacpp.ctx_exceeded", C.CONTEXT_TOO_LONG, "exceeds the available context size", 0.95,
              "tools/server/server.cpp (exceed_context_size_error)", engine="llamacpp",
              pattern=r"request \((?P<prompt_tokens>\d+) tokens\) exceeds the available context size "
                      r"\((?P<max_model_len>\d+) tokens\)",
              cause="The request is longer than the server's per-slot context (-c divided by --parallel)."),
    Signature("llamacpp.ctx_exceeded_type", C.CONTEXT_TOO_LONG, "exceed_context_size_error", 0.95,
              "tools/server/server.cpp", engine="llamacpp",
              pattern=r"\"n_prompt_tokens\"\s*:\s*(?P<prompt_tokens>\d+).*?\"n_ctx\"\s*:\s*(?P<max_model_len>\d+)",
              cause="The request is longer than the server's per-slot context (-c divided by --parallel)."),
    Signature("llamacpp.ctx_larger", C.CONTEXT_TOO_LONG, "input is larger than the max context size", 0.9,
              "tools/server/server.cpp (older)", engine="llamacpp",
              cause="The input is longer than the slot's context size."),
    Signature("llamacpp.ubatch", C.CONTEXT_TOO_LONG, "input is too large to process. increase the physical batch size",
              0.88, "tools/server/server.cpp (embeddings / rerank)", engine="llamacpp",
              cause="Embedding inputs must fit in one micro-batch (-ub)."),
    Signature("llamacpp.ctx_shift", C.CONTEXT_TOO_LONG, "context shift is disabled", 0.8, "tools/server/server.cpp",
              engine="llamacpp", cause="The conversation outgrew the context and context shift is off."),
    Signature("llamacpp.template", C.TOKENIZER_CHAT_TEMPLATE, "failed to parse chat template", 0.92,
              "common/chat.cpp", engine="llamacpp", cause="The model's chat template could not be parsed."),
    Signature("llamacpp.template_unsupported", C.TOKENIZER_CHAT_TEMPLATE, "chat template is not supported", 0.9,
              "tools/server/server.cpp", engine="llamacpp",
              cause="The built-in template engine does not support this chat template."),
    Signature("llamacpp.template_apply", C.TOKENIZER_CHAT_TEMPLATE, "failed to apply chat template", 0.9,
              "common/chat.cpp", engine="llamacpp", cause="The chat template failed on this request."),
    Signature("llamacpp.gguf_open", C.MODEL_ACCESS, "gguf_init_from_file: failed to open", 0.85,
              "ggml/src/gguf.cpp", engine="llamacpp", cause="The GGUF file could not be opened (wrong path?)."),
    Signature("llamacpp.gguf_bounds", C.MODEL_ACCESS, "data is not within the file bounds", 0.88, "src/llama-model-loader.cpp",
              engine="llamacpp", cause="The GGUF file is truncated or corrupt (an incomplete download)."),
    # the engine release predates the model: no setting runs it, a newer build does (classed with engine defects)
    Signature("llamacpp.arch", C.ENGINE_BUG, "unknown model architecture", 0.8, "src/llama-model-loader.cpp",
              engine="llamacpp", cause="This llama.cpp build does not know the GGUF's architecture: a newer build "
                                       "runs it."),
    # ggml-cuda.cu aborts on any CUDA error with GGML_ASSERT(!"CUDA error"): the CUDA error line above it is the cause
    Signature("llamacpp.ggml_assert", C.ENGINE_BUG, "ggml_assert", 0.8, "ggml (GGML_ASSERT)", kind="bug",
              engine="llamacpp", require=True, pattern=r"GGML_ASSERT(?!.*!\s*\"CUDA error\")",
              cause="An internal llama.cpp assertion failed."),
)

# startup lines (src/llama-model.cpp print_info, src/llama-context.cpp, tools/server/server.cpp)
import re as _re  # noqa: E402

FACTS: tuple[tuple[str, str, _re.Pattern], ...] = tuple((name, needle, _re.compile(rx, _re.I)) for name, needle, rx in (
    ("llamacpp_build", "build:", r"build: (?P<v>\d+) \((?P<commit>\w+)\)"),
    ("llamacpp_model_name", "general.name", r"general\.name\s+str\s*=\s*(?P<v>.+?)\s*$"),
    ("llamacpp_n_ctx_train", "n_ctx_train", r"n_ctx_train\s*=\s*(?P<v>\d+)"),
    ("llamacpp_n_ctx", "n_ctx ", r"\bn_ctx\s*=\s*(?P<v>\d+)"),
    ("llamacpp_n_seq_max", "n_seq_max", r"n_seq_max\s*=\s*(?P<v>\d+)"),
    ("llamacpp_offloaded", "layers to gpu", r"offloaded (?P<offloaded>\d+)/(?P<layers>\d+) layers to GPU"),
    ("llamacpp_model_buffer", "model buffer size", r"(?P<device>CUDA\d+|ROCm\d+|Metal|Vulkan\d*) model buffer size\s*="
                                                   r"\s*(?P<mib>[\d.]+) MiB"),
    ("llamacpp_kv_buffer", "kv buffer size", r"(?P<device>CUDA\d+|ROCm\d+|Metal|Vulkan\d*) KV buffer size\s*="
                                             r"\s*(?P<mib>[\d.]+) MiB"),
    ("llamacpp_compute_buffer", "compute buffer size", r"(?P<device>CUDA\d+|ROCm\d+|Metal|Vulkan\d*) compute buffer "
                                                       r"size\s*=\s*(?P<mib>[\d.]+) MiB"),
    ("llamacpp_server", "llama_server:", r"llama_server: (?P<v>initializing|model loaded|listening)"),
    ("llamacpp_model_path", "load_model: loading model", r"loading model '(?P<v>[^']+)'"),
    ("llamacpp_slots", "n_ctx_slot", r"n_slots = (?P<slots>\d+), n_ctx_slot = (?P<ctx>\d+)"),
    ("llamacpp_gpu", "ggml_cuda_init: found", r"found (?P<v>\d+) CUDA devices"),
    ("llamacpp_device", "compute capability", r"Device (?P<index>\d+): (?P<name>.+?), compute capability "
                                              r"(?P<cc>\d+\.\d+)"),
))

PHASE_MARKERS: tuple[tuple[str, str], ...] = (
    ("llama_model_loader: loaded meta data", "loading"),
    ("load_tensors: loading model tensors", "loading"),
    ("llama_context: constructing llama_context", "weights_loaded"),
    ("llama_new_context_with_model:", "weights_loaded"),
    ("server is listening on", "serving"),
    ("llama_server: model loaded", "ready"),
    ("llama_server: listening on", "serving"),
    ("all slots are idle", "serving"),
)
