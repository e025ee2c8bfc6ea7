"""oomguard diagnose on a real llama-server (built from the vendored llama.cpp, tiny model): its startup log, its
context-overflow error as the client sees it, and its live /metrics page."""

import json
import time
import urllib.error
import urllib.request

from oomguard.cli import main
from oomguard.diagnose import diagnose_text


def _post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_real_llama_server_log_error_and_metrics(llama_server, capsys):
    server = llama_server(ctx_size=256, parallel=2)  # 128 tokens per slot
    status, body = _post(server.url + "/v1/completions", {"prompt": "word " * 400, "max_tokens": 4})
    assert status == 400

    # what the client got back
    client = diagnose_text(f"openai.BadRequestError: Error code: 400 - {body}", use_planner=False)
    assert client.findings[0].cls == "context_too_long"

    # the server's own log: a clean llama.cpp startup read as such
    deadline = time.monotonic() + 10   # the server writes its log line for the refusal after answering
    while True:
        d = diagnose_text(server.log_path.read_text(errors="replace"), use_planner=False)
        if d.findings or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert d.facts["engine"] == "llamacpp"
    assert d.facts["n_parallel"] == 2 and d.facts["n_ctx_slot"] in (128, 256)
    assert d.facts["model"].endswith(".gguf")
    # ... and the request it refused
    assert [f.cls for f in d.findings] == ["context_too_long"]
    assert d.findings[0].numbers["prompt_tokens"] == 402 or d.findings[0].numbers["prompt_tokens"] > 256

    # the live metrics page: an idle server, nothing wrong
    code = main(["diagnose", "--metrics", server.url + "/metrics", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["facts"]["engine"] == "llamacpp" and data["findings"] == []


def test_llama_cpp_fixes_carry_the_numbers_the_log_shows():
    """-ngl from the model buffer of the offloaded layers and the GPU's memory beside the KV buffer; -c halved from
    the context the log shows."""
    from oomguard.diagnose.pipeline import diagnose_text

    log = ("load_tensors: offloaded 33/33 layers to GPU\n"
           "load_tensors:        CUDA0 model buffer size =  7605.33 MiB\n"
           "llama_context: n_ctx         = 32768\n"
           "llama_kv_cache:      CUDA0 KV buffer size =  4096.00 MiB\n"
           "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 7605.33 MiB on device 0: cudaMalloc failed: "
           "out of memory\nalloc_tensor_range: failed to allocate CUDA0 buffer of size 7974748160\n")
    d = diagnose_text(log, use_planner=False, given={"total_gpu_memory_gib": 11.75})
    top = d.findings[0]
    assert top.cls == "oom_weights_load"
    ngl = next(f for f in top.fixes if f.flag == "-ngl")
    # 7605 MiB / 33 layers = 0.23 GiB a layer; 11.75 - 1 (llama-fit-params' margin) - 4 (KV) = 6.75 GiB -> 29 layers
    assert ngl.value == 29 and "0.23 GiB" in ngl.reason
    kv = diagnose_text("llama_context: n_ctx         = 32768\nllama_kv_cache:      CUDA0 KV buffer size =  4096.00 MiB\n"
                       "llama_init_from_model: failed to allocate buffer for kv cache\n", use_planner=False)
    assert next(f for f in kv.findings[0].fixes if f.flag == "-c").value == 16384
