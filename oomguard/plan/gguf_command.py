"""`oomguard plan FILE.gguf`: llama.cpp's memory for the file as it is, and vLLM's where its GGUF loader runs it.

llama.cpp: the layers on the GPU (-ngl), the KV cache type and the context, from the file's own tensors
(engines/llamacpp/fit.py). vLLM: the same memory model as any checkpoint, the weights kept in the file's ggml
blocks as vLLM's GGUF layers keep them (vllm/model_executor/layers/quantization/gguf.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from oomguard.errors import UsageError
from oomguard.units import GiB


def run_gguf(args, path: str, flags: dict, extra: tuple[str, ...]) -> int:
    from oomguard.engines.llamacpp import fit
    from oomguard.engines.llamacpp.gguf_file import read_gguf
    from oomguard.engines.vllm.memory import predict
    from oomguard.engines.vllm.versions import NEWEST, parse_version
    from oomguard.plan.api import engine_config, free_memory_bytes, resolve_gpu

    gguf = read_gguf(path)
    gpu = resolve_gpu(args.gpu, args.gpu_memory, args.interconnect)
    given = free_memory_bytes(gpu, args.free_memory)
    free = given if given is not None else gpu.total_memory_bytes
    context = flags.get("max_model_len") or gguf.model.derived_max_model_len
    slots = flags.get("max_num_seqs") or 1
    if not 0 < context <= 16 * gguf.model.derived_max_model_len or slots < 1:
        raise UsageError(f"--max-model-len must be between 1 and {16 * gguf.model.derived_max_model_len} and "
                         "--max-num-seqs at least 1 for this file")
    llama = fit.plan(gguf.model, free, n_ctx_per_slot=context, n_parallel=slots, weights=gguf.weights,
                     gpu_bandwidth=gpu.memory_bandwidth_bytes_per_s, gpu_flops=gpu.bf16_dense_flops,
                     pcie_bandwidth=gpu.pcie_bandwidth_bytes_per_s)
    llama = replace(llama, model_file=path)
    version = parse_version(args.vllm_version) if args.vllm_version else NEWEST
    vllm = predict(gguf.model, gpu, engine_config(flags), version, gpu_count=args.gpu_count or 1,
                    free_memory_bytes=given)
    vllm_command = f"vllm serve {path} --tokenizer {gguf.base_repo or 'ORIGINAL_REPO_ID'} " + " ".join(extra)
    if args.json:
        json.dump({"gguf": {"path": path, "architecture": gguf.architecture, "file_type": gguf.file_type,
                            "tensor_gib": round(gguf.tensor_bytes / GiB, 3), "n_ctx_train":
                            gguf.model.derived_max_model_len, "source": gguf.model.source},
                   "llamacpp": llama.to_dict(), "vllm": {**vllm.to_dict(), "command": vllm_command.strip()}},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{path}: {gguf.architecture}, {gguf.file_type or 'mixed types'}, {gguf.tensor_bytes / GiB:.2f} GiB of "
          f"tensors, trained context {gguf.model.derived_max_model_len:,} tokens")
    print(f"on {gpu.name} ({free / GiB:.2f} GiB free)")
    print(f"\nllama.cpp: {llama.summary()}")
    print(f"  {llama.split.describe()}; on the GPU: {llama.split.gpu_bytes / GiB:.2f} GiB (weights "
          f"{llama.split.gpu_weights_bytes / GiB:.2f}, KV cache {llama.split.gpu_kv_bytes / GiB:.2f}, compute buffer "
          f"{llama.split.gpu_compute_bytes / GiB:.2f}, estimated), {llama.margin_bytes / GiB:.1f} GiB kept free as "
          "llama-fit-params does")
    print(f"  {llama.command()}")
    verdict = {"starts": "starts", "at_risk": "at risk", "fails": "does not start"}[vllm.verdict]
    print(f"\nvLLM {vllm.vllm_version} (GGUF loader, weights kept in the file's blocks): {verdict}, "
          f"{vllm.workers[0].weights_bytes / GiB:.2f} GiB of weights, {vllm.kv_cache_tokens:,} tokens of KV cache")
    for line in (vllm.error,) if vllm.verdict == "fails" else vllm.risks:
        print(f"  {line}")
    print(f"  {vllm_command.strip()}")
    print("  (vLLM's docs advise the original model's tokenizer: converting a GGUF's is slow and can fail)")
    return 0
