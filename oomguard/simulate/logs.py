"""vLLM-like log lines: startup memory lines per version (research section 6 and 4.7) and the OOM crash.

Format `INFO MM-DD HH:MM:SS [file.py:line] message`, with the `(EngineCore_DP0 pid=N) ` process prefix on engine
lines from 0.11 on, so that `oomguard diagnose` reads a simulator's log as it reads vLLM's.
"""

from __future__ import annotations

import os
import time

from oomguard.engines.vllm.releases import release
from oomguard.simulate.plan import SimPlan
from oomguard.units import GiB


def _stamp(level: str, where: str, message: str, prefix: str = "") -> str:
    return f"{prefix}{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {message}"


def format_gib(n_bytes: float) -> str:
    """vLLM's format_gib (>= 0.14): round to 2 decimals, no padding."""
    return f"{round(n_bytes / GiB, 2)}"


def startup_lines(plan: SimPlan, host: str, port: int, speed: float, pid: int | None = None) -> list[str]:
    v = plan.vllm_version
    rel = release(v)
    pid = os.getpid() if pid is None else pid
    engine = f"(EngineCore_DP0 pid={pid}) " if rel.engine_core_prefix else ""
    weights_gib = plan.weights_bytes / GiB
    load_s = max(weights_gib / 1.6, 0.1)
    lines = [
        _stamp("INFO", "api_server.py:1395", f"vLLM API server version {'.'.join(map(str, v))} "
               f"(oomguard simulate, {speed:g}x the GPU's roofline speed)"),
        # vLLM's flags only: `oomguard diagnose` turns this line into a `vllm serve` command
        _stamp("INFO", "api_server.py:1396", f"args: model={plan.model!r}, max_model_len={plan.max_model_len}, "
               f"gpu_memory_utilization={plan.gpu_memory_utilization}, block_size={plan.block_size}, "
               f"max_num_seqs={plan.max_num_seqs}, max_num_batched_tokens={plan.max_num_batched_tokens}"),
    ]
    if plan.engine == "v1":
        lines.append(_stamp("INFO", "scheduler.py:222",
                            f"Chunked prefill is enabled with max_num_batched_tokens={plan.max_num_batched_tokens}.",
                            engine))
    lines.append(_stamp("INFO", "default_loader.py:262", f"Loading weights took {load_s:.2f} seconds", engine))
    lines.append(_stamp("INFO", "gpu_model_runner.py:3419", rel.weights_line.format(
        gib=weights_gib, gib_rounded=format_gib(plan.weights_bytes), secs=load_s + 0.5), engine))

    kv_gib = plan.kv_cache_bytes / GiB
    concurrency = plan.max_concurrency
    tokens, mml = plan.kv_cache_tokens, plan.max_model_len
    if plan.engine == "v0":
        total = plan.total_memory_bytes / GiB
        budget = total * plan.gpu_memory_utilization
        lines.append(_stamp("INFO", "worker.py:267",
                            "Memory profiling takes 2.31 seconds\nthe current vLLM instance can use total_gpu_memory "
                            f"({total:.2f}GiB) x gpu_memory_utilization ({plan.gpu_memory_utilization:.2f}) = "
                            f"{budget:.2f}GiB\nmodel weights take {weights_gib:.2f}GiB; non_torch_memory takes "
                            f"0.13GiB; PyTorch activation peak memory takes {max(budget - weights_gib - kv_gib - 0.13, 0):.2f}GiB;"
                            f" the rest of the memory reserved for KV Cache is {kv_gib:.2f}GiB."))
        lines.append(_stamp("INFO", "executor_base.py:111",
                            f"# {rel.blocks_word} blocks: {plan.num_gpu_blocks}, # CPU blocks: 2048"))
        lines.append(_stamp("INFO", "executor_base.py:116",
                            f"Maximum concurrency for {mml} tokens per request: {concurrency:.2f}x"))
    else:
        if rel.available_kv_line:
            kv_text = format_gib(plan.kv_cache_bytes) if rel.gib_rounded else f"{kv_gib:.2f}"
            lines.append(_stamp("INFO", "gpu_worker.py:338", f"Available KV cache memory: {kv_text} GiB", engine))
        if rel.kv_size_and_concurrency_one_line:
            lines.append(_stamp("INFO", "kv_cache_utils.py:1316", f"GPU KV cache size: {tokens:,} tokens, Maximum "
                                f"concurrency for {mml:,} tokens per request: {concurrency:.2f}x", engine))
        else:
            lines.append(_stamp("INFO", "kv_cache_utils.py:1087", f"GPU KV cache size: {tokens:,} tokens", engine))
            lines.append(_stamp("INFO", "kv_cache_utils.py:1091",
                                f"Maximum concurrency for {mml:,} tokens per request: {concurrency:.2f}x", engine))
        if rel.num_gpu_blocks_logged:
            lines.append(_stamp("INFO", "loggers.py:147", "Engine 000: vllm cache_config_info with initialization "
                                f"after num_gpu_blocks is: {plan.num_gpu_blocks}", engine))
        lines.append(_stamp("INFO", "core.py:210",
                            "init engine (profile, create kv cache, warmup model) took 12.34 seconds", engine))
    lines.append(_stamp("INFO", "api_server.py:1420", f"Starting vLLM API server on http://{host}:{port}"))
    lines += ["INFO:     Started server process [%d]" % pid, "INFO:     Waiting for application startup.",
              "INFO:     Application startup complete."]
    return lines


def oom_lines(plan: SimPlan, request_id: str, needed_blocks: int, free_blocks: int) -> list[str]:
    """An EngineCore death by CUDA OOM, as vLLM prints it when the engine process fails (simulated)."""
    engine = f"(EngineCore_DP0 pid={os.getpid()}) " if release(plan.vllm_version).engine_core_prefix else ""
    total = plan.total_memory_bytes / GiB
    free_mib = 3.06
    used = total - free_mib / 1024
    tried = max(needed_blocks, 1) * plan.kv_cache_bytes / max(plan.num_gpu_blocks, 1) / (1 << 20)
    msg = (f"CUDA out of memory. Tried to allocate {tried:.2f} MiB. GPU 0 has a total capacity of {total:.2f} GiB "
           f"of which {free_mib:.2f} MiB is free. Including non-PyTorch memory, this process "
           f"has {used:.2f} GiB memory in use. Of the allocated memory {used - 1.2:.2f} GiB is allocated by PyTorch, "
           "and 412.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
           "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
           "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    where = "core.py:708"
    return [
        _stamp("ERROR", where, "EngineCore encountered a fatal error.", engine),
        f"{engine}Traceback (most recent call last):",
        f'{engine}  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 699, in run_engine_core',
        f"{engine}    engine_core.run_busy_loop()",
        f'{engine}  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2310, in execute_model',
        f"{engine}    hidden_states = self.model(",
        f"{engine}torch.OutOfMemoryError: {msg}",
        _stamp("ERROR", "async_llm.py:480", "AsyncLLM output_handler failed."),
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
        "root cause.",
        f"(oomguard simulate: the KV cache ran out: request {request_id} needed {needed_blocks} more blocks, "
        f"{free_blocks} free; --crash-on-kv-exhaustion)",
    ]
