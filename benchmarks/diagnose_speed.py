"""Does `oomguard diagnose` stream a log of any size in linear time and bounded memory?

Writes synthetic vLLM serving logs of growing size (real vLLM line formats: a 0.11 startup, then the periodic
engine stats, uvicorn access lines, request lines, warnings, a traceback every few thousand lines, and an OOM at
the end), runs `python -m oomguard diagnose FILE --json --no-planner` on each in a fresh process, and prints per
size: wall time, throughput, peak resident memory of the child, and two ratios:
  time ratio    (t_n / t_smallest) / (size_n / size_smallest): about 1.0 when time is linear in the size
  memory ratio  peak RSS_n / peak RSS_smallest: about 1.0 when memory does not grow with the input
A `dense` profile makes every line hit a signature or fact needle (the scanner's slowest path).

Usage: python benchmarks/diagnose_speed.py [--sizes-mb 10 100] [--profile serving|dense] [--json] [--keep DIR]
Exit status 1 when a time ratio exceeds --max-time-ratio (default 1.5) or a memory ratio exceeds
--max-memory-ratio (default 1.5); the figures, not a timer inside a unit test, are the evidence.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HEAD = [
    "INFO 10-08 11:59:00 [api_server.py:1839] vLLM API server version 0.11.0",
    "INFO 10-08 11:59:00 [utils.py:233] non-default args: {'model_tag': 'Qwen/Qwen2.5-7B-Instruct', 'model': "
    "'Qwen/Qwen2.5-7B-Instruct', 'max_model_len': 32768, 'gpu_memory_utilization': 0.9}",
    "(EngineCore_DP0 pid=2) INFO 10-08 11:59:05 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: "
    "model='Qwen/Qwen2.5-7B-Instruct', dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=1, "
    "pipeline_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto",
    "(EngineCore_DP0 pid=2) INFO 10-08 11:59:10 [cuda.py:325] Using Flash Attention backend on V1 engine.",
    "(EngineCore_DP0 pid=2) INFO 10-08 11:59:20 [gpu_model_runner.py:2653] Model loading took 14.2488 GiB and "
    "10.1 seconds",
    "(EngineCore_DP0 pid=2) INFO 10-08 11:59:30 [gpu_worker.py:298] Available KV cache memory: 54.37 GiB",
    "(EngineCore_DP0 pid=2) INFO 10-08 11:59:30 [kv_cache_utils.py:1087] GPU KV cache size: 1,018,112 tokens",
    "(EngineCore_DP0 pid=2) INFO 10-08 11:59:30 [kv_cache_utils.py:1091] Maximum concurrency for 32,768 tokens "
    "per request: 31.07x",
    "(APIServer pid=1) INFO:     Application startup complete.",
]
SERVING = [
    "(APIServer pid=1) INFO 10-08 12:{m:02d}:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: {a}.3 "
    "tokens/s, Avg generation throughput: {b}.1 tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache usage: "
    "{k}.2%, Prefix cache hit rate: 12.5%",
    '(APIServer pid=1) INFO:     127.0.0.1:{p} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "(APIServer pid=1) INFO 10-08 12:{m:02d}:{s:02d} [logger.py:39] Received request chatcmpl-{p}{a}: "
    "params: SamplingParams(n=1, temperature=0.7, max_tokens={b}), prompt_token_ids: None, lora_request: None.",
    "(APIServer pid=1) WARNING 10-08 12:{m:02d}:{s:02d} [protocol.py:81] The following fields were present in the "
    "request but ignored: {{'stream_options'}}",
]
TRACEBACK = [
    "(APIServer pid=1) ERROR 10-08 12:{m:02d}:{s:02d} [serving_chat.py:236] Error in preprocessing prompt inputs",
    "(APIServer pid=1) Traceback (most recent call last):",
    '(APIServer pid=1)   File "/usr/local/lib/python3.12/site-packages/vllm/entrypoints/openai/serving_chat.py", '
    "line 220, in create_chat_completion",
]
# every line hits a needle: OOM texts, frames, facts, phase markers
DENSE = [
    "(EngineCore_DP0 pid=2) INFO 10-08 12:{m:02d}:{s:02d} [kv_cache_utils.py:1087] GPU KV cache size: {p},112 tokens",
    '(EngineCore_DP0 pid=2)   File "/x/vllm/v1/worker/gpu_model_runner.py", line {p}, in execute_model',
    "(EngineCore_DP0 pid=2) ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {b}.00 MiB. GPU 0 "
    "has a total capacity of 79.19 GiB of which {k}.00 MiB is free.",
    "(APIServer pid=1) openai.APIConnectionError: Connection error. httpx.ConnectError: [Errno 111] Connection refused",
    "(EngineCore_DP0 pid=2) INFO 10-08 12:{m:02d}:{s:02d} [gpu_worker.py:298] Available KV cache memory: {k}.37 GiB",
]
TAIL = [
    "(EngineCore_DP0 pid=2) ERROR 10-08 12:59:59 [core.py:710] torch.OutOfMemoryError: CUDA out of memory. Tried to "
    "allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.24 GiB is free. Including non-PyTorch "
    "memory, this process has 77.90 GiB memory in use. Of the allocated memory 74.10 GiB is allocated by PyTorch, "
    "and 1.90 GiB is reserved by PyTorch but unallocated.",
]


def write_log(path: Path, size_bytes: int, profile: str, seed: int = 7) -> int:
    """A log of about `size_bytes`; returns its line count."""
    rnd = random.Random(seed)
    templates = DENSE if profile == "dense" else SERVING
    lines = 0
    with open(path, "w", encoding="utf-8") as out:
        written = 0
        for line in HEAD:
            out.write(line + "\n")
            written += len(line) + 1
            lines += 1
        while written < size_bytes:
            block = []
            for _ in range(1000):
                if profile != "dense" and rnd.random() < 0.001:
                    group = TRACEBACK
                else:
                    group = [rnd.choice(templates)]
                for template in group:
                    block.append(template.format(m=rnd.randint(0, 59), s=rnd.randint(0, 59), a=rnd.randint(100, 999),
                                                 b=rnd.randint(10, 999), r=rnd.randint(1, 64), k=rnd.randint(1, 99),
                                                 p=rnd.randint(1000, 65000)))
            text = "\n".join(block) + "\n"
            out.write(text)
            written += len(text)
            lines += len(block)
        for line in TAIL:
            out.write(line + "\n")
            lines += 1
    return lines


def run_once(path: Path) -> dict:
    """Diagnose `path` in a fresh interpreter; wall time and the child's peak RSS (wait4)."""
    argv = [sys.executable, "-m", "oomguard", "diagnose", str(path), "--json", "--no-planner"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    # the child is reaped by communicate(); its rusage is in RUSAGE_CHILDREN, which is a max over all children,
    # so each size runs in its own helper process (see measure())
    import resource
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"diagnose exited {proc.returncode}: {err.decode(errors='replace')[-400:]}")
    data = json.loads(out)
    return {"wall_s": wall, "peak_rss_mib": peak_kib / 1024, "top": data["findings"][0]["class"] if data["findings"]
            else None, "lines_read": data["facts"].get("lines_read")}


def measure(path: Path) -> dict:
    """run_once in a helper process, so RUSAGE_CHILDREN holds this one diagnose child only."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from benchmarks.diagnose_speed import run_once; "
            "from pathlib import Path; print(json.dumps(run_once(Path(sys.argv[2]))))")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT), str(path)], capture_output=True, text=True,
                          cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-800:])
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[10, 100])
    parser.add_argument("--profile", choices=("serving", "dense"), default="serving")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size; the fastest counts")
    parser.add_argument("--max-time-ratio", type=float, default=1.5)
    parser.add_argument("--max-memory-ratio", type=float, default=1.5)
    parser.add_argument("--keep", type=Path, help="write the logs here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = sorted(args.sizes_mb)

    with tempfile.TemporaryDirectory(prefix="oomguard-diag-speed-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows = []
        for mb in sizes:
            path = folder / f"{args.profile}-{mb:g}MB.log"
            lines = write_log(path, int(mb * 1e6), args.profile)
            runs = [measure(path) for _ in range(max(1, args.repeat))]
            best = min(runs, key=lambda r: r["wall_s"])
            best["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
            rows.append({"size_mb": round(path.stat().st_size / 1e6, 1), "lines": lines, **best})
    base = rows[0]
    for row in rows:
        scale = row["size_mb"] / base["size_mb"]
        row["mb_per_s"] = round(row["size_mb"] / row["wall_s"], 2)
        row["time_ratio"] = round((row["wall_s"] / base["wall_s"]) / scale, 2)
        row["memory_ratio"] = round(row["peak_rss_mib"] / base["peak_rss_mib"], 2)
        row["wall_s"], row["peak_rss_mib"] = round(row["wall_s"], 2), round(row["peak_rss_mib"], 1)
    ok = all(r["time_ratio"] <= args.max_time_ratio and r["memory_ratio"] <= args.max_memory_ratio for r in rows)
    if args.json:
        print(json.dumps({"profile": args.profile, "rows": rows, "ok": ok}, indent=2))
    else:
        print(f"profile {args.profile}; python {sys.version.split()[0]}; {os.cpu_count()} CPUs")
        print(f"{'size MB':>8} {'lines':>10} {'wall s':>8} {'MB/s':>6} {'peak RSS MiB':>13} {'time ratio':>11} "
              f"{'mem ratio':>10}  top finding")
        for r in rows:
            print(f"{r['size_mb']:>8} {r['lines']:>10,} {r['wall_s']:>8} {r['mb_per_s']:>6} {r['peak_rss_mib']:>13} "
                  f"{r['time_ratio']:>11} {r['memory_ratio']:>10}  {r['top']}")
        print("linear time and bounded memory" if ok else "RATIO ABOVE THE LIMIT")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
