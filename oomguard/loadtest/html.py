"""A self-contained HTML report: inline CSS and inline SVG charts, no scripts, no network.

Charts over time: TTFT and end-to-end latency percentiles, KV-cache usage (and GPU memory when sampled),
running and waiting requests, preemptions, throughput (requests/s and output tokens/s); stage boundaries are marked.
"""

from __future__ import annotations

import json
import math
from html import escape
from typing import Sequence

from oomguard.loadtest.shapes import format_duration, format_rate

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
W, H = 920, 250
ML, MR, MT, MB = 64, 20, 28, 36  # margins
STAGE_LABEL_ROWS, STAGE_LABEL_CHAR_PX = 3, 5.6  # 10px labels: about 5.6 px a character


def _nice_step(span: float, target: int = 5) -> float:
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _fmt_tick(v: float, unit: str) -> str:
    if unit == "s":
        if v == 0:
            return "0"
        return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"  # 2.5 ms, 12.5 ms, 250 ms, 1.5 s
    if unit == "%":
        return f"{v:g}%"
    if abs(v) >= 10000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def line_chart(title: str, xs: Sequence[float], series: list[tuple[str, Sequence[float | None]]], *,
               unit: str = "", y_max: float | None = None, hlines: Sequence[tuple[float, str]] = (),
               stages: Sequence[dict] = (), x_max: float | None = None, chart_id: str = "") -> str:
    """One SVG line chart. Series values of None break the line."""
    values = [v for _, ys in series for v in ys if v is not None]
    has_data = bool(values)
    top = max(values + [h for h, _ in hlines] + [0.0]) if has_data else 1.0
    if y_max is not None and top <= y_max:
        top = y_max
        step = _nice_step(top)
    else:
        top = top * 1.08 if top > 0 else 1.0
        step = _nice_step(top)
        top = math.ceil(top / step) * step
    x_hi = x_max if x_max else (max(xs) if xs else 1.0)
    x_hi = max(x_hi, 1e-9)
    pw, ph = W - ML - MR, H - MT - MB

    def sx(x: float) -> float:
        return ML + pw * x / x_hi

    def sy(y: float) -> float:
        return MT + ph * (1 - y / top)

    out = [f'<svg class="chart" id="{escape(chart_id)}" xmlns="http://www.w3.org/2000/svg" width="{W}" '
           f'height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">',
           f'<text x="{ML}" y="18" class="title">{escape(title)}</text>']
    y = 0.0
    while y <= top + 1e-9:
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="grid"/>'
                   f'<text x="{ML - 6}" y="{sy(y) + 4:.1f}" class="ytick">{escape(_fmt_tick(y, unit))}</text>')
        y += step
    xstep = _nice_step(x_hi, 8)
    x = 0.0
    while x <= x_hi + 1e-9:
        out.append(f'<text x="{sx(x):.1f}" y="{H - MB + 16}" class="xtick">{escape(format_duration(x) if x else "0")}'
                   '</text>')
        x += xstep
    out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{H - MB}" y2="{H - MB}" class="axis"/>'
               f'<line x1="{ML}" x2="{ML}" y1="{MT}" y2="{H - MB}" class="axis"/>')
    row_ends = [-1e9] * STAGE_LABEL_ROWS  # labels of short stages go one row down instead of overlapping
    for st in stages:
        if st.get("start_s") is None:
            continue
        xpos = sx(st["start_s"])
        width = STAGE_LABEL_CHAR_PX * len(st["label"])
        right = xpos + 3 + width <= W - 2  # else the label goes left of its line, inside the chart
        lo = xpos + 3 if right else xpos - 3 - width
        row = next((i for i, end in enumerate(row_ends) if end < lo), None)
        if row is None:
            row = min(range(STAGE_LABEL_ROWS), key=lambda i: row_ends[i])
        row_ends[row] = lo + width + 4
        anchor = "" if right else ' text-anchor="end"'
        out.append(f'<line x1="{xpos:.1f}" x2="{xpos:.1f}" y1="{MT}" y2="{H - MB}" class="stage"/>'
                   f'<text x="{xpos + 3 if right else xpos - 3:.1f}" y="{MT + 10 + 11 * row}"{anchor} '
                   f'class="stagelabel">{escape(st["label"])}</text>')
    for value, label in hlines:
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{sy(value):.1f}" y2="{sy(value):.1f}" class="limit"/>'
                   f'<text x="{W - MR - 4}" y="{sy(value) - 4:.1f}" class="limitlabel">{escape(label)}</text>')
    for i, (name, ys) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        segments, cur = [], []
        for xv, yv in zip(xs, ys):
            if yv is None:
                if cur:
                    segments.append(cur)
                cur = []
            else:
                cur.append(f"{sx(xv):.1f},{sy(min(yv, top)):.1f}")
        if cur:
            segments.append(cur)
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}" class="series"/>')
            else:
                out.append(f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" stroke-width="1.8" '
                           'class="series"/>')
        lx = ML + 10 + i * 150
        out.append(f'<rect x="{lx}" y="{H - 12}" width="12" height="3" fill="{color}"/>'
                   f'<text x="{lx + 16}" y="{H - 8}" class="legend">{escape(name)}</text>')
    if not has_data:
        out.append(f'<text x="{ML + pw / 2}" y="{MT + ph / 2}" class="nodata">not reported</text>')
    out.append("</svg>")
    return "".join(out)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.verdict{padding:10px 14px;border-radius:6px;font-weight:600;margin:12px 0}
.ok{background:#e6f4ea;border:1px solid #34a853}.bad{background:#fce8e6;border:1px solid #d93025}
table{border-collapse:collapse;margin:6px 0;font-size:12px} td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f5f5f5} td.l,th.l{text-align:left}
.meta{color:#555} .chart{display:block;margin:8px 0;background:#fff;border:1px solid #eee}
.title{font-weight:600;font-size:13px;fill:#222} .ytick{font-size:11px;fill:#555;text-anchor:end}
.xtick{font-size:11px;fill:#555;text-anchor:middle} .grid{stroke:#eee} .axis{stroke:#999}
.stage{stroke:#bbb;stroke-dasharray:4 3} .stagelabel{font-size:10px;fill:#777}
.limit{stroke:#d93025;stroke-dasharray:6 3} .limitlabel{font-size:11px;fill:#d93025;text-anchor:end}
.legend{font-size:11px;fill:#333} .nodata{font-size:13px;fill:#999;text-anchor:middle}
"""


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x * 1000:.0f}" if x >= 0.01 else f"{x * 1000:.1f}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _stage_table(report: dict) -> str:
    head = ("load", "time", "ok", "errors", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
            "E2E p50", "E2E p99", "peak KV", "max running", "max waiting", "preemptions", "result")
    rows = ["<table><tr>" + "".join(f'<th class="{"l" if h in ("load", "result") else ""}">{h}</th>'
                                    for h in head) + "</tr>"]
    for s in report["stages"]:
        lat, srv, rq, tp = s["latency"], s["server"], s["requests"], s["throughput"]
        result = "held" if s["held"] else stage_result(s)
        cells = [s["load"]["label"], format_duration(s["held_s"]), rq["ok"], rq["errors"],
                 format_rate(tp['requests_per_s']), f"{tp['output_tokens_per_s']:.0f}",
                 _ms(lat["ttft_s"]["p50"]), _ms(lat["ttft_s"]["p99"]), _ms(lat["itl_s"]["p50"]),
                 _ms(lat["itl_s"]["p99"]), _ms(lat["e2e_s"]["p50"]), _ms(lat["e2e_s"]["p99"]),
                 _pct(srv["peak_kv_usage"]), _g(srv["max_running"]), _g(srv["max_waiting"]),
                 _g(srv["preemptions"]), result]
        rows.append("<tr>" + "".join(
            f'<td class="{"l" if i in (0, len(cells) - 1) else ""}">{escape(str(c))}</td>'
            for i, c in enumerate(cells)) + "</tr>")
    rows.append("</table><p class=\"meta\">latencies in ms; TTFT: time to first token; ITL: time between "
                "streamed tokens; E2E: whole request</p>")
    return "".join(rows)


def _g(x) -> str:
    return "-" if x is None else f"{x:g}"


def stage_result(s: dict) -> str:
    """Why a stage did not hold, in a few words."""
    if s["stopped_by"]:
        return ", ".join(f["text"] for f in s["stopped_by"])
    if s["ended_because"] == "server_down":
        return f"the server stopped answering ({s['server_down']})"
    if s["requests"]["errors"]:
        return f"{s['requests']['errors']} failed requests"
    return s["ended_because"]


def render_html(report: dict) -> str:
    ts = report["timeseries"]
    srv = ts["server"]
    stages = ts["stages"]
    x_max = max((ts["t_s"] or [1.0])[-1], (srv["t_s"] or [0.0])[-1] if srv["t_s"] else 0.0)
    kv_limits = [(c["threshold"] * 100, f"limit {c['threshold'] * 100:g}%")
                 for c in _conditions(report) if c["metric"] == "kv"]
    charts = [
        line_chart("time to first token (p50, p90, p99 over the last 10 s)", ts["t_s"],
                   [("TTFT p50", ts["ttft_p50_s"]), ("TTFT p90", ts["ttft_p90_s"]), ("TTFT p99", ts["ttft_p99_s"])],
                   unit="s", stages=stages, x_max=x_max, chart_id="chart-ttft"),
        line_chart("end-to-end latency (p50, p90, p99 over the last 10 s)", ts["t_s"],
                   [("E2E p50", ts["e2e_p50_s"]), ("E2E p90", ts["e2e_p90_s"]), ("E2E p99", ts["e2e_p99_s"])],
                   unit="s", stages=stages, x_max=x_max, chart_id="chart-e2e"),
    ]
    kv_series = [("KV cache used", [None if v is None else v * 100 for v in srv["kv_usage"]])]
    gpu_total = next((s["server"]["gpu_total_bytes"] for s in report["stages"] if s["server"]["gpu_total_bytes"]),
                     None)
    if gpu_total and any(v is not None for v in srv["gpu_used_bytes"]):
        kv_series.append(("GPU memory used", [None if v is None else 100 * v / gpu_total
                                              for v in srv["gpu_used_bytes"]]))
    charts.append(line_chart("KV-cache usage (server /metrics)" + (" and GPU memory (NVML)" if len(kv_series) > 1
                                                                    else ""),
                             srv["t_s"], kv_series, unit="%", y_max=100, hlines=kv_limits, stages=stages,
                             x_max=x_max, chart_id="chart-kv"))
    charts.append(line_chart("requests running and waiting (server /metrics)", srv["t_s"],
                             [("running", srv["running"]), ("waiting", srv["waiting"])],
                             stages=stages, x_max=x_max, chart_id="chart-queue"))
    pre = srv.get("preemptions_total") or []
    first = next((v for v in pre if v is not None), None)
    charts.append(line_chart("preemptions since the run began (server /metrics)", srv["t_s"],
                             [("preemptions", [None if v is None else max(0.0, v - first) for v in pre])],
                             stages=stages, x_max=x_max, chart_id="chart-preemptions"))
    charts.append(line_chart("throughput: finished requests per second", ts["t_s"],
                             [("requests/s", ts["requests_per_s"]), ("errors/s", ts["errors_per_s"])],
                             stages=stages, x_max=x_max, chart_id="chart-rps"))
    charts.append(line_chart("throughput: output tokens per second", ts["t_s"],
                             [("output tokens/s", ts["output_tokens_per_s"])],
                             stages=stages, x_max=x_max, chart_id="chart-tokens"))

    ok = report["exit_code"] == 0
    errors = report["summary"]["errors"]
    err_html = ""
    if errors:
        err_html = "<h2>Errors</h2><table><tr><th>count</th><th class=\"l\">kind</th><th class=\"l\">message</th></tr>" \
                   + "".join(f"<tr><td>{e['count']}</td><td class=\"l\">{escape(e['label'])}</td>"
                             f"<td class=\"l\">{escape(e['message'] or '')}</td></tr>" for e in errors[:20]) \
                   + "</table>"
    cap_html = ""
    cap = report.get("capacity")
    if cap:
        by_index = {s["index"]: s for s in report["stages"]}
        rows = []
        for h in cap["history"]:
            st = by_index.get(h.get("stage"))
            why = "" if st is None else ("held" if st["held"] else stage_result(st))
            kv = "-" if st is None else _pct(st["server"]["peak_kv_usage"])
            pre = "-" if st is None else _g(st["server"]["preemptions"])
            rows.append(f"<tr><td>{h['level']:g}</td><td class=\"l\">{'yes' if h['held'] else 'no'}</td>"
                        f"<td>{kv}</td><td>{pre}</td><td class=\"l\">{escape(why)}</td></tr>")
        best = "none found" if cap["capacity"] is None else f"{cap['capacity']:g} {cap['unit']}"
        cap_html = (f"<h2>Capacity search</h2><p>capacity: <b id=\"capacity\">{escape(best)}</b> (step up, then "
                    "bisect; a level holds when no condition fires and no request fails)</p><table><tr>"
                    "<th>level</th><th class=\"l\">held</th><th>peak KV</th><th>preemptions</th>"
                    "<th class=\"l\">result</th></tr>" + "".join(rows) + "</table>")
    cfg = report["config"]
    meta = [("server", f"{report['url']} ({report.get('engine') or 'engine metrics not read'})"),
            ("model", f"{report['model']}" + (f", max_model_len {report['max_model_len']}"
                                              if report.get("max_model_len") else "")),
            ("workload", report["workload"]),
            ("requests", f"{cfg['endpoint']}, {'streaming' if cfg['stream'] else 'not streaming'}"),
            ("stop when", ", ".join(cfg["stop_when"]) or "(none)"),
            ("started", report["started_at"])]
    notes = "".join(f"<li>{escape(n)}</li>" for n in report.get("notes", []))
    data = json.dumps({k: v for k, v in report.items()}, separators=(",", ":")).replace("</", "<\\/")
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>oomguard loadtest: {escape(report['model'])}</title><style>{_CSS}</style></head><body>"
        f"<h1>oomguard loadtest</h1><div class=\"verdict {'ok' if ok else 'bad'}\" id=\"verdict\">"
        f"{escape(report['verdict'])}</div>"
        "<table>" + "".join(f"<tr><th class=\"l\">{escape(k)}</th><td class=\"l\">{escape(str(v))}</td></tr>"
                            for k, v in meta) + "</table>"
        + (f"<ul class=\"meta\">{notes}</ul>" if notes else "")
        + "<h2>Stages</h2>" + _stage_table(report) + cap_html + err_html
        + "<h2>Over time</h2>" + "".join(charts)
        + f"<script type=\"application/json\" id=\"report-data\">{data}</script>"
        + f"<p class=\"meta\">oomguard {escape(report['oomguard_version'])}</p></body></html>"
    )


def _conditions(report: dict) -> list[dict]:
    from oomguard.loadtest.conditions import parse_conditions

    try:
        conds = parse_conditions(",".join(report["config"]["stop_when"])) if report["config"]["stop_when"] else []
    except Exception:
        return []
    return [{"metric": c.metric, "threshold": c.threshold} for c in conds]
