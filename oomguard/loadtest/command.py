"""`oomguard loadtest URL`: a peak-load test of an OpenAI-compatible server while watching its /metrics."""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import signal
import sys

from oomguard.errors import UsageError

DESCRIPTION = """\
Load-test an OpenAI-compatible server (vLLM, SGLang, llama.cpp) while sampling its /metrics every 0.5 s
(KV-cache usage, running, waiting, preemptions; GPU memory through NVML when the server is local).

load shapes (one of; a range START:MAX[:STEP] steps the load up, stage by stage: the peak profile):
  --concurrency N | 1:64 | 4:64:+4     closed loop, N requests always in flight (default 8)
  --rate R | 2:40:+2  [--poisson]      open loop, R requests a second
  --burst N/PERIOD                     N requests at once every PERIOD (e.g. 32/10s)

examples:
  oomguard loadtest http://127.0.0.1:8000 --dataset peak --prompt-tokens 7000 --output-tokens 1000 \\
      --rate 20 --duration 5m --html report.html
  oomguard loadtest http://127.0.0.1:8000 --find-capacity --concurrency 1:256 --duration 30s
  oomguard loadtest http://127.0.0.1:8000 --concurrency 1:64 --stop-when 'kv>0.95,p99_ttft>2s' --json out.json

exit codes: 0 the load held (or a capacity was found), 1 it broke, 2 bad input or unreachable server,
130 interrupted (a partial report is still written)."""

DEFAULT_RAMP_STOP = "kv>0.95,preemptions>0,errors>0"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000 (with or without /v1)")
    g = p.add_argument_group("requests")
    g.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    g.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions (default completions)")
    g.add_argument("--no-stream", action="store_true", help="send non-streaming requests (no TTFT/ITL)")
    g.add_argument("--dataset", default="random", metavar="random|peak|jsonl:PATH|sharegpt:PATH",
                   help="where prompts come from (default random)")
    g.add_argument("--prompt-tokens", metavar="N|LOW:HIGH",
                   help="prompt length in tokens, fixed or uniform (random: default 256; peak: the p99)")
    g.add_argument("--output-tokens", metavar="N|LOW:HIGH",
                   help="output length, fixed or uniform (random: default 128; peak: the p99, default 256; "
                        "files: a cap)")
    g.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=None,
                   help="ask the server to generate exactly max_tokens (default for random and peak)")
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable holding the API key (default OPENAI_API_KEY)")
    g.add_argument("--extra-body", metavar="JSON", help="extra JSON fields for every request body")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--request-timeout", default="600s", metavar="DURATION")

    s = p.add_argument_group("load")
    m = s.add_mutually_exclusive_group()
    m.add_argument("--concurrency", metavar="N|START:MAX[:STEP]")
    m.add_argument("--rate", metavar="R|START:MAX[:STEP]")
    m.add_argument("--burst", metavar="N/PERIOD")
    s.add_argument("--poisson", action="store_true", help="Poisson arrivals for --rate")
    s.add_argument("--duration", default="60s", metavar="DURATION",
                   help="how long to hold the load (a step, for ramps and --find-capacity); default 60s")
    s.add_argument("--max-requests", type=int, default=100_000, metavar="N",
                   help="request cap (a step, for ramps and --find-capacity); default 100000")
    s.add_argument("--max-inflight", type=int, default=10_000, metavar="N",
                   help="open loop: most requests out at once; arrivals beyond it are skipped and counted")
    s.add_argument("--drain-timeout", default="30s", metavar="DURATION",
                   help="at the end, how long in-flight requests may finish before they are cancelled")

    c = p.add_argument_group("stop conditions and capacity")
    c.add_argument("--stop-when", metavar="CONDITIONS",
                   help="stop when any holds, e.g. 'kv>0.95,preemptions>0,errors>0,p99_ttft>2s' "
                        f"(ramps and --find-capacity default to '{DEFAULT_RAMP_STOP}')")
    c.add_argument("--find-capacity", action="store_true",
                   help="find the highest concurrency (or rate) that keeps KV under --kv-limit with no "
                        "preemptions and no errors: step up over the range, then bisect")
    c.add_argument("--kv-limit", type=float, default=0.95, metavar="FRACTION",
                   help="KV usage a capacity must stay under (default 0.95)")
    c.add_argument("--goodput", metavar="SLOS",
                   help="count a request as good only if it meets these, e.g. 'ttft=2s,tpot=100ms,e2e=30s'")

    o = p.add_argument_group("server metrics and output")
    o.add_argument("--metrics-url", help="the server's metrics page (default URL/metrics)")
    o.add_argument("--no-metrics", action="store_true", help="do not sample the server's /metrics")
    o.add_argument("--no-gpu", action="store_true", help="do not read GPU memory through NVML")
    o.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="write the full report (every figure and the time series) as JSON to PATH, or to "
                        "stdout instead of the table")
    o.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with charts")
    o.add_argument("--progress", choices=("auto", "live", "lines", "off"), default="auto",
                   help="live display on stderr (auto: when stderr is a terminal, else a line every 10 s)")


def _parse_goodput(text: str | None) -> dict[str, float]:
    from oomguard.loadtest.shapes import parse_duration

    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in ("ttft", "tpot", "e2e"):
            raise UsageError(f"--goodput takes ttft=2s,tpot=100ms,e2e=30s (any of them), not {text!r}")
        out[name] = parse_duration(value, f"--goodput {name}")
    return out


class Plan:
    """Everything the run needs, validated before any network I/O."""

    def __init__(self, args: argparse.Namespace):
        from oomguard.loadtest.client import normalise_base_url
        from oomguard.loadtest.conditions import parse_conditions
        from oomguard.loadtest.shapes import Load, parse_burst, parse_duration, parse_level
        from oomguard.loadtest.workload import Lengths, load_jsonl, load_sharegpt, parse_dataset

        self.args = args
        self.base_url = normalise_base_url(args.url)
        self.metrics_url = None if args.no_metrics else (args.metrics_url or self.base_url + "/metrics")
        if args.metrics_url:
            normalise_base_url(args.metrics_url)
        self.duration = parse_duration(args.duration, "--duration")
        self.drain_timeout = parse_duration(args.drain_timeout, "--drain-timeout") if args.drain_timeout not in (
            "0", "0s") else 0.0
        self.request_timeout = parse_duration(args.request_timeout, "--request-timeout")
        if args.max_requests < 1:
            raise UsageError("--max-requests must be at least 1")
        if args.max_inflight < 1:
            raise UsageError("--max-inflight must be at least 1")
        if not 0 < args.kv_limit <= 1:
            raise UsageError("--kv-limit is a fraction in (0, 1], e.g. 0.95")
        self.goodput = _parse_goodput(args.goodput)
        self.extra_body = None
        if args.extra_body:
            try:
                self.extra_body = json.loads(args.extra_body)
            except json.JSONDecodeError as exc:
                raise UsageError(f"--extra-body is not JSON: {exc.msg}") from None
            if not isinstance(self.extra_body, dict):
                raise UsageError("--extra-body must be a JSON object")

        # load shape
        self.ramp = None
        if args.burst:
            if args.find_capacity:
                raise UsageError("--find-capacity steps --concurrency or --rate, not --burst")
            self.load = parse_burst(args.burst)
        elif args.rate:
            value, self.ramp = parse_level(args.rate, "--rate", integer=False)
            self.load = Load("poisson" if args.poisson else "rate", value)
        else:
            if args.poisson:
                raise UsageError("--poisson goes with --rate")
            default = "1:256" if args.find_capacity else "8"
            value, self.ramp = parse_level(args.concurrency or default, "--concurrency", integer=True)
            self.load = Load("concurrency", value)
        if args.find_capacity and self.ramp is None:
            raise UsageError("--find-capacity needs a range to search, e.g. --concurrency 1:256 or --rate 1:100")
        self.mode = "capacity" if args.find_capacity else ("ramp" if self.ramp else "fixed")

        stop = args.stop_when
        if stop is None and self.mode == "ramp":
            stop = DEFAULT_RAMP_STOP
        self.conditions = parse_conditions(stop)
        if self.mode == "capacity":
            for extra in parse_conditions(f"kv>{args.kv_limit},preemptions>0,errors>0"):
                if not any(c.metric == extra.metric for c in self.conditions):
                    self.conditions.append(extra)

        # workload
        self.dataset_kind, path = parse_dataset(args.dataset)
        self.prompt_lengths = Lengths.parse(args.prompt_tokens, "--prompt-tokens") if args.prompt_tokens else None
        self.output_lengths = Lengths.parse(args.output_tokens, "--output-tokens") if args.output_tokens else None
        self.file_workload = None
        if self.dataset_kind == "jsonl":
            self.file_workload = load_jsonl(path, self.output_lengths.high if self.output_lengths else None)
        elif self.dataset_kind == "sharegpt":
            self.file_workload = load_sharegpt(path, self.output_lengths.high if self.output_lengths else None)
        if self.dataset_kind == "peak":
            for what, lengths in (("--prompt-tokens", self.prompt_lengths), ("--output-tokens", self.output_lengths)):
                if lengths is not None and lengths.low != lengths.high:
                    raise UsageError(f"--dataset peak sends every request at the p99: give {what} as one number")
        self.ignore_eos = args.ignore_eos if args.ignore_eos is not None else self.dataset_kind in ("random", "peak")
        self.api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
        if args.json and args.json != "-":
            _check_writable(args.json, "--json")
        if args.html:
            _check_writable(args.html, "--html")
        mode = args.progress
        if mode == "auto":
            mode = "live" if sys.stderr.isatty() else "lines"
        self.progress_mode = mode


def _check_writable(path: str, flag: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a directory")
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise UsageError(f"{flag} {path}: not writable here (permission denied); pick another path")


def _write(path: str, text: str, flag: str, report: dict) -> None:
    """Write an output the run produced; if the path failed since the start, the report goes to a file of its own,
    never lost."""
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="oomguard-loadtest-", delete=False,
                                         encoding="utf-8") as fh:
            fh.write(json.dumps(report, indent=1, allow_nan=False) + "\n")
        raise UsageError(f"{flag} {path}: {exc.strerror or exc}; the report is in {fh.name}") from None


def run(args: argparse.Namespace) -> int:
    plan = Plan(args)
    report = asyncio.run(_main(plan))
    return _emit(plan, report)


async def _build_workload(plan: Plan, session, info, notes: list[str]):
    from oomguard.loadtest.client import count_tokens
    from oomguard.loadtest.workload import Lengths, PromptMaker, SyntheticWorkload

    if plan.file_workload is not None:
        return plan.file_workload
    maker = PromptMaker(plan.args.seed)
    sample_words = 400
    n = await count_tokens(session, plan.base_url, info.model, maker.sample_text(sample_words))
    head = await count_tokens(session, plan.base_url, info.model, maker.head())
    if n and head is not None:
        tpw = min(4.0, max(0.5, n / sample_words))
        notes.append(f"prompt lengths calibrated with the server's /tokenize ({tpw:.3f} tokens a word)")
    else:
        tpw, head = 1.0, 8
        notes.append("the server has no /tokenize: synthetic prompt lengths are approximate (about 1 token a "
                     "word); the report's token counts come from the server's usage figures")
    mml = info.max_model_len
    prompt, output = plan.prompt_lengths, plan.output_lengths
    if plan.dataset_kind == "peak":
        output = output or Lengths(256, 256)
        if prompt is None:
            if not mml:
                raise UsageError("--dataset peak without --prompt-tokens needs the server's max_model_len, "
                                 "which it does not report: give --prompt-tokens (your p99 prompt length)")
            margin = 64 if plan.args.endpoint == "chat" else 16
            room = mml - output.high - margin
            if room < 1:
                raise UsageError(f"--output-tokens {output.high} leaves no room for a prompt in max_model_len {mml}")
            prompt = Lengths(room, room)
            notes.append(f"peak prompt: {room} prompt + {output.high} output tokens fill max_model_len {mml}")
    prompt = prompt or Lengths(256, 256)
    output = output or Lengths(128, 128)
    if mml and prompt.high + output.high > mml:
        notes.append(f"prompt + output up to {prompt.high + output.high} tokens is more than the server's "
                     f"max_model_len {mml}: expect HTTP 400 for those requests")
    wl = SyntheticWorkload(prompt, output, seed=plan.args.seed, name=plan.dataset_kind, tokens_per_word=tpw)
    wl.maker.head_tokens = head
    return wl


async def _main(plan: Plan) -> dict:
    from oomguard import __version__
    from oomguard.loadtest.capacity import CapacitySearch
    from oomguard.loadtest.client import OpenAIClient, discover, is_local, make_session
    from oomguard.loadtest.progress import Progress
    from oomguard.loadtest.report import stage_held
    from oomguard.loadtest.runner import Runner
    from oomguard.loadtest.sampler import MetricsSampler

    args = plan.args
    notes: list[str] = []
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    headers = {"Authorization": f"Bearer {plan.api_key}"} if plan.api_key else None
    async with make_session(headers=headers) as probe_session:
        info = await discover(probe_session, plan.base_url, args.model)
        workload = await _build_workload(plan, probe_session, info, notes)

    client = OpenAIClient(plan.base_url, model=info.model, endpoint=args.endpoint, stream=not args.no_stream,
                          api_key=plan.api_key, ignore_eos=plan.ignore_eos, request_timeout=plan.request_timeout,
                          extra_body=plan.extra_body)
    async with client:
        local = is_local(plan.base_url)
        sampler = MetricsSampler(client.session, plan.metrics_url, t0=client.t0, gpu=not args.no_gpu and local)
        gpu_note = _gpu_note(args.no_gpu, local, sampler.gpu_available)
        if gpu_note:
            notes.append(gpu_note)
        if not await sampler.probe():
            notes.append(f"server metrics not watched: {sampler.problem}")
        _note_missing_metrics(plan, sampler, notes)
        progress = Progress(plan.progress_mode)
        runner = Runner(client, workload, sampler, max_inflight=args.max_inflight, seed=args.seed,
                        on_tick=progress.tick)
        loop = asyncio.get_running_loop()
        presses = {"n": 0}

        def on_signal() -> None:
            presses["n"] += 1
            if presses["n"] == 1:
                runner.interrupt.set()
                progress.message("loadtest: stopping (Ctrl-C again to quit at once); writing a partial report")
            else:
                os._exit(130)

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal)
            except (NotImplementedError, RuntimeError):
                pass
        sampler_task = asyncio.ensure_future(sampler.run())
        capacity = None
        try:
            with progress:
                progress.message(f"loadtest: {info.model} at {plan.base_url}; {workload.describe()}; "
                                 f"engine metrics: {sampler.engine or 'none'}")
                if plan.mode == "fixed":
                    await runner.run_stage(plan.load, duration=plan.duration, max_requests=args.max_requests,
                                           conditions=plan.conditions, drain_timeout=plan.drain_timeout)
                elif plan.mode == "ramp":
                    for level in plan.ramp.levels(plan.load.integer):
                        st = await runner.run_stage(plan.load.at(level), duration=plan.duration,
                                                    max_requests=args.max_requests, conditions=plan.conditions,
                                                    drain_timeout=0.0)
                        progress.message(_stage_line(st))
                        if not stage_held(st, runner.stage_points(st)) or runner.interrupt.is_set():
                            break
                        await runner.settle()
                else:
                    search = CapacitySearch(plan.ramp.start, plan.ramp.stop, plan.ramp.step,
                                            integer=plan.load.integer)
                    stage_of: dict[float, int] = {}
                    while (level := search.next_level()) is not None:
                        st = await runner.run_stage(plan.load.at(level), duration=plan.duration,
                                                    max_requests=args.max_requests, conditions=plan.conditions,
                                                    drain_timeout=0.0)
                        progress.message(_stage_line(st))
                        if runner.interrupt.is_set():
                            break
                        stage_of[st.load.value] = st.index
                        search.record(st.load.value, stage_held(st, runner.stage_points(st)))
                        if st.ended_because == "server_down":
                            notes.append("the server stopped answering during the capacity search")
                            break
                        await runner.settle()
                    capacity = {
                        "capacity": search.capacity,
                        "unit": plan.load.unit(),
                        "kv_limit": args.kv_limit,
                        "conditions": [c.text for c in plan.conditions],
                        "capacity_stage": stage_of.get(search.capacity) if search.capacity is not None else None,
                        "broke_at": search.bad,
                        "broke_stage": stage_of.get(search.bad) if search.bad is not None else None,
                        "reached_maximum": search.reached_maximum,
                        "history": [{"level": lv, "held": ok, "stage": stage_of.get(lv)}
                                    for lv, ok in search.history],
                    }
        finally:
            sampler_task.cancel()
            await asyncio.gather(sampler_task, return_exceptions=True)
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError):
                    pass

    return _report(plan, runner, info, workload, notes, capacity, started_at, __version__)


def _gpu_note(no_gpu: bool, local: bool, available: bool) -> str | None:
    if no_gpu or available:
        return None
    if not local:
        return "GPU memory not sampled: the server is not on this machine (NVML reads local GPUs only)"
    return "GPU memory not sampled: NVML sees no GPU here (no GPU or driver, or no pynvml: pip install oomguard[nvml])"


def _note_missing_metrics(plan: Plan, sampler, notes: list[str]) -> None:
    if sampler.engine is None:
        return
    needs = {c.metric for c in plan.conditions}
    for metric, field, label in (("kv", "kv_usage", "KV-cache usage"), ("preemptions", "preemptions_total",
                                                                          "preemptions")):
        if field not in sampler.reported:
            extra = f" (so --stop-when {metric} never fires)" if metric in needs else ""
            notes.append(f"this {sampler.engine} server does not report {label}{extra}")


def _stage_line(st) -> str:
    why = st.ended_because + (": " + ", ".join(f.describe() for f in st.firings) if st.firings else "")
    return f"loadtest: stage {st.index + 1} ({st.load.label()}): {st.ok} ok, {st.errors} errors, ended by {why}"


def _report(plan: Plan, runner, info, workload, notes, capacity, started_at, version) -> dict:
    from oomguard.loadtest.report import SCHEMA_VERSION, exit_code, stage_dict, summary_of, timeseries, verdict

    args = plan.args
    report = {
        "schema": SCHEMA_VERSION,
        "oomguard_version": version,
        "url": plan.base_url,
        "metrics_url": plan.metrics_url,
        "model": info.model,
        "engine": runner.sampler.engine,
        "max_model_len": info.max_model_len,
        "started_at": started_at,
        "mode": plan.mode,
        "config": {
            "endpoint": args.endpoint, "stream": not args.no_stream, "load": plan.load.to_dict(),
            "ramp": None if plan.ramp is None else {"start": plan.ramp.start, "max": plan.ramp.stop,
                                                     "step": str(plan.ramp.step)},
            "duration_s": plan.duration, "max_requests": args.max_requests, "max_inflight": args.max_inflight,
            "drain_timeout_s": plan.drain_timeout, "stop_when": [c.text for c in plan.conditions],
            "goodput_slo_s": plan.goodput, "dataset": args.dataset, "ignore_eos": plan.ignore_eos,
            "seed": args.seed,
        },
        "workload": workload.describe(),
        "interrupted": runner.interrupt.is_set(),
        "gpu_memory_sampled": runner.sampler.gpu_available,
        "stages": [stage_dict(runner, st, plan.goodput) for st in runner.stages],
        "capacity": capacity,
        "notes": notes,
    }
    report["summary"] = summary_of(report)
    report["timeseries"] = timeseries(runner)
    report["verdict"] = verdict(report)
    report["exit_code"] = exit_code(report)
    return report


def _emit(plan: Plan, report: dict) -> int:
    from rich.console import Console

    args = plan.args
    if args.json:
        text = json.dumps(report, indent=1, allow_nan=False)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            _write(args.json, text + "\n", "--json", report)
    if args.html:
        from oomguard.loadtest.html import render_html

        _write(args.html, render_html(report), "--html", report)
    if args.json != "-":
        from oomguard.loadtest.report import render_table

        console = Console()
        if not console.is_terminal:
            console = Console(width=180)
        render_table(report, console)
    else:
        print(f"verdict: {report['verdict']}", file=sys.stderr)
    return report["exit_code"]
