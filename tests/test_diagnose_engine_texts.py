"""Third round of engine texts: TGI's warm-up, validation and launcher phases, Ray's memory monitor, ggml's context
pool and Vulkan allocations, Ollama's runner exit statuses, and the Python/glibc wordings of a release mismatch or a
native crash. Each line below is rendered from the format string in the engine's source (the file each row's
`source` names), not copied from a report."""

from __future__ import annotations

import os

import pytest

from oomguard.diagnose import diagnose_text
from oomguard.diagnose.facts import parse_serve_command


def top(text: str) -> dict:
    findings = diagnose_text(text, use_planner=False).to_dict()["findings"]
    assert findings, f"no finding for {text!r}"
    return findings[0]


def flags(finding: dict) -> dict:
    return {f["flag"]: f["value"] for f in finding["fixes"] if f.get("flag")}


def actions(finding: dict) -> str:
    return " ".join(f.get("action", "") for f in finding["fixes"])


# --- TGI (server/text_generation_server/models/flash_causal_lm.py, router/src/validation.rs, launcher/src/main.rs) --

def test_tgi_warmup_prefill_is_the_startup_profile_and_halves_the_prefill_budget():
    text = ("RuntimeError: Not enough memory to handle 8192 prefill tokens. You need to decrease "
            "`--max-batch-prefill-tokens`")
    finding = top(text)
    assert finding["class"] == "oom_profiling_or_graph"
    assert flags(finding)["--max-batch-prefill-tokens"] == 4096
    assert "--max-num-seqs" not in flags(finding)   # TGI's flags, not vLLM's


def test_tgi_warmup_wording_found_in_the_router_log_form_too():
    text = ("ERROR warmup{max_input_length=1024 max_prefill_tokens=4096}:warmup: text_generation_client: "
            "router/client/src/lib.rs:33: Server error: Not enough memory to handle 4096 prefill tokens. You need "
            "to decrease `--max-batch-prefill-tokens`")
    assert top(text)["class"] == "oom_profiling_or_graph"


def test_tgi_not_enough_memory_for_max_total_tokens_is_the_kv_cache():
    finding = top("Error: Backend(NotEnoughMemory(16000))\nNot enough memory to handle `max_total_tokens=16000`")
    assert finding["class"] == "kv_cache_too_small"


def test_tgi_validation_errors_are_context_too_long_with_their_numbers():
    finding = top("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 8192. Given: 8000 `inputs` "
                  "tokens and 1024 `max_new_tokens`")
    assert finding["class"] == "context_too_long"
    assert "max-total-tokens" in actions(finding)
    finding = top("Input validation error: `inputs` must have less than 4096 tokens. Given: 5120")
    assert finding["class"] == "context_too_long"


def test_tgi_oom_in_a_shard_that_never_started_is_the_weights():
    text = "\n".join([
        "2024-05-01T10:00:00.000000Z  INFO text_generation_launcher: Starting shard rank=0",
        "2024-05-01T10:00:20.000000Z ERROR text_generation_launcher: Error when initializing model",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.00 MiB. GPU 0 has a total capacity "
        "of 23.68 GiB of which 50.00 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory "
        "in use.",
        "2024-05-01T10:00:21.000000Z ERROR text_generation_launcher: Shard 0 failed to start",
        "Error: ShardCannotStart",
    ])
    finding = top(text)
    assert finding["class"] == "oom_weights_load"
    assert "num-shard" in actions(finding)


def test_tgi_oom_during_the_warmup_method_is_the_profile_run():
    text = "\n".join([
        "2024-05-01T10:01:00.000000Z  INFO text_generation_launcher: Shard ready in 20.1s rank=0",
        "2024-05-01T10:01:01.000000Z  INFO text_generation_router: Warming up model",
        "2024-05-01T10:01:05.000000Z ERROR text_generation_launcher: Method Warmup encountered an error.",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB.",
    ])
    finding = top(text)
    assert finding["class"] == "oom_profiling_or_graph"
    assert "--max-batch-prefill-tokens" in flags(finding)


# --- Ray's memory monitor (python/ray/exceptions.py, src/ray/raylet/node_manager.cc) -------------------------------

def test_ray_memory_monitor_kill_is_host_ram_with_host_fixes():
    for text in ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
                 "Memory on the node (IP: 10.0.0.1, ID: abc) where the task (task ID: 01, name=f, pid=42, memory "
                 "used=30.10GB) was running was 60.00GB / 62.00GB (0.967), which exceeds the memory usage threshold "
                 "of 0.95.",
                 "2 worker(s) were killed due to the node running low on memory.",
                 "(raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 "
                 "Workers crashed due to other reasons at node (ID: abc, IP: 10.0.0.1) over the last time period."):
        finding = top(text)
        assert finding["class"].startswith("oom_"), text
        assert "host RAM" in finding["summary"]
        assert "--gpu-memory-utilization" not in flags(finding)
        assert "Ray workers" in actions(finding)


def test_ray_kill_while_serving_is_runtime():
    text = "\n".join(["INFO:     Application startup complete.",
                      "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory."])
    assert top(text)["class"] == "oom_runtime"


# --- ggml (ggml/src/ggml.c, ggml/src/ggml-vulkan/ggml-vulkan.cpp) ----------------------------------------------------

def test_ggml_context_pool_is_the_programs_own_estimate():
    finding = top("ggml_new_object: not enough space in the context's memory pool (needed 1048864, available "
                  "1048576)")
    assert finding["class"] == "engine_bug"
    assert "1048864" in finding["summary"].replace(",", "")


def test_vulkan_device_allocation_is_placed_by_the_loading_phase():
    loading = "\n".join(["load_tensors: loading model tensors, this can take a while... (mmap = true)",
                         "ggml_vulkan: Device memory allocation of size 8589934592 failed."])
    assert top(loading)["class"] == "oom_weights_load"
    context = "\n".join(["llama_context: constructing llama_context",
                         "ggml_vulkan: Device memory allocation of size 2147483648 failed."])
    assert top(context)["class"] == "oom_profiling_or_graph"


# --- Ollama's runner exit (llm/server.go WaitUntilRunning: Go os/exec ExitError) -----------------------------------

def test_ollama_runner_crash_statuses_are_the_engine():
    for status in ("2", "127", "0xc000001d", "0xc0000005"):
        finding = top(f"Error: llama runner process has terminated: exit status {status}")
        assert finding["class"] == "engine_bug", status


def test_ollama_exit_status_1_stays_unread():
    # status 1 is the runner's own error exit: the reason is the line it printed, not the status
    assert top("Error: llama runner process has terminated: exit status 1")["class"] != "engine_bug"


def test_ollama_crash_after_an_allocation_failure_is_the_allocation():
    text = "\n".join(["ggml_backend_cuda_buffer_type_alloc_buffer: allocating 2048.00 MiB on device 0: cudaMalloc "
                      "failed: out of memory",
                      "Error: llama runner process has terminated: exit status 2"])
    assert top(text)["class"].startswith("oom_")


# --- CPython and glibc -------------------------------------------------------------------------------------------

def test_python_release_mismatch_wordings_are_the_engine():
    for text in ("ImportError: cannot import name 'launch_server_cmd' from 'sglang.utils'",
                 "TypeError: Worker.__init__() got an unexpected keyword argument 'is_driver_worker'",
                 "TypeError: gen_new.<locals>.new() takes 1 positional argument but 2 were given",
                 "TypeError: forward() takes from 3 to 5 positional arguments but 6 were given"):
        assert top(text)["class"] == "engine_bug", text


def test_positional_argument_alone_is_not_a_finding_of_the_engine():
    # the needle is gated by the interpreter's full sentence
    findings = diagnose_text("the first positional argument is the model path", use_planner=False).findings
    assert all(f.cls != "engine_bug" for f in findings)


def test_heap_corruption_is_a_native_crash_unless_memory_ran_out_first():
    assert top("double free or corruption (out)\nAborted (core dumped)")["class"] == "engine_bug"
    text = "\n".join(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
                      "free(): invalid pointer", "Aborted (core dumped)"])
    assert top(text)["class"].startswith("oom_")


# --- words ---------------------------------------------------------------------------------------------------------

def test_oom_during_warmup_words_place_it_at_startup():
    assert top("CUDA OOM during sampler warmup on the nightly build")["class"] == "oom_profiling_or_graph"
    assert top("OOM while warming up the model")["class"] == "oom_profiling_or_graph"


def test_warmup_without_memory_words_gives_no_memory_finding():
    findings = diagnose_text("INFO warming up the model with an empty run\nINFO all slots are idle",
                             use_planner=False).findings
    assert all(not f.cls.startswith("oom_") for f in findings)


def test_random_bytes_still_give_no_finding():
    data = os.urandom(4096).decode("latin-1")
    findings = diagnose_text(data, use_planner=False).findings
    assert all(not f.cls.startswith("oom_") for f in findings)


# --- the transport a failed operation ends in; torch.distributed's rendezvous; kernel capability checks ----------

def test_a_registry_pull_that_times_out_is_the_network_not_the_model():
    # Go's error chain as Ollama prints it (server/images.go PullModel wrapping net/http and net errors)
    for inner in ("dial tcp 104.21.75.227:443: i/o timeout", "dial tcp: lookup <registry> on 127.0.0.53:53: no such host",
                  "read tcp 10.0.0.2:51234->104.21.75.227:443: read: connection reset by peer",
                  "net/http: TLS handshake timeout"):
        text = f'Error: pull model manifest: Get "https://<registry>/v2/library/llama3/manifests/latest": {inner}'
        assert top(text)["class"] == "connection", inner
    # a manifest the registry refuses is still the model's
    assert top("Error: pull model manifest: file does not exist")["class"] == "model_access"


def test_a_hub_that_cannot_be_reached_stays_a_model_access_problem():
    # transformers' own sentence names no transport error: the model is not cached and the hub is unreachable
    text = ("OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the "
            "cached files and it looks like meta-llama/Llama-3.1-8B is not the path to a directory")
    assert top(text)["class"] == "model_access"


def test_torch_distributed_rendezvous_failures_are_distributed_setup_not_a_client_connection():
    # torch/csrc/distributed/c10d/socket.cpp's SocketConnectOp and TCPStore.cpp texts
    for text in ("torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to "
                 "connect to (10.0.0.5, 29500).",
                 "RuntimeError: The client socket has failed to connect to any network address of (head-node, 29500).",
                 "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients "
                 "joined."):
        assert top(text)["class"] == "nccl", text


def test_kernel_capability_checks_are_the_gpu_generation():
    # TGI's flash_attn.py f-string; flash-attn's TORCH_CHECK printed without and with its message
    for text in ("ImportError: GPU with CUDA capability 7 0 is not supported for Flash Attention V2",
                 "RuntimeError: Expected is_sm90 || is_sm8x || is_sm75 to be true, but got false.",
                 "RuntimeError: FlashAttention only supports Ampere GPUs or newer."):
        assert top(text)["class"] == "dtype_capability", text


def test_marlin_tiles_that_do_not_split_over_the_gpus_are_a_parallel_layout_problem():
    # marlin_utils.py verify_marlin_supports_shape's f-string
    text = ("ValueError: Weight input_size_per_partition = 8960 is not divisible by min_thread_k = 128. Consider "
            "reducing tensor_parallel_size or running with --quantization gptq.")
    finding = top(text)
    assert finding["class"] == "tp_misconfig" and "8960" in finding["summary"]


# --- fifth round: what h's misses pointed to, each from its engine's source --------------------------------------

def test_a_server_answering_502_503_504_to_the_openai_client_is_the_connection():
    # openai/_exceptions.py APIStatusError: f"Error code: {status_code}"
    assert top("ERROR | failed to generate video script: Error: Error code: 502")["class"] == "connection"


def test_a_template_filter_the_javascript_jinja_lacks_is_the_chat_template():
    # huggingface.js packages/jinja/src/runtime.ts: `Unknown ${operand.type} filter: ${filter.value}`
    assert top("Error: Unknown ArrayValue filter: trim")["class"] == "tokenizer_chat_template"


def test_a_transformers_release_that_predates_the_architecture_is_a_release_mismatch():
    # transformers/models/auto/auto_factory.py from_config
    text = ("ValueError: Unrecognized configuration class <class 'transformers.models.gemma3.configuration_gemma3."
            "Gemma3Config'> for this kind of AutoModel: AutoModel.")
    assert top(text)["class"] == "engine_bug"


def test_a_port_the_server_cannot_bind_is_named_whatever_the_os_language():
    # Go's net.Listen OpError; the errno text is the OS's own, localised on Windows
    finding = top("Error: listen tcp 127.0.0.1:11434: bind: Only one usage of each socket address is normally "
                  "permitted.")
    assert finding["class"] == "connection" and "11434" in finding["summary"]


def test_a_model_name_the_server_does_not_serve_is_model_access():
    # vllm/entrypoints/openai serving _check_model, as the OpenAI client prints it
    text = ("Error code: 404 - {'object': 'error', 'message': 'The model `/data/Qwen1.5-72B-Chat` does not exist.', "
            "'type': 'NotFoundError', 'param': None, 'code': 404}")
    assert top(text)["class"] == "model_access"


def test_tgi_processes_killed_by_sigbus_are_the_containers_shared_memory():
    # launcher/src/main.rs: "... was signaled to shutdown with signal {signal}"; 7 is SIGBUS
    assert top("Error: Download process was signaled to shutdown with signal 7")["class"] == "nccl"


def test_a_gguf_with_another_tensor_count_is_a_llama_cpp_release_mismatch():
    # llama-model-loader.cpp done_getting_tensors
    text = "llama_model_load: error loading model: done_getting_tensors: wrong number of tensors; expected 292, got 291"
    assert top(text)["class"] == "engine_bug"


def test_a_paste_cut_after_the_call_into_the_kv_cache_check_is_placed_there():
    # V0 worker.py initialize_cache -> raise_if_cache_size_invalid: the paste ends on the call's source line
    text = ('Traceback (most recent call last):\n'
            '  File "vllm/worker/worker.py", line 171, in initialize_cache\n'
            '    raise_if_cache_size_invalid(num_gpu_blocks, self.cache_config.block_size,')
    assert top(text)["class"] == "no_cache_blocks"


# --- fourth round: Triton's capability checks, TGI's sharding texts, routes and the hub as the network sees them ----

def test_tritons_fp8_capability_assertion_is_the_gpu_not_an_engine_bug():
    # triton/language/semantic.py cast: an FP8 KV cache or checkpoint through a Triton kernel on an Ampere GPU
    text = ('  File "triton/language/semantic.py", line 759, in cast\n'
            '    assert builder.options.allow_fp8e4nv, "fp8e4nv data type is not supported on CUDA arch < 89"\n'
            "AssertionError: fp8e4nv data type is not supported on CUDA arch < 89\n")
    assert top(text)["class"] == "dtype_capability"


def test_tgi_sharding_texts():
    # models/__init__.py FLASH_ATT_ERROR_MESSAGE and utils/weights.py Weights.get_sharded, rendered
    assert top("NotImplementedError: Sharded Llama requires Flash Attention enabled models.")["class"] == \
        "dtype_capability"
    finding = top("AssertionError: The choosen size 50432 is not compatible with sharding on 3 shards")
    assert finding["class"] == "tp_misconfig"


def test_fastapis_own_404_is_a_missing_route_not_a_missing_model():
    # Starlette answers {"detail":"Not Found"} for a path it does not route; vLLM's unknown model is a JSON error
    text = ('  File "trl/extras/vllm_client.py", line 233, in init_communicator\n'
            '    raise Exception(f"Request failed: {response.status_code}, {response.text}")\n'
            'Exception: Request failed: 404, {"detail":"Not Found"}\n')
    assert top(text)["class"] == "connection"


def test_the_hub_unreachable_while_loading_is_model_access_an_inference_host_is_a_connection():
    hub = ("requests.exceptions.ConnectionError: (MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', port=443): "
           "Max retries exceeded with url: /api/models/meta-llama/Llama-2-13b-chat-hf/revision/main (Caused by "
           "NameResolutionError(\\\"<urllib3.connection.HTTPSConnection object>: Failed to resolve 'huggingface.co' "
           "([Errno -3] Temporary failure in name resolution)\\\"))\"))\n")
    assert top(hub)["class"] == "model_access"
    endpoint = hub.replace("host='huggingface.co'", "host='router.huggingface.co'").replace(
        "Failed to resolve 'huggingface.co'", "Failed to resolve 'router.huggingface.co'")
    assert top(endpoint)["class"] == "connection"


def test_ollamas_404_on_its_own_route_is_a_model_not_pulled():
    # server/routes.go: a missing model is 404 on /api/chat; an unknown path is Go's "404 page not found"
    assert top("httpx.HTTPStatusError: Client error '404 Not Found' for url 'http://localhost:11434/api/chat'")[
        "class"] == "model_access"
    assert top("Error: 404 page not found")["class"] == "connection"


# --- seventh round: texts from set k's misses, each from its source ------------------------------------------------

def test_a_connect_failure_in_anyio_or_a_clients_words_is_the_connection():
    # anyio/_core/_sockets.py connect_tcp: OSError("All connection attempts failed"), httpx's ConnectError
    assert top('RuntimeError: API request failed: 500 - {"detail":"Error creating source: All connection attempts '
               'failed"}')["class"] == "connection"
    assert top("ChatOllama is unable to establish a connection with http://host.docker.internal:11434")["class"] == \
        "connection"


def test_xformers_without_a_kernel_for_the_inputs_is_the_dtype_or_gpu():
    text = ("NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:\n"
            "     query       : shape=(1, 20394, 2, 6, 128) (torch.float32)\n"
            "`cutlassF-pt` is not supported because:\n    dtype=torch.float32 (supported: {torch.float16, "
            "torch.bfloat16})\n")
    assert top(text)["class"] == "dtype_capability"


def test_tgi_template_error_and_an_unparsed_tokenizer_config():
    assert top('{"error": "Template error: template not found", "error_type": "template_error"}')["class"] == \
        "tokenizer_chat_template"
    text = ("WARN text_generation_router: router/src/main.rs:472: Unable to parse tokenizer config: invalid type: map, "
            "expected a string at line 4 column 16\n"
            '{"error": "Template error: template not found", "error_type": "template_error"}\n')
    assert top(text)["class"] == "engine_bug"   # the missing template is the consequence of TGI's parser


def test_llama_decode_statuses():
    # llama-context.cpp: GGML_STATUS_ALLOC_FAILED is -2, GGML_STATUS_FAILED -3
    assert top("llama_decode: failed to decode, ret = -2")["class"] == "oom_runtime"
    assert top("Failed to send message llama_decode: failed to decode, ret = -3")["class"] == "oom_runtime"


def test_vllm_free_memory_check_in_its_later_wording_and_a_negative_graph_estimate():
    finding = top("ValueError: Free memory on cuda:0 (38.74/121.63 GiB) < desired utilization (0.35, 42.57 GiB)")
    assert finding["class"] == "gpu_memory_in_use"
    text = ("INFO [gpu_model_runner.py:6369] Estimated CUDA graph memory: -35.69 GiB total\n"
            "INFO [gpu_worker.py:469] Available KV cache memory: 72.44 GiB\n"
            "RuntimeError: CUDA error: out of memory\n")
    assert top(text)["class"] == "engine_bug"


def test_an_oom_while_waking_from_sleep_mode_is_the_gpu_shared_with_a_trainer():
    text = ('  File "vllm/device_allocator/cumem.py", line 207, in wake_up\n    create_and_map(handle)\n'
            "RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62\n")
    assert top(text)["class"] == "gpu_memory_in_use"


# --- eighth round: texts from set l's misses -----------------------------------------------------------------------

def test_an_extension_with_an_undefined_symbol_is_a_build_mismatch():
    # glibc's dlerror through CPython's ImportError: vLLM's _C linked without cuBLAS, or wheels of other releases
    assert top("ImportError: /usr/local/lib/python3.12/site-packages/vllm/_C.abi3.so: undefined symbol: "
               "cublasGemmEx")["class"] == "engine_bug"


def test_litellms_in_process_vllm_provider_is_the_clients_setting():
    text = ("litellm.acompletion(model=vllm/mistralai/Mistral-7B-Instruct-v0.2) Exception VLLMException - No module "
            "named 'vllm'\nlitellm.llms.vllm.VLLMError: No module named 'vllm'\n")
    finding = top(text)
    assert finding["class"] == "connection" and "hosted_vllm/" in finding["summary"] + actions(finding)


def test_a_traceback_in_the_chat_rendering_is_the_chat_template():
    # entrypoints/openai/serving_engine.py _preprocess_chat, renderers/base.py render_chat_async
    text = ('Traceback (most recent call last):\n'
            '  File "vllm/entrypoints/openai/engine/serving.py", line 995, in _preprocess_chat\n'
            '    (conversation,), (engine_prompt,) = await renderer.render_chat_async(\n'
            '  File "vllm/renderers/base.py", line 755, in render_chat_async\n'
            '    for conv, prompt in await asyncio.gather(*rendered):\n')
    assert top(text)["class"] == "tokenizer_chat_template"


# --- ninth round: texts from set m's misses, each from its source ----------------------------------------------------

def test_a_401_from_the_server_is_its_api_key_not_the_network():
    # vLLM's api-key middleware (entrypoints/openai/server_utils.py) answers 401, uvicorn logs it
    finding = top('(APIServer pid=39) INFO:     127.0.0.1:46686 - "POST /v1/chat/completions HTTP/1.1" 401 '
                  'Unauthorized')
    assert finding["class"] == "connection"
    actions = " ".join(f.get("action") or "" for f in finding["fixes"])
    assert "Authorization: Bearer" in actions and "/health" not in actions   # the server answered: no waiting for it
    # a 401 from the Hugging Face hub stays a model-access failure
    assert top("requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: "
               "https://huggingface.co/api/models/meta-llama/Llama-3.1-8B")["class"] == "model_access"


def test_nodes_econnrefused_is_the_connection_with_the_bind_address():
    finding = top("llama:streaming - could not stream chat. Error: connect ECONNREFUSED 172.17.0.1:11434")
    assert finding["class"] == "connection"
    assert any("0.0.0.0" in (f.get("action") or "") for f in finding["fixes"])


def test_a_model_that_needs_a_newer_ollama_is_the_engines_age():
    # the registry's 412, relayed by Ollama's pull (server/images.go PullModel)
    finding = top("pull model manifest: 412: The model you are attempting to pull requires a newer version of "
                  "Ollama. Please download the latest version at: https://ollama.com/download")
    assert finding["class"] == "engine_bug"
    assert "upgrade Ollama" in actions(finding)


# --- tenth round: texts from set n's misses, each from its source ----------------------------------------------------

def test_gloo_on_loopback_is_the_network_interface_with_its_fixes():
    # c10d ProcessGroupGloo.cpp createDefaultDevice, then gloo's connectFullMesh from the other nodes
    finding = top("[rank8] Warning: Unable to resolve hostname to a (local) address. Using the loopback\n"
                  "        address as fallback. Manually set the network interface with GLOO_SOCKET_IFNAME\n"
                  "[rank8] Gloo connectFullMesh failed ... timed out connecting: SO_ERROR: Connection refused, "
                  "remote=[127.0.0.1]:14215\nRuntimeError: Gloo connectFullMesh failed ...")
    assert finding["class"] == "nccl"
    flags = [f.get("flag") for f in finding["fixes"]]
    assert "GLOO_SOCKET_IFNAME" in flags and "NCCL_P2P_DISABLE" not in flags   # not the GPUs' transport


def test_rays_small_shm_warning_names_the_containers_shared_memory():
    finding = top("2023-11-18 03:39:16,283 WARNING services.py:1996 -- WARNING: The object store is using /tmp "
                  "instead of /dev/shm because /dev/shm has only 67108864 bytes available. This will harm "
                  "performance!\nINFO 11-18 03:39:17 llm_engine.py:72] Initializing an LLM engine with config: "
                  "model='/mnt/model/', tensor_parallel_size=2")
    assert finding["class"] == "nccl" and "--shm-size" in actions(finding)


def test_a_clients_could_not_be_reached_is_the_connection():
    finding = top("Your Ollama instance could not be reached or is not responding. Please make sure it is running "
                  "the API server and your connection information is correct in AnythingLLM.")
    assert finding["class"] == "connection" and "host.docker.internal" in finding["summary"]


def test_a_gguf_newer_than_the_runtime_and_gos_template_functions():
    # llama-model.cpp load_hparams ("invalid n_rot: %u, expected %u"): a file converted for a newer llama.cpp
    assert top("Error: exception error loading model hyperparameters: invalid n_rot: 128, expected 160")["class"] \
        == "engine_bug"
    # Go's text/template parse error through Ollama's template package
    finding = top('Error: template: :3: function "currentDate" not defined')
    assert finding["class"] == "tokenizer_chat_template" and "currentDate" in finding["summary"]


def test_the_line_that_names_the_buffer_outranks_ollamas_generic_allocation_line():
    # ggml-cuda's "allocating ... cudaMalloc failed" says only that an allocation failed; ggml-alloc's reserve line
    # after it says the compute buffers (sized by -b/-ub) were being allocated
    text = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 2508.00 MiB on device 0: cudaMalloc failed: out of "
            "memory\nggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 2629828608\n")
    assert top(text)["class"] == "oom_profiling_or_graph"
    weights = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 35533.34 MiB on device 0: cudaMalloc failed: "
               "out of memory\nalloc_tensor_range: failed to allocate CUDA0 buffer of size 37258956800\n")
    assert top(weights)["class"] == "oom_weights_load"


@pytest.mark.parametrize("text, said", [
    ("TypeError: Failed to fetch", "browser"),                                   # WHATWG fetch, Chromium
    ("Error: getaddrinfo ENOTFOUND ollama", "ollama does not resolve"),          # Node's DNS error
    ("Error: connect ETIMEDOUT 192.168.1.5:11434", "timed out"),                 # Node's net error
    ("Error: read ECONNRESET", "closed the connection"),
    ("ssl.SSLError: [SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)", "http://"),   # OpenSSL
])
def test_the_network_errors_of_browsers_node_and_openssl_are_the_connection(text, said):
    finding = top(text)
    assert finding["class"] == "connection" and said in finding["summary"]


def test_the_environments_own_failures_are_named_not_read_as_engine_crashes():
    # torch/cuda/__init__.py _check_driver; huggingface_hub's 429; ENOSPC
    assert top("RuntimeError: The NVIDIA driver on your system is too old (found version 11040).")["class"] == \
        "dtype_capability"
    no_driver = top("RuntimeError: Found no NVIDIA driver on your system.")
    assert no_driver["class"] == "unknown" and "--gpus all" in no_driver["summary"]   # its cause, not a blank
    assert top("huggingface_hub.errors.HfHubHTTPError: 429 Client Error: Too Many Requests for url: "
               "https://huggingface.co/api/models/x")["class"] == "model_access"
    assert top("OSError: [Errno 28] No space left on device")["class"] == "model_access"


# --- eleventh round: texts from set o's misses ---------------------------------------------------------------------

def test_a_404_from_a_server_other_than_the_hub_is_a_route_it_does_not_serve():
    assert top("404 Client Error: Not Found for url: https://ollama.ai/api/models")["class"] == "connection"
    assert top("requests.exceptions.HTTPError: 404 Client Error: Not Found for url: "
               "https://huggingface.co/api/models/no-such/model")["class"] == "model_access"
    assert top("curl http://localhost:5950/v1/models returns a 404 error, can't seem to find the endpoint v1")[
        "class"] == "connection"


def test_tritons_capability_floor_and_exllamav2s_cache_are_named():
    # torch/_dynamo/device_interface.py raise_if_triton_unavailable; exllamav2/model.py load_autosplit_gen
    pascal = top("RuntimeError: Found Tesla P40 which is too old to be supported by the triton GPU compiler, which is "
                 "used as the backend. Triton only supports devices of CUDA Capability >= 7.0, but your device is of "
                 "CUDA capability 6.1")
    assert pascal["class"] == "dtype_capability" and "6.1" in pascal["summary"]
    assert top("RuntimeError: Insufficient VRAM for model and cache")["class"] == "kv_cache_too_small"


def test_running_fine_on_an_older_release_points_at_the_engine():
    finding = top("With vllm 0.8.0 it runs out of memory and exits. But I can run it successfully with vllm 0.7.3.")
    assert "engine_bug" in [finding["class"]] + [a["class"] for a in finding["alternatives"]]


def test_fewer_mamba_state_blocks_than_sequences_caps_max_num_seqs_at_the_blocks():
    # config/compilation.py resolve_cudagraph_mode_and_sizes: one Mamba state block per running sequence
    text = "ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (969)."
    finding = diagnose_text(text, use_planner=False).to_dict()["findings"][0]
    assert finding["class"] == "no_cache_blocks"
    first = finding["fixes"][0]
    assert (first["flag"], first["value"]) == ("--max-num-seqs", 969)
    # no utilization fix without the value the run used: raising "the default" to the default is no fix
    assert not any(f.get("flag") == "--gpu-memory-utilization" for f in finding["fixes"])
    command = parse_serve_command("vllm serve Qwen/Qwen3-Next-80B-A3B-Instruct --gpu-memory-utilization 0.8")
    shown = diagnose_text(text, command=command, use_planner=False).to_dict()["findings"][0]
    raised = [f for f in shown["fixes"] if f.get("flag") == "--gpu-memory-utilization"]
    assert raised and raised[0]["value"] > 0.8


def test_ray_status_with_a_pending_placement_group_is_the_cluster_lacking_gpus():
    # ray/autoscaler/_private/util.py get_demand_report, as `ray status` prints it
    text = "Demands:\n {'GPU': 1.0} * 2 (PACK): 1+ pending placement groups\n"
    finding = top(text)
    assert finding["class"] == "tp_misconfig"
    assert "ray status" in actions(finding) and "--tensor-parallel-size" not in flags(finding)


def test_a_certificate_the_client_cannot_verify_is_the_connection_not_the_model():
    # Go's crypto/x509 inside Ollama's pull: the registry is fine, the TLS check failed
    text = ('Error: pull model manifest: Get "https://registry.example/v2/library/mistral/manifests/latest": tls: '
            'failed to verify certificate: x509: certificate has expired or is not yet valid')
    assert top(text)["class"] == "connection"
    assert top("requests.exceptions.SSLError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed "
               "certificate in certificate chain (_ssl.c:1006)")["class"] == "connection"


# --- eleventh round: the host's OOM killer, the layers' parallel checks, ggml builds, the warm-up after capture ---

def test_the_kernels_oom_killer_is_host_ram_with_host_fixes():
    text = ("Feb 24 11:16:31 adl systemd[1]: ollama.service: A process of this unit has been killed by the OOM killer.\n"
            "Feb 24 11:16:32 adl systemd[1]: ollama.service: Failed with result 'oom-kill'.")
    finding = top(text)
    assert finding["class"] == "oom_weights_load"
    assert "RAM" in actions(finding) + finding["summary"]
    assert "--tensor-parallel-size" not in flags(finding)   # the GPU's fixes do not free host RAM


def test_deepspeeds_head_check_is_the_parallel_layout():
    finding = top("AssertionError: num_heads (52) must be divisible by mp_size (8)")
    assert finding["class"] == "tp_misconfig"


def test_a_ggml_build_without_the_gpus_arch_is_the_build():
    finding = top("/root/llama.cpp/ggml/src/ggml-cuda/common.cuh:112: ggml was not compiled with any CUDA arch <= 750")
    assert finding["class"] == "engine_bug"


@pytest.mark.parametrize("tail,expected", [
    ("", "unknown"),   # stops there: still starting, or killed from outside; never "no problem"
    ("\nERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB.", "oom_profiling_or_graph"),
])
def test_after_graph_capture_vllm_is_still_starting(tail, expected):
    text = ("INFO 04-22 19:53:57 [gpu_worker.py:436] Available KV cache memory: 63.28 GiB\n"
            "INFO 04-22 19:54:39 [gpu_model_runner.py:6046] Graph capturing finished in 42 secs, took 1.55 GiB" + tail)
    assert top(text)["class"] == expected


# --- twelfth round: a llama.cpp older than its GGUF, backends without a kernel, HCCL, builds without the GPU's arch --

@pytest.mark.parametrize("text", [
    "llama_model_load: error loading model: create_tensor: tensor 'blk.0.ffn_gate.0.weight' not found",
    "error loading model: check_tensor_dims: tensor 'blk.0.attn_q.weight' has wrong shape; expected  4096,  4096, "
    "got  4096,  3072,     1,     1",
])
def test_a_gguf_the_llama_cpp_build_cannot_lay_out_is_a_release_mismatch(text):
    assert top(text)["class"] == "engine_bug"


def test_a_backend_without_the_kernel_for_a_tensor_is_the_backends_capability():
    # ggml-backend.cpp ggml_backend_sched_backend_id_from_cur: GGML_ABORT("pre-allocated tensor (%s) in a buffer (%s)
    # that cannot run the operation (%s)")
    text = ("ggml/src/ggml-backend.cpp:750: pre-allocated tensor (cache_k_l0 (view)) in a buffer (Vulkan0) that "
            "cannot run the operation (CPY)")
    assert top(text)["class"] == "dtype_capability"
    assert top("llama_init_from_model: V cache quantization requires flash_attn")["class"] == "quantization_mismatch"


def test_hccl_is_the_collective_library_on_ascend():
    text = ("RuntimeError: create_config:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:102 HCCL function error: "
            "hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), error code is 7")
    assert top(text)["class"] == "nccl"


@pytest.mark.parametrize("text", [
    ":1:hip_fatbin.cpp           :109 : 0123 us:  No compatible code objects found for: gfx1103, value of "
    "HIP_FORCE_SPIRV_CODEOBJECT: 0",
    "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'",
])
def test_a_toolchain_without_the_gpus_architecture_is_the_gpu_generation(text):
    assert top(text)["class"] == "dtype_capability"


def test_vllm_custom_all_reduce_failing_a_cuda_call_suggests_nccls_all_reduce():
    finding = top("Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:336 'invalid argument'")
    assert finding["class"] == "engine_bug"
    assert flags(finding)["--disable-custom-all-reduce"] is True


def test_vllm_0_3_resolving_dns_google_for_its_address_suggests_vllm_host_ip():
    text = ('  File "vllm/utils.py", line 176, in get_ip\n    s.connect(("dns.google", 80))  # Doesn\'t need to be '
            'reachable\nsocket.gaierror: [Errno -3] Temporary failure in name resolution')
    finding = top(text)
    assert finding["class"] == "engine_bug"
    assert "VLLM_HOST_IP" in flags(finding)


def test_an_npu_oom_inside_the_request_path_is_runtime():
    # vllm-ascend model_runner_v1.py: execute_model -> _process_reqs builds the batch's attention mask
    text = ('  File "vllm_ascend/worker/model_runner_v1.py", line 988, in _process_reqs\n'
            '    self.attn_mask = self._make_attention_mask(\n'
            'RuntimeError: NPU out of memory. Tried to allocate 23.16 GiB (NPU 3; 60.96 GiB total capacity; 53.27 GiB '
            'already allocated; 5.36 GiB free; 54.01 GiB reserved in total by PyTorch)')
    assert top(text)["class"] == "oom_runtime"


# llm/server.go: the runner's placement and the host's memory, logged before the runner starts
_OLLAMA_PLACEMENT = (
    'level=INFO source=server.go:135 msg="system memory" total="62.6 GiB" free="{free}" free_swap="0 B"\n'
    'level=INFO source=server.go:168 msg=offload library=cuda layers.requested=-1 layers.model=49 layers.offload=4 '
    'layers.split="" memory.available="[11.4 GiB]" memory.gpu_overhead="0 B" memory.required.full="68.3 GiB" '
    'memory.required.partial="10.9 GiB" memory.required.kv="2.2 GiB" memory.required.allocations="[10.9 GiB]"\n')


def test_ollama_layers_left_in_host_ram_beyond_what_is_free_are_the_weights_in_host_ram():
    finding = top(_OLLAMA_PLACEMENT.format(free="52.0 GiB"))
    assert finding["class"] == "oom_weights_load"
    assert "57.4 GiB" in finding["summary"] and "4 of the model's 49 layers" in finding["summary"]
    assert "smaller quantization" in actions(finding)


def test_ollama_layers_in_host_ram_with_room_to_spare_are_no_failure():
    findings = diagnose_text(_OLLAMA_PLACEMENT.format(free="120.0 GiB"), use_planner=False).to_dict()["findings"]
    assert not [f for f in findings if f["class"] == "oom_weights_load"]


def test_the_oom_killer_after_such_a_placement_carries_its_numbers():
    text = _OLLAMA_PLACEMENT.format(free="40.1 GiB") + \
        "systemd[1]: ollama.service: A process of this unit has been killed by the OOM killer.\n"
    finding = top(text)
    assert finding["class"] == "oom_weights_load"
    assert any("57.4 GiB" in note for note in finding["notes"])


def test_a_400_on_the_openai_route_is_a_refused_request_with_the_template_among_its_readings():
    text = ('INFO:     10.0.0.3:48284 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request\n'
            'INFO:     10.0.0.4:32768 - "GET /health HTTP/1.1" 200 OK\n')
    finding = top(text)
    assert finding["class"] == "context_too_long" and finding["confidence"] < 0.5   # a status line, not its reason
    assert "tokenizer_chat_template" in [a["class"] for a in finding["alternatives"]]
    assert "response" in actions(finding)
    assert not diagnose_text('INFO:  "POST /v1/chat/completions HTTP/1.1" 200 OK', use_planner=False).findings


@pytest.mark.parametrize("text", [
    "After the container stopped, three orphaned worker processes kept 30GB of VRAM until I killed them.",
    "The GPU memory was not released after the server exited.",
    "服务崩溃后显存一直被占用，没有释放",
])
def test_a_persons_account_of_memory_kept_by_processes_that_outlived_their_run_is_memory_in_use(text):
    assert top(text)["class"] == "gpu_memory_in_use"


# v1/worker/gpu_worker.py determine_available_memory asserts init free > current free after the profile run
_PROFILING_CHECK = ("AssertionError: Error in memory profiling. Initial free memory {before} GiB, current free memory "
                    "{after} GiB. This happens when other processes sharing the same container release GPU memory "
                    "while vLLM is profiling during initialization.")


def test_a_profiling_check_whose_numbers_did_not_move_is_the_engines_defect():
    finding = top(_PROFILING_CHECK.format(before="30.3", after="30.3"))
    assert finding["class"] == "engine_bug" and "30.3 GiB before and after" in finding["summary"]
    assert "gpu_memory_in_use" in [a["class"] for a in finding["alternatives"]]


def test_a_profiling_check_whose_free_memory_grew_is_another_process():
    assert top(_PROFILING_CHECK.format(before="30.3", after="41.0"))["class"] == "gpu_memory_in_use"


def test_a_second_engine_in_one_process_that_runs_out_of_memory_is_memory_in_use():
    script = ("llm = LLM(model='org/first', tensor_parallel_size=2)\n"
              "outputs = llm.generate(prompts)\n"
              "llm = LLM(model='org/second', tensor_parallel_size=2)\n")
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n"
    assert top(script + oom)["class"] == "gpu_memory_in_use"
    assert top(script.split("outputs")[0] + oom)["class"] != "gpu_memory_in_use"   # one engine: not this cause


@pytest.mark.parametrize("text,cls,words", [
    # llm/status.go relays the runner's last "error:" line: Go's "fatal error: fault" is a SIGSEGV in the runner
    ("Error: 500 Internal Server Error: llama runner process has terminated: error:fault", "engine_bug", "fault"),
    # 0.1.x unpacked its runners into a temporary directory (gpu/assets.go PayloadsDir)
    ("Error: error starting the external llama server: fork/exec /tmp/ollama123/runners/cuda_v11/ollama_llama_server: "
     "no such file or directory", "engine_bug", "OLLAMA_TMPDIR"),
    # convert/convert.go ConvertModel
    ('Error: unsupported architecture "FooForCausalLM"', "model_access", "convert_hf_to_gguf"),
    # llm/ext_server/server.cpp update_slots: the prompt's middle is erased to fit n_ctx
    ('INFO [update_slots] input truncated | n_ctx=2048 n_erase=9000 n_keep=4 n_left=2044 n_shift=1022 tid="1"',
     "context_too_long", "2048-token context"),
])
def test_ollama_messages_from_its_sources(text, cls, words):
    finding = top(text)
    assert finding["class"] == cls
    assert words in finding["summary"] + actions(finding)


def test_trl_finding_no_vllm_server_is_a_connection_failure_with_its_address():
    finding = top("ConnectionError: The vLLM server can't be reached at 0.0.0.0:8000 after 240 seconds. Make sure the "
                  "server is running by running `trl vllm-serve`.")
    assert finding["class"] == "connection" and "0.0.0.0:8000" in finding["summary"]


def test_a_bitsandbytes_quant_state_the_loader_does_not_know_is_the_quantization():
    text = "ERROR 12-04 11:26:27 engine.py:366] KeyError: 'layers.3.mlp.down_proj.weight.absmax'"
    assert top(text)["class"] == "quantization_mismatch"


def test_vllm_ascend_with_no_memory_left_for_the_kv_cache():
    line = "INFO 01-15 06:47:41 [worker_v1.py:270] Available memory: {}, total memory: 65452113920\n"
    assert top(line.format(0) + "ERROR 01-15 06:47:41 [core.py:843] EngineCore failed to start.")["class"] == \
        "no_cache_blocks"
    assert not [f for f in diagnose_text(line.format(21474836480), use_planner=False).to_dict()["findings"]
                if f["class"] == "no_cache_blocks"]


def test_the_api_servers_wait_for_a_failed_engine_offers_the_engines_startup_checks():
    text = ('  File "/usr/lib/python3/dist-packages/vllm/v1/engine/utils.py", line 1119, in launch_core_engines\n'
            '    wait_for_engine_startup(\n'
            '  File "/usr/lib/python3/dist-packages/vllm/v1/engine/utils.py", line 1178, in wait_for_engine_startup\n'
            '    raise RuntimeError(\n'
            'RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n')
    finding = top(text)
    assert finding["class"] == "unknown" and "paste the log" in actions(finding)
    assert [a["class"] for a in finding["alternatives"]][:2] == ["kv_cache_too_small", "no_cache_blocks"]


def test_an_unsupported_architecture_cut_mid_word_is_still_read_with_the_model_as_a_reading():
    finding = top("ValueError: Model architectures ['FooForSequenceClassification'] are not supported for no")
    assert finding["class"] == "engine_bug"
    assert "model_access" in [a["class"] for a in finding["alternatives"]]
