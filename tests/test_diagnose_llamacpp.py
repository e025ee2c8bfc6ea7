"""oomguard diagnose on a real llama-server (built from the vendored llama.cpp, tiny model): its startup log, its
context-overflow error as the client sees it, and its live /metrics page."""

import json
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
    log = server.log_path.read_text(errors="replace")
    d = diagnose_text(log, use_planner=False)
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
