"""`oomguard plan` on ids the catalog lacks, through huggingface_hub against a local stand-in for the hub.

The stand-in (testsupport/hub.py) serves real config.json files from the catalog; huggingface_hub finds it through
HF_ENDPOINT, as it would a mirror. Each test runs the CLI in a subprocess, as a user would.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testsupport.hub import HubStandIn, safetensors_header_file

pytest.importorskip("huggingface_hub")

CATALOG = Path(__file__).resolve().parents[1] / "oomguard" / "models" / "catalog"


def catalog_config(name: str) -> dict:
    return json.loads((CATALOG / f"{name}.json").read_text())["config"]


def sharded_repo(config: dict) -> dict[str, bytes]:
    """config.json, an index with total_size, and two shards whose headers list bf16 tensors."""
    first, first_bytes = safetensors_header_file({"model.embed_tokens.weight": ("BF16", [152064, 3584])})
    second, second_bytes = safetensors_header_file({"lm_head.weight": ("BF16", [152064, 3584]),
                                                    "model.norm.weight": ("BF16", [3584])})
    index = {"metadata": {"total_size": 15231233024},
             "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors",
                            "model.norm.weight": "model-00002-of-00002.safetensors"}}
    return {"config.json": json.dumps(config).encode(), "model.safetensors.index.json": json.dumps(index).encode(),
            "model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}


@pytest.fixture
def hub(tmp_path):
    qwen = catalog_config("Qwen--Qwen2.5-7B-Instruct")
    single, single_bytes = safetensors_header_file({"model.embed_tokens.weight": ("BF16", [152064, 3584]),
                                                   "model.layers.0.mlp.up_proj.weight": ("F8_E4M3", [18944, 3584])})
    gptq_config = {k: v for k, v in qwen.items() if k != "quantization_config"}
    repos = {
        "acme/qwen-7b-sft": sharded_repo(qwen),
        "acme/qwen-7b-single": {"config.json": json.dumps(qwen).encode(), "model.safetensors": single},
        "acme/qwen-7b-gptq": {"config.json": json.dumps(gptq_config).encode(),
                              "quantize_config.json": json.dumps({"bits": 4, "group_size": 128, "desc_act": False,
                                                                  "sym": True}).encode()},
        "acme/adapter-only": {"adapter_config.json": b"{}"},
    }
    with HubStandIn(repos, gated=("acme/gated-model",), slow=("acme/slow-model",), stall_seconds=4) as server:
        server.single_bytes = single_bytes
        server.env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf"),
                      "OOMGUARD_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_DISABLE_TELEMETRY": "1",
                      "HF_HUB_ETAG_TIMEOUT": "1", "HF_HUB_DOWNLOAD_TIMEOUT": "1", "HF_TOKEN": ""}
        server.cache = tmp_path / "cache"
        yield server


def plan(env, *args):
    return subprocess.run([sys.executable, "-m", "oomguard", "plan", *args, "--gpu", "h100", "--max-model-len", "8192",
                           "--json"], capture_output=True, text=True, env=env, timeout=120)


def test_an_unknown_id_is_fetched_once_then_planned_offline_from_the_cache(hub):
    online = plan(hub.env, "acme/qwen-7b-sft")
    assert online.returncode == 0, online.stderr
    report = json.loads(online.stdout)
    # the config's arithmetic agrees with the index's total_size (15,231,233,024 bytes = 14.19 GiB): no warning
    assert abs(report["weights_gib"] - 15231233024 / 2**30) < 0.1
    assert not any("safetensors hold" in w for w in report["warnings"])
    assert "fetched from the Hugging Face hub" in report["provenance"]["model"]
    assert (hub.cache / "acme--qwen-7b-sft.json").is_file()

    offline_env = {**hub.env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    offline = plan(offline_env, "acme/qwen-7b-sft")
    assert offline.returncode == 0, offline.stderr
    again = json.loads(offline.stdout)
    assert "from the hub cache" in again["provenance"]["model"]
    assert again["weights_gib"] == report["weights_gib"] and again["kv_cache_gib"] == report["kv_cache_gib"]


def test_weights_from_single_file_headers_and_a_separate_quantization_config(hub):
    single = plan(hub.env, "acme/qwen-7b-single")
    assert single.returncode in (0, 1, 3), single.stderr
    # the stand-in's single file holds two tensors only: the plan keeps config.json's arithmetic and says they differ
    warnings = " ".join(json.loads(single.stdout)["warnings"])
    assert f"safetensors hold {hub.single_bytes / 2**30:.2f} GiB" in warnings
    gptq = plan(hub.env, "acme/qwen-7b-gptq")
    assert gptq.returncode == 0, gptq.stderr
    cached = json.loads((hub.cache / "acme--qwen-7b-gptq.json").read_text())
    assert cached["config"]["quantization_config"]["quant_method"] == "gptq"   # quantize_config.json, as vLLM reads it
    assert json.loads(gptq.stdout)["weights_gib"] < 6   # 4-bit linears: about 5 GiB where bf16 takes 14


@pytest.mark.parametrize("repo, words", [
    ("acme/gated-model", "is gated on the Hugging Face hub"),
    ("acme/no-such-model", "no repository acme/no-such-model on the Hugging Face hub"),
    ("acme/adapter-only", "has no config.json on the hub"),
    ("acme/slow-model", "could not be reached"),
])
def test_hub_refusals_are_one_clear_line(hub, repo, words):
    r = plan(hub.env, repo)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_a_gated_fine_tune_of_a_catalog_model_is_planned_as_its_base_and_says_why(hub):
    hub.env["HF_HUB_OFFLINE"] = "0"
    r = subprocess.run([sys.executable, "-m", "oomguard", "plan", "acme/Qwen2.5-7B-Instruct-AWQ", "--gpu", "h100",
                        "--json"], capture_output=True, text=True, env=hub.env, timeout=120)
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["assumptions"]
    assert any("planned as Qwen/Qwen2.5-7B-Instruct" in n for n in notes)
    assert any("no repository acme/Qwen2.5-7B-Instruct-AWQ" in n for n in notes)


def test_a_path_like_id_never_leaves_the_cache_folder(hub):
    r = plan(hub.env, "../../etc")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert not any(p.suffix == ".json" for p in hub.cache.parent.rglob("*") if p.parent != hub.cache
                   and "hf" not in p.parts)
