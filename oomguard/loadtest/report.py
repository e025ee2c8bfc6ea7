"""The load report: one dict (the --json contract), rendered as a table, a verdict line, or HTML.

Presentation only: everything here reads the figures the runner recorded.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from oomguard.loadtest.client import RequestResult, error_group
from oomguard.loadtest.runner import LATENCY_WINDOW_S, Runner, StageState
from oomguard.loadtest.shapes import format_duration, format_rate
from oomguard.loadtest.stats import summarize

SCHEMA_VERSION = 1


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def _latency(results: list[RequestResult]) -> dict[str, dict]:
    """Percentiles of the finished requests, and of every request with the unfinished ones counted at the time they
    were cancelled (a lower bound: a queue hides in the first figures, never in the second)."""
    ok = [r for r in results if r.ok]
    unfinished = [r for r in results if r.cancelled]
    return {
        "ttft_s": _round_summary(summarize(r.ttft for r in ok if r.ttft is not None)),
        "itl_s": _round_summary(summarize(x for r in ok if r.itls for x in r.itls)),
        "tpot_s": _round_summary(summarize(t for r in ok if (t := r.tpot) is not None)),
        "e2e_s": _round_summary(summarize(r.e2e for r in ok)),
        "unfinished": len(unfinished),
        "ttft_with_unfinished_s": _round_summary(summarize(
            [r.ttft for r in ok if r.ttft is not None] + [r.ttft if r.ttft is not None else r.e2e for r in unfinished])),
        "e2e_with_unfinished_s": _round_summary(summarize([r.e2e for r in ok + unfinished])),
    }


def _round_summary(s: dict) -> dict:
    return {k: (v if k == "count" else _r(v, 5)) for k, v in s.items()}


def _errors(results: list[RequestResult]) -> list[dict]:
    groups: Counter = Counter()
    example: dict = {}
    for r in results:
        if r.failed:
            key = error_group(r.error_kind, r.status, r.error)
            groups[key] += 1
            example.setdefault(key, r)
    out = []
    for (label, _), n in groups.most_common():
        r = example[(label, _)]
        out.append({"kind": r.error_kind, "status": r.status or None, "label": label, "count": n,
                    "message": r.error})
    return out


def meets_goodput(r: RequestResult, slo: dict[str, float]) -> bool:
    if not r.ok:
        return False
    checks = {"ttft": r.ttft, "tpot": r.tpot, "e2e": r.e2e}
    for name, limit in slo.items():
        value = checks.get(name)
        if value is not None and value > limit:
            return False
    return True


def stage_dict(runner: Runner, st: StageState, slo: dict[str, float]) -> dict:
    results = st.results
    ok = [r for r in results if r.ok]
    held_s = max(1e-9, st.t_end - st.t_start)
    span = max(1e-9, st.t_drained - st.t_start)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    pts = runner.stage_points(st)
    kv = [p.kv_usage for p in pts if p.kv_usage is not None]
    run = [p.running for p in pts if p.running is not None]
    wait = [p.waiting for p in pts if p.waiting is not None]
    gpu = [p for p in pts if p.gpu_used_bytes is not None]
    preempt = None
    pre = [p.preemptions_total for p in pts if p.preemptions_total is not None]
    if pre:
        base = st.preempt_base if st.preempt_base is not None else pre[0]
        preempt = max(pre) - base
        if preempt < 0:
            preempt = max(pre)
    lags = sorted(st.lags)
    return {
        "index": st.index,
        "load": st.load.to_dict(),
        "started_s": _r(st.t_start, 3),
        "held_s": _r(held_s, 3),
        "drained_s": _r(st.t_drained - st.t_end, 3),
        "ended_because": st.ended_because,
        "held": stage_held(st, pts),
        "not_held_because": shortfalls(st, pts),
        "stopped_by": [f.to_dict() for f in st.firings],
        "server_down": st.server_down_reason,
        "requests": {
            "sent": st.sent, "ok": st.ok, "errors": st.errors, "cancelled": st.cancelled,
            "not_sent_max_inflight": st.not_sent, "peak_in_flight": st.in_flight_peak,
            "goodput": sum(1 for r in ok if meets_goodput(r, slo)),
        },
        "throughput": {
            "requests_per_s": _r(len(ok) / span, 3),
            "output_tokens_per_s": _r(out_tokens / span, 2),
            "input_tokens_per_s": _r(in_tokens / span, 2),
            "goodput_requests_per_s": _r(sum(1 for r in ok if meets_goodput(r, slo)) / span, 3),
            "offered_requests_per_s": _r(st.sent / held_s, 3),
        },
        "tokens": {"output": out_tokens, "input": in_tokens,
                   "mean_prompt": _r(in_tokens / len(ok), 1) if ok and in_tokens else None,
                   "mean_output": _r(out_tokens / len(ok), 1) if ok else None},
        "latency": _latency(results),
        "dispatch_lag_s": ({"p50": _r(_pct(lags, 50), 6), "p99": _r(_pct(lags, 99), 6), "max": _r(lags[-1], 6)}
                           if lags else None),
        "errors": _errors(results),
        "server": {
            "engine": runner.sampler.engine,
            "peak_kv_usage": _r(max(kv), 4) if kv else None,
            "mean_kv_usage": _r(sum(kv) / len(kv), 4) if kv else None,
            "max_running": max(run) if run else None,
            "max_waiting": max(wait) if wait else None,
            "preemptions": preempt,
            "peak_gpu_used_bytes": max(p.gpu_used_bytes for p in gpu) if gpu else None,
            "gpu_total_bytes": gpu[-1].gpu_total_bytes if gpu else None,
        },
    }


def _pct(sorted_values: list[float], q: float) -> float | None:
    from oomguard.loadtest.stats import percentile
    return percentile(sorted_values, q)


def stage_held(st: StageState, points: list = ()) -> bool:
    """The server held the load: the stage ran to its end with no error, no stop condition, and none of the signs of
    a server that takes the load in but does not keep up (`shortfalls`)."""
    return st.ended_because in ("duration", "max_requests") and st.errors == 0 and not st.firings and \
        not shortfalls(st, points)


def shortfalls(st: StageState, points: list = ()) -> list[str]:
    """Why a stage that ended without errors still did not hold its load, each in one phrase."""
    out = []
    if st.not_sent:
        out.append(f"{st.not_sent} arrivals were never sent (--max-inflight requests were already out)")
    if st.cancelled and st.drain_timeout > 0:
        out.append(f"{st.cancelled} of {st.sent} requests were still unfinished {st.drain_timeout:g} s after the load "
                   "stopped")
    if not st.load.closed_loop:   # open loop: arrivals do not wait for answers, so a backlog shows a shortfall
        mid, end = _in_flight_at(st, (st.t_start + st.t_end) / 2), _in_flight_at(st, st.t_end)
        if end > 1.5 * mid + 2:
            out.append(f"the requests in flight grew from {mid} to {end}: the server finishes fewer than arrive "
                       f"({st.sent / max(1e-9, st.t_end - st.t_start):.2f} req/s offered)")
    running = [p.running for p in points if getattr(p, "running", None) is not None]
    # requests too short for the samples to catch running (a millisecond each: every sample shows none running, one
    # on its way in) say nothing about a queue
    seen = bool(running) and max(running) >= 1
    if st.load.closed_loop and len(running) >= 4 and max(running) < st.load.value - 1 and seen:
        # a closed loop keeps N requests out: a server that never ran even N - 1 at once (one may be between its
        # answer and the next request) queued the rest (llama-server's slots, vLLM's max_num_seqs or KV cache),
        # however briefly each waited between two samples
        out.append(f"the server ran at most {max(running):.0f} of the {st.load.value:g} requests sent at once")
        return out
    # the gauge is sampled every 0.5 s and a request waits a step or two on its way in: only a queue seen in most
    # samples, and at the end, is one; and where the engine times its queue, only one whose requests waited a good
    # part of a request's time (behind another request, not for the next step)
    if _on_their_way_in(st, points):
        return out
    waiting = [p.waiting for p in points if getattr(p, "waiting", None) is not None]
    if len(waiting) >= 4:
        third = max(2, len(waiting) // 3)
        first, last, median = sum(waiting[:third]) / third, waiting[-third:], sorted(waiting)[len(waiting) // 2]
        if len(waiting) >= 6 and min(last) >= 1 and sum(last) / third > first + 1:
            out.append(f"the server's waiting queue grew from {first:.0f} to {sum(last) / third:.0f}")
        elif st.load.closed_loop and median >= 1 and min(last) >= 1 and (seen or not running):
            out.append(f"the server kept {median:.0f} requests waiting: it serves fewer at once than were sent")
    elif waiting and sum(waiting) / len(waiting) >= 1.5:   # a short stage: only a queue in every sample tells
        out.append(f"the server had about {sum(waiting) / len(waiting):.0f} requests waiting throughout")
    return out


def _on_their_way_in(st: StageState, points: list) -> bool:
    """The engine's own queue timer (vLLM's request_queue_time_seconds) says the stage's requests waited less than a
    quarter of a request's time on average: the waiting requests its gauge showed were between two steps, not
    behind other requests."""
    timed = [p for p in points if getattr(p, "queue_seconds_count", None) is not None
             and getattr(p, "queue_seconds_sum", None) is not None]
    if len(timed) < 2 or timed[-1].queue_seconds_count <= timed[0].queue_seconds_count:
        return False
    queued = (timed[-1].queue_seconds_sum - timed[0].queue_seconds_sum) / \
        (timed[-1].queue_seconds_count - timed[0].queue_seconds_count)
    took = sorted(r.end - r.start for r in st.results if r.ok)
    return bool(took) and queued < 0.25 * took[len(took) // 2]


def _in_flight_at(st: StageState, t: float) -> int:
    return sum(1 for r in st.results if r.start <= t < r.end)


def timeseries(runner: Runner) -> dict[str, Any]:
    """Everything over time, on the sampler's grid (0.5 s): server gauges, throughput, latency percentiles.

    Latency percentiles at time t are over the requests that finished in (t - 10 s, t]."""
    rec = runner.recorder
    bin_s = rec.bin_s
    end = max([st.t_drained for st in runner.stages] + [0.0])
    n = max(1, math.ceil(end / bin_s))
    t = [round((i + 1) * bin_s, 3) for i in range(n)]
    done = [0] * n
    errs = [0] * n
    ttft_by_bin: list[list[float]] = [[] for _ in range(n)]
    e2e_by_bin: list[list[float]] = [[] for _ in range(n)]
    for r in rec.results:
        if r.cancelled:
            continue
        i = min(n - 1, int(r.end / bin_s))
        if r.ok:
            done[i] += 1
            if r.ttft is not None:
                ttft_by_bin[i].append(r.ttft)
            e2e_by_bin[i].append(r.e2e)
        else:
            errs[i] += 1
    tokens = rec.token_bins(n)
    w = max(1, int(LATENCY_WINDOW_S / bin_s))
    series: dict[str, list] = {"t_s": t, "requests_per_s": [round(x / bin_s, 2) for x in done],
                               "errors_per_s": [round(x / bin_s, 2) for x in errs],
                               "output_tokens_per_s": [round(x / bin_s, 1) for x in tokens]}
    for name, by_bin in (("ttft", ttft_by_bin), ("e2e", e2e_by_bin)):
        p50, p90, p99 = [], [], []
        for i in range(n):
            window = sorted(x for b in by_bin[max(0, i - w + 1): i + 1] for x in b)
            from oomguard.loadtest.stats import percentile
            p50.append(_r(percentile(window, 50), 5))
            p90.append(_r(percentile(window, 90), 5))
            p99.append(_r(percentile(window, 99), 5))
        series[f"{name}_p50_s"], series[f"{name}_p90_s"], series[f"{name}_p99_s"] = p50, p90, p99
    pts = runner.sampler.points
    series["server"] = {
        "t_s": [round(p.t, 3) for p in pts],
        "kv_usage": [_r(p.kv_usage, 4) for p in pts],
        "running": [p.running for p in pts],
        "waiting": [p.waiting for p in pts],
        "waiting_capacity": [p.waiting_capacity for p in pts],
        "preemptions_total": [p.preemptions_total for p in pts],
        "gpu_used_bytes": [p.gpu_used_bytes for p in pts],
    }
    series["stages"] = [{"index": st.index, "label": st.load.label(), "start_s": _r(st.t_start, 3),
                         "end_s": _r(st.t_end, 3)} for st in runner.stages]
    return series


def verdict(report: dict) -> str:
    """One line an operator can act on: 'held 5 min at 20 req/s, peak KV 87%, 0 preemptions, 0 errors'."""
    stages = report["stages"]
    if not stages:
        return "no load was sent"
    cap = report.get("capacity")
    prefix = "interrupted: " if report.get("interrupted") else ""
    if cap is not None:
        return prefix + _capacity_verdict(report, cap)
    if len(stages) == 1:
        return prefix + _stage_verdict(stages[0], report)
    held = [s for s in stages if s["held"]]
    broke = next((s for s in stages if not s["held"]), None)
    if broke is None:
        last = stages[-1]
        return prefix + f"held every step up to {last['load']['label']} " \
                        f"({format_duration(last['held_s'])} each), " + _evidence(last)
    top = f"held up to {held[-1]['load']['label']} ({_evidence(held[-1])}); " if held else ""
    return prefix + top + f"broke at {broke['load']['label']}: {_why(broke)} ({_evidence(broke)})"


def _rate_note(stage: dict) -> str:
    if stage["load"]["kind"] == "concurrency":
        return f" ({format_rate(stage['throughput']['requests_per_s'])} req/s)"
    return ""


def _stage_verdict(s: dict, report: dict) -> str:
    where = f"at {s['load']['label']}{_rate_note(s)}"
    if s["held"]:
        return f"held {format_duration(s['held_s'])} {where}, {_evidence(s)}"
    return f"did not hold {where}: {_why(s)} after {format_duration(s['held_s'])} ({_evidence(s)})"


def _why(s: dict) -> str:
    if s["ended_because"] == "server_down":
        return f"the server stopped answering ({s['server_down']})"
    if s["stopped_by"]:
        return ", ".join(f["text"] for f in s["stopped_by"])
    if s["ended_because"] == "interrupted":
        return "interrupted"
    if s["requests"]["errors"]:
        top = s["errors"][0]
        return f"{s['requests']['errors']} errors (first: {top['label']} {top['message']})"
    if s.get("not_held_because"):
        return "; ".join(s["not_held_because"])
    return s["ended_because"]


def _evidence(s: dict) -> str:
    srv = s["server"]
    kv = f"peak KV {srv['peak_kv_usage'] * 100:.0f}%" if srv["peak_kv_usage"] is not None else \
        "peak KV not reported"
    pre = _count(srv["preemptions"], "preemption") if srv["preemptions"] is not None else \
        "preemptions not reported"
    rq, tp = s["requests"], s["throughput"]
    unfinished = rq["cancelled"] + rq["not_sent_max_inflight"]
    done = f", {format_rate(tp['requests_per_s'])} of {format_rate(tp['offered_requests_per_s'])} req/s offered done" \
        if s["load"]["kind"] != "concurrency" else ""
    return f"{kv}, {pre}, {_count(rq['errors'], 'error')}" + (f", {unfinished} unfinished" if unfinished else "") + done


def _count(n: float, noun: str) -> str:
    return f"{n:g} {noun}" + ("" if n == 1 else "s")



def _capacity_verdict(report: dict, cap: dict) -> str:
    if cap["capacity"] is None:
        first = report["stages"][0]
        return f"no capacity found: even {first['load']['label']} broke: {_why(first)} ({_evidence(first)})"
    best = next(s for s in report["stages"] if s["index"] == cap["capacity_stage"])
    text = f"capacity {best['load']['label']}{_rate_note(best)}: held {format_duration(best['held_s'])}, " \
           f"{_evidence(best)}"
    if cap.get("broke_stage") is not None:
        broke = next(s for s in report["stages"] if s["index"] == cap["broke_stage"])
        text += f"; {broke['load']['label']} broke: {_why(broke)}"
    elif cap.get("reached_maximum"):
        text += " (the search maximum: try a higher MAX)"
    return text


def exit_code(report: dict) -> int:
    """0: held (or capacity found); 1: broke; 130: interrupted."""
    if report.get("interrupted"):
        return 130
    cap = report.get("capacity")
    if cap is not None:
        return 0 if cap["capacity"] is not None else 1
    return 0 if report["stages"] and all(s["held"] for s in report["stages"][:1]) and \
        all(s["held"] for s in report["stages"]) else 1


# ---- text -------------------------------------------------------------------------------------------
def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f}" if x >= 0.01 else f"{x * 1000:.1f}"


def render_table(report: dict, console) -> None:
    from rich.table import Table

    t = Table(title=f"oomguard loadtest {report['url']} ({report['model']})", title_justify="left")
    for col in ("load", "time", "ok", "err", "unfinished", "req/s done/offered", "out tok/s", "TTFT p50/p99 ms",
                "ITL p50/p99 ms", "E2E p50/p99 ms", "peak KV", "run/wait max", "preempt", "result"):
        t.add_column(col, justify="left" if col in ("load", "result") else "right")
    for s in report["stages"]:
        lat, srv, rq = s["latency"], s["server"], s["requests"]
        # unfinished requests count at the time they were cancelled: a queue never hides in the percentiles
        ttft = lat["ttft_with_unfinished_s"] if lat["unfinished"] else lat["ttft_s"]
        result = "held" if s["held"] else (_why(s) if s["ended_because"] != "interrupted" else "interrupted")
        t.add_row(
            s["load"]["label"], format_duration(s["held_s"]), str(rq["ok"]), str(rq["errors"]),
            str(rq["cancelled"] + rq["not_sent_max_inflight"]),
            f"{format_rate(s['throughput']['requests_per_s'])}/{format_rate(s['throughput']['offered_requests_per_s'])}",
            f"{s['throughput']['output_tokens_per_s']:.0f}",
            f"{_ms(ttft['p50'])}/{_ms(ttft['p99'])}",
            f"{_ms(lat['itl_s']['p50'])}/{_ms(lat['itl_s']['p99'])}",
            f"{_ms(lat['e2e_s']['p50'])}/{_ms(lat['e2e_s']['p99'])}",
            "-" if srv["peak_kv_usage"] is None else f"{srv['peak_kv_usage'] * 100:.0f}%",
            f"{_g(srv['max_running'])}/{_g(srv['max_waiting'])}",
            _g(srv["preemptions"]),
            ("[green]" if s["held"] else "[red]") + result.replace("[", "\\["),
        )
    console.print(t)
    errors = _merge_errors(report["stages"])
    if errors:
        et = Table(title="errors", title_justify="left")
        for col in ("count", "kind", "message"):
            et.add_column(col, justify="right" if col == "count" else "left")
        for e in errors[:10]:
            et.add_row(str(e["count"]), e["label"], (e["message"] or "").replace("[", "\\["))
        console.print(et)
    for note in report.get("notes", []):
        console.print(f"note: {note}", markup=False)
    console.print(("[bold green]" if report["exit_code"] == 0 else "[bold red]") + "verdict: "
                  + report["verdict"].replace("[", "\\["))


def _g(x) -> str:
    return "-" if x is None else f"{x:g}"


def _merge_errors(stages: list[dict]) -> list[dict]:
    merged: dict = {}
    for s in stages:
        for e in s["errors"]:
            key = (e["label"], error_group(e["kind"], e["status"] or 0, e["message"])[1])
            if key in merged:
                merged[key]["count"] += e["count"]
            else:
                merged[key] = dict(e)
    return sorted(merged.values(), key=lambda e: -e["count"])


def summary_of(report: dict) -> dict:
    """Totals over all stages (the JSON's "summary")."""
    stages = report["stages"]
    return {
        "stages": len(stages),
        "requests": {k: sum(s["requests"][k] for s in stages) for k in ("sent", "ok", "errors", "cancelled")},
        "errors": _merge_errors(stages),
        "peak_kv_usage": max((s["server"]["peak_kv_usage"] for s in stages
                              if s["server"]["peak_kv_usage"] is not None), default=None),
        "preemptions": sum(s["server"]["preemptions"] for s in stages if s["server"]["preemptions"] is not None)
        if any(s["server"]["preemptions"] is not None for s in stages) else None,
    }
