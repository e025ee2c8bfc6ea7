"""`oomguard simulate`: a vLLM-compatible simulated server for what-if runs and scheduler tests."""

from __future__ import annotations

import argparse
import math

DESCRIPTION = """Serve vLLM's OpenAI API from a simulated engine: the KV cache has the block count the planner
predicts for MODEL on GPU with these vLLM flags (or --num-gpu-blocks), requests are batched and preempted by
vLLM's V1 scheduling rules, and every step takes the GPU's roofline time divided by --speed.
/metrics uses vLLM's metric names for --vllm-version. It does not run a model: text is filler words.

examples:
  oomguard simulate meta-llama/Llama-3.1-8B-Instruct --gpu h100 --max-model-len 8192 --port 8000
  oomguard simulate my-model --num-gpu-blocks 2000 --max-model-len 4096 --speed 100 --port 0
  oomguard simulate my-model --num-gpu-blocks 300 --crash-on-kv-exhaustion --vllm-version 0.10.1
"""


# 2^24 blocks of 16 tokens is 268M tokens of KV cache: beyond any GPU, and the simulator keeps a list per block
MAX_GPU_BLOCKS = 1 << 24

def add_arguments(parser: argparse.ArgumentParser) -> None:
    from oomguard.engines.vllm.flags import add_flags

    parser.add_argument("model", metavar="MODEL", help="model id (catalog or Hugging Face), or any name with "
                        "--num-gpu-blocks")
    parser.add_argument("--gpu", help="GPU name or alias (h100, a100-40gb, rtx4090, l4, ...)")
    parser.add_argument("--gpu-count", type=int, metavar="N", help="GPUs (default: TP x PP)")
    parser.add_argument("--model-config", metavar="PATH", help="a config.json or a model directory")
    parser.add_argument("--vllm-version", metavar="X.Y.Z", help="the vLLM version to imitate (default: newest modelled)")
    parser.add_argument("--num-gpu-blocks", "--num-gpu-blocks-override", dest="num_gpu_blocks", type=int,
                        metavar="N", help="KV blocks (overrides the planner; block 0 is reserved, as in vLLM)")
    parser.add_argument("--enable-chunked-prefill", dest="enable_chunked_prefill",
                        action=argparse.BooleanOptionalAction, default=True, help="chunk long prompts (V1 default on)")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="run this many times faster than the GPU's roofline (e.g. 100 in tests)")
    parser.add_argument("--crash-on-kv-exhaustion", action="store_true",
                        help="instead of preempting when KV blocks run out, die like a CUDA OOM (exit 1)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free port; the log says which)")
    parser.add_argument("--served-model-name", help="the model name the API reports (default: MODEL)")
    parser.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1 endpoints")
    add_flags(parser)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import os
    import signal
    import socket
    import sys

    from aiohttp import web

    from oomguard.engines.vllm import messages
    from oomguard.engines.vllm.flags import flags_from_args
    from oomguard.errors import UsageError
    from oomguard.simulate import logs
    from oomguard.simulate.plan import fits_one_request, plan_simulation
    from oomguard.simulate.scheduler import KvCacheExhausted
    from oomguard.simulate.server import SimEngine, build_app, print_lines
    from oomguard.units import cdiv

    if not (math.isfinite(args.speed) and args.speed > 0):
        raise UsageError(f"--speed must be a positive number (got {args.speed})")
    if args.num_gpu_blocks is not None and not 2 <= args.num_gpu_blocks <= MAX_GPU_BLOCKS:
        raise UsageError(f"--num-gpu-blocks must be between 2 (block 0 is the null block) and {MAX_GPU_BLOCKS:,} "
                         "(more than any GPU holds)")
    flags = flags_from_args(args)
    plan = plan_simulation(args.model, args.gpu, gpu_count=args.gpu_count, vllm_version=args.vllm_version,
                           flags=flags, model_config=args.model_config, num_gpu_blocks=args.num_gpu_blocks,
                           enable_chunked_prefill=args.enable_chunked_prefill)
    if not plan.starts:
        print(f"ValueError: {plan.error}", file=sys.stderr)
        return 1
    if not fits_one_request(plan):
        per_block = plan.kv_bytes_per_token * plan.block_size
        needed = cdiv(plan.max_model_len, plan.block_size) * per_block
        usable = (plan.num_gpu_blocks - 1) * per_block
        estimated = (plan.num_gpu_blocks - 1) * plan.block_size
        print("ValueError: " + messages.kv_too_small(plan.vllm_version, plan.engine, plan.max_model_len, needed,
                                                     usable, estimated, estimated), file=sys.stderr)
        return 1

    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    port = sock.getsockname()[1]

    def fatal(exc: BaseException) -> None:
        sys.stdout.flush()
        if isinstance(exc, KvCacheExhausted):
            print_lines(logs.oom_lines(plan, exc.request_id, exc.needed_blocks, exc.free_blocks), sys.stderr)
            os._exit(1)
        import traceback
        traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.flush()
        os._exit(70)

    engine = SimEngine(plan, speed=args.speed, crash_on_kv_exhaustion=args.crash_on_kv_exhaustion,
                       served_model_name=args.served_model_name, on_fatal=fatal)
    app = build_app(engine, api_key=args.api_key)

    async def serve() -> None:
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        print_lines(logs.startup_lines(plan, args.host, port, args.speed))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        print("INFO:     Shutting down", flush=True)
        await runner.cleanup()

    asyncio.run(serve())
    return 0
