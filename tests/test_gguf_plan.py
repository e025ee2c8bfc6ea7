"""`oomguard plan FILE.gguf`: a GGUF's metadata and tensors planned for llama.cpp and for vLLM's GGUF loader."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("gguf")

from oomguard.engines.llamacpp import fit  # noqa: E402
from oomguard.engines.llamacpp.gguf_file import read_gguf  # noqa: E402
from oomguard.engines.llamacpp.shapegguf import write_shape_gguf  # noqa: E402
from oomguard.models.load import load_model  # noqa: E402
from oomguard.units import GiB  # noqa: E402


def oomguard(*args):
    return subprocess.run([sys.executable, "-m", "oomguard", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def llama8b_q4(tmp_path_factory):
    model = load_model("meta-llama/Llama-3.1-8B-Instruct")
    return model, write_shape_gguf(tmp_path_factory.mktemp("gguf") / "Llama-3.1-8B-Instruct-Q4_K_M.gguf", model,
                                   "Q4_K_M")


def test_the_file_gives_the_models_shapes_and_its_own_tensor_bytes(llama8b_q4):
    model, path = llama8b_q4
    read = read_gguf(str(path))
    assert (read.architecture, read.file_type) == ("llama", "Q4_K_M")
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
                  "intermediate_size", "tie_word_embeddings"):
        assert getattr(read.model, field) == getattr(model, field), field
    assert read.weights == fit.gguf_weights(model, "Q4_K_M")
    # vLLM keeps the ggml blocks: about 4.9 GB of weights where bf16 takes 16 GB
    assert 0.55 < read.model.quant.bytes_per_param() < 0.65


def test_plan_a_gguf_for_llama_cpp_and_vllm(llama8b_q4):
    _, path = llama8b_q4
    r = oomguard("plan", str(path), "--gpu", "rtx3060", "--max-model-len", "16384", "--max-num-seqs", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["gguf"]["file_type"] == "Q4_K_M" and abs(out["gguf"]["tensor_gib"] - 4.58) < 0.01
    llama = out["llamacpp"]
    assert llama["fits_on_gpu"] and llama["n_ctx"] == 32768 and llama["n_parallel"] == 2
    assert f"-m {path} -ngl 33 -c 32768 -np 2" in llama["command"]
    vllm = out["vllm"]
    assert vllm["verdict"] == "starts" and 4.3 < vllm["weights_gib"] < 4.8
    assert vllm["command"].startswith(f"vllm serve {path} --tokenizer")
    text = oomguard("plan", str(path), "--gpu", "rtx3060", "--max-model-len", "16384")
    assert text.returncode == 0 and "llama-server -m" in text.stdout and "vLLM" in text.stdout


def test_a_gguf_too_big_for_the_gpu_keeps_layers_on_the_cpu(llama8b_q4):
    _, path = llama8b_q4
    r = oomguard("plan", "--model-config", str(path), "--gpu-memory", "4", "--max-model-len", "8192", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert not out["llamacpp"]["fits_on_gpu"] and 0 < out["llamacpp"]["n_gpu_layers"] < 33
    assert out["llamacpp"]["split"]["gpu_gib"]["total"] <= 4 - 1.0 + 1e-6   # llama-fit-params' 1 GiB margin
    assert out["vllm"]["verdict"] == "fails"


@pytest.mark.parametrize("content, words", [
    (b"not a gguf at all", "is not a readable GGUF file"),
    (b"GGUF\x03\x00\x00\x00", "is not a readable GGUF file"),   # a truncated header
])
def test_a_bad_file_is_one_line(tmp_path, content, words):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    r = oomguard("plan", str(bad), "--gpu", "rtx4090")
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr
    missing = oomguard("plan", str(tmp_path / "nope.gguf"), "--gpu", "rtx4090")
    assert missing.returncode == 2 and "no such GGUF file" in missing.stderr


def test_an_architecture_not_modelled_is_refused_by_name(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "mamba.gguf"
    writer = GGUFWriter(str(path), "mamba")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    r = oomguard("plan", str(path), "--gpu", "rtx4090")
    assert r.returncode == 2 and "GGUF architecture 'mamba' is not modelled" in r.stderr


def test_free_memory_is_the_gpus_unless_given(llama8b_q4):
    from oomguard.gpus.catalog import resolve_gpu

    _, path = llama8b_q4
    out = json.loads(oomguard("plan", str(path), "--gpu", "rtx4090", "--json").stdout)
    assert abs(out["llamacpp"]["gpu_free_gib"] - resolve_gpu("rtx4090").total_memory_bytes / GiB) < 0.01
    given = json.loads(oomguard("plan", str(path), "--gpu", "rtx4090", "--free-memory", "12", "--json").stdout)
    assert given["llamacpp"]["gpu_free_gib"] == 12.0
