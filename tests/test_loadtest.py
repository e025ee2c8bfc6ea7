"""oomguard loadtest against a trivial local upstream (testsupport.upstream, started on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from oomguard.cli import main
from oomguard.errors import UsageError
from oomguard.loadtest.capacity import CapacitySearch
from oomguard.loadtest.conditions import parse_conditions
from oomguard.loadtest.shapes import Step, parse_burst, parse_duration, parse_level
from oomguard.loadtest.workload import load_jsonl, load_sharegpt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def upstream():
    procs = []

    def start(*args: str) -> str:
        proc = subprocess.Popen([sys.executable, "-m", "testsupport.upstream", "--port", "0",
                                 "--model", "tiny-upstream", *args],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT)
        procs.append(proc)
        line = proc.stdout.readline()
        assert "listening on" in line, line
        return line.split()[-1]

    yield start
    for p in procs:
        p.kill()
        p.wait(10)


def run_json(tmp_path, *argv: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    rc = main(["loadtest", *argv, "--json", str(out), "--progress", "off"])
    return rc, json.loads(out.read_text())


# ---- pure parts -----------------------------------------------------------------------------------------
def test_conditions_parse_strictly():
    conds = parse_conditions("kv>0.95,preemptions>0,errors>0,p99_ttft>2s")
    assert [(c.metric, c.op, c.threshold) for c in conds] == [
        ("kv", ">", 0.95), ("preemptions", ">", 0), ("errors", ">", 0), ("p99_ttft", ">", 2.0)]
    assert parse_conditions("kv>=95%")[0].threshold == pytest.approx(0.95)
    assert parse_conditions("p50_itl>250ms")[0].threshold == pytest.approx(0.25)
    for bad in ("kv>95", "kv>>1", "foo>1", "errors>1s", "p99_ttft>2%", "kv>0.9,", ""):
        with pytest.raises(UsageError, match="METRIC OP VALUE|fraction|count|time|empty|unknown"):
            parse_conditions(bad)


def test_levels_bursts_durations():
    assert parse_level("16", "--concurrency", True) == (16, None)
    start, ramp = parse_level("1:64", "--concurrency", True)
    assert start == 1 and ramp.levels(True) == [1, 2, 4, 8, 16, 32, 64]
    _, ramp = parse_level("2:10:+4", "--rate", False)
    assert ramp.levels(False) == [2, 6, 10]
    assert parse_burst("32/10s").every == 10 and parse_duration("5m") == 300
    for bad in ("0", "8:4", "1:8:x1", "x"):
        with pytest.raises(UsageError):
            parse_level(bad, "--concurrency", True)


@pytest.mark.parametrize("limit", [1, 3, 5, 13, 17, 63, 64])
def test_capacity_search_finds_the_limit(limit):
    search = CapacitySearch(1, 64, Step())
    while (level := search.next_level()) is not None:
        search.record(level, level <= limit)
    assert search.capacity == limit
    assert len(search.history) <= 14


def test_dataset_files(tmp_path):
    good = tmp_path / "w.jsonl"
    good.write_text('{"prompt": "hello there", "max_tokens": 8}\n\n{"messages": [{"role": "user", '
                    '"content": "hi"}], "max_tokens": 4}\n')
    wl = load_jsonl(str(good), None)
    assert [s.max_tokens for s in wl.specs] == [8, 4]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "max_tokens": 3}\nnot json\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2"):
        load_jsonl(str(bad), None)
    share = tmp_path / "sg.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "why?"},
                                                    {"from": "gpt", "value": "x" * 400}]}]))
    assert load_sharegpt(str(share), 50).specs[0].max_tokens == 50


@pytest.mark.parametrize("argv,needle", [
    (["ftp://nowhere"], "bad URL"),
    (["http://127.0.0.1:1"], "cannot reach"),
    (["http://127.0.0.1:1", "--stop-when", "kv>>2"], "METRIC OP VALUE"),
    (["http://127.0.0.1:1", "--dataset", "jsonl:/nonexistent.jsonl"], "not found"),
    (["http://127.0.0.1:1", "--dataset", "csv:x"], "--dataset must be"),
    (["http://127.0.0.1:1", "--find-capacity", "--concurrency", "8"], "needs a range"),
])
def test_bad_input_exits_2(argv, needle, capsys):
    assert main(["loadtest", *argv, "--progress", "off"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


# ---- against a local upstream ---------------------------------------------------------------------------
def test_fixed_concurrency_streams(upstream, tmp_path):
    url = upstream("--itl", "0.005")
    rc, rep = run_json(tmp_path, url, "--concurrency", "8", "--duration", "1.5s", "--output-tokens", "10",
                       "--prompt-tokens", "32")
    assert rc == 0 and rep["exit_code"] == 0
    s = rep["stages"][0]
    assert s["held"] and s["requests"]["ok"] > 20 and s["requests"]["errors"] == 0
    assert s["latency"]["ttft_s"]["p50"] is not None and s["latency"]["itl_s"]["p50"] == pytest.approx(0.005, abs=0.01)
    assert s["tokens"]["mean_output"] == 10 and s["tokens"]["mean_prompt"] == pytest.approx(32, abs=2)
    assert rep["engine"] == "vllm" and s["server"]["max_running"] >= 1 and s["server"]["preemptions"] == 0
    assert rep["verdict"].startswith("held 1.5 s at 8 concurrent")
    ts = rep["timeseries"]
    assert len(ts["t_s"]) == len(ts["requests_per_s"]) == len(ts["ttft_p99_s"]) and len(ts["server"]["kv_usage"]) > 2


@pytest.mark.parametrize("load,low,high", [
    (["--rate", "50"], 35, 50),  # arrivals at 0, 20 ms, ... 980 ms: 50 (fewer only if the machine lags badly)
    (["--rate", "50", "--poisson"], 20, 90),  # a Poisson count of mean 50
    (["--burst", "10/0.4s"], 20, 30),  # bursts at 0, 0.4 s, 0.8 s
])
def test_open_loop_shapes(upstream, tmp_path, load, low, high):
    url = upstream()
    rc, rep = run_json(tmp_path, url, *load, "--duration", "1s", "--no-stream", "--endpoint", "chat",
                       "--output-tokens", "4", "--no-metrics")
    s = rep["stages"][0]
    assert rc == 0 and s["requests"]["errors"] == 0
    assert low <= s["requests"]["sent"] <= high and s["requests"]["ok"] == s["requests"]["sent"]
    assert 0.99 <= s["held_s"] < 1.4  # the stage lasts its duration (a tick at the deadline, not 0.5 s later)


@pytest.mark.parametrize("server,condition,metric", [
    (["--itl", "0.02", "--slots", "4"], "preemptions>0", "preemptions"),  # 8 requests on 4 slots
    (["--itl", "0.02", "--slots", "6"], "kv>0.95", "kv"),
    (["--itl", "0.02", "--slots", "6"], "waiting>=1", "waiting"),
    (["--itl", "0.005", "--ttft", "0.3"], "p99_ttft>100ms", "p99_ttft"),
    (["--itl", "0.005", "--fail-every", "3"], "errors>0", "errors"),
    (["--itl", "0.02", "--slots", "4"], "p99_e2e>600s,preemptions>0", "preemptions"),  # combined: any fires
])
def test_stop_condition_fires(upstream, tmp_path, server, condition, metric):
    url = upstream(*server)
    rc, rep = run_json(tmp_path, url, "--concurrency", "8", "--duration", "30s", "--output-tokens", "50",
                       "--stop-when", condition)
    s = rep["stages"][0]
    assert rc == 1 and s["ended_because"] == "stop_condition" and s["held_s"] < 20
    assert [f["metric"] for f in s["stopped_by"]] == [metric]
    assert "did not hold" in rep["verdict"] and metric in rep["verdict"]


def test_find_capacity_on_upstream(upstream, tmp_path):
    url = upstream("--itl", "0.01", "--slots", "6", "--vllm-names", "old")
    rc, rep = run_json(tmp_path, url, "--find-capacity", "--concurrency", "1:16", "--duration", "1s",
                       "--output-tokens", "30", "--kv-limit", "1.0")
    assert rc == 0
    assert rep["capacity"]["capacity"] == 6 and rep["capacity"]["broke_at"] == 7
    assert rep["verdict"].startswith("capacity 6 concurrent")


def test_find_capacity_by_rate(upstream, tmp_path):
    # each request lasts about 0.2 s (20 tokens, 10 ms apart) and 6 fit: above about 30 req/s they queue
    url = upstream("--itl", "0.01", "--slots", "6")
    rc, rep = run_json(tmp_path, url, "--find-capacity", "--rate", "5:80", "--duration", "1.5s",
                       "--output-tokens", "20", "--kv-limit", "1.0", "--no-stream")
    cap = rep["capacity"]
    assert rc == 0 and cap["unit"] == "req/s" and not cap["reached_maximum"]
    assert 10 <= cap["capacity"] <= 40 and cap["broke_at"] - cap["capacity"] <= 0.05 * 80 + 1e-9, cap
    assert [h["held"] for h in cap["history"]][:2] == [True, True]  # 5 and 10 req/s hold (1 or 2 busy)
    assert [h["level"] for h in cap["history"]][:2] == [5, 10]


def test_server_errors_are_reported(upstream, tmp_path):
    url = upstream("--fail-every", "4")
    rc, rep = run_json(tmp_path, url, "--concurrency", "4", "--duration", "1s", "--no-stream",
                       "--output-tokens", "4")
    s = rep["stages"][0]
    assert rc == 1 and s["requests"]["errors"] > 0
    assert s["errors"][0]["label"] == "HTTP 500" and s["errors"][0]["message"] == "injected failure"


def test_server_dies_mid_run(upstream, tmp_path, capsys):
    url = upstream("--itl", "0.01", "--die-after", "30")
    rc, rep = run_json(tmp_path, url, "--concurrency", "4", "--duration", "20s", "--output-tokens", "20")
    s = rep["stages"][0]
    assert rc == 1 and s["ended_because"] == "server_down" and s["held_s"] < 10
    assert "stopped answering" in rep["verdict"]
    assert "Traceback" not in capsys.readouterr().err


def test_too_long_prompt_gets_400(upstream, tmp_path):
    url = upstream()
    rc, rep = run_json(tmp_path, url, "--concurrency", "2", "--duration", "0.5s", "--prompt-tokens", "5000",
                       "--no-stream")
    assert rc == 1 and "maximum context length" in rep["stages"][0]["errors"][0]["message"]
    assert any("max_model_len" in n for n in rep["notes"])


def test_ctrl_c_gives_a_partial_report(upstream, tmp_path):
    url = upstream("--itl", "0.01")
    out = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "oomguard", "loadtest", url, "--concurrency", "4",
                             "--duration", "60s", "--output-tokens", "10", "--json", str(out), "--progress", "lines"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()  # printed once the run (and its Ctrl-C handler) has started
    assert first.startswith("loadtest: tiny-upstream at"), first
    time.sleep(1.5)  # some requests finish (100 ms each)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    rep = json.loads(out.read_text())
    assert rep["interrupted"] and rep["stages"][0]["requests"]["ok"] > 0
    assert rep["verdict"].startswith("interrupted")


def _png_pixels(path) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Width, height and RGB pixels of an 8-bit RGB or RGBA non-interlaced PNG (what chromium writes)."""
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    pixels = []
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels.extend(tuple(line[x * bpp:x * bpp + 3]) for x in range(width))
        prev = line
    return width, height, pixels


def test_html_report_in_chromium(upstream, tmp_path):
    """The HTML report in a real headless browser: every chart draws its data, and a screenshot shows it.

    CI installs Debian's chromium (apt-get install -y chromium); without it this test FAILS, it does not skip."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed: apt-get install -y chromium (CI installs it)"
    url = upstream("--itl", "0.005", "--slots", "6")  # 8 concurrent on 6 slots: KV 100%, waiting, preemptions
    html = tmp_path / "report.html"
    rc = main(["loadtest", url, "--concurrency", "4:8", "--duration", "3s", "--output-tokens", "20",
               "--stop-when", "errors>0", "--html", str(html), "--progress", "off"])
    assert rc == 1   # 8 on 6 slots queues: not held, and the report is still written
    text = html.read_text()
    assert "src=" not in text and "href=" not in text and "<script src" not in text  # self-contained
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", """<script>
      const charts = [...document.querySelectorAll('svg.chart')];
      const drawn = charts.filter(c => [...c.querySelectorAll('polyline.series')].some(
        s => s.getBBox().width > 300 && s.points.numberOfItems > 5));
      const tall = id => Math.max(...[...document.querySelectorAll('#' + id + ' polyline.series')].map(
        s => s.getBBox().height));
      const verdict = document.getElementById('verdict').getBoundingClientRect();
      document.body.setAttribute('data-probe', [charts.length, drawn.length, tall('chart-kv') > 100,
        tall('chart-queue') > 50, tall('chart-preemptions') > 20, verdict.height > 20,
        document.documentElement.scrollWidth <= window.innerWidth].join(':'));
    </script></body>"""))
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,3000"]
    dom = subprocess.run(common + ["--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    # 7 charts, all drawn across the page; KV climbs to 100%, requests wait, preemptions count up; nothing overflows
    assert 'data-probe="7:7:true:true:true:true:true"' in dom.stdout, dom.stdout[-300:] + dom.stderr[-1500:]
    png = tmp_path / "shot.png"
    subprocess.run(common + [f"--screenshot={png}", html.as_uri()], capture_output=True, timeout=120)
    width, height, pixels = _png_pixels(png)
    assert (width, height) == (1200, 3000)
    ink = sum(1 for p in pixels if p != (255, 255, 255)) / len(pixels)
    blue = sum(1 for r, g, b in pixels if abs(r - 0x1f) < 40 and abs(g - 0x77) < 40 and abs(b - 0xb4) < 40)
    red = sum(1 for r, g, b in pixels if r > 180 and g < 90 and b < 90)
    assert ink > 0.03 and blue > 3000 and red > 300, (ink, blue, red)  # text, tables and the series lines


@pytest.mark.parametrize("flags,engine,kv,preemptions", [
    (["--vllm-names", "new"], "vllm", True, True),  # vllm:kv_cache_usage_perc (vLLM >= 0.9)
    (["--vllm-names", "old"], "vllm", True, True),  # vllm:gpu_cache_usage_perc (vLLM < 0.12)
    (["--engine", "sglang"], "sglang", True, False),  # sglang:token_usage, no preemption counter
    (["--engine", "llamacpp"], "llamacpp", False, False),  # llamacpp:requests_processing, no KV usage
])
def test_metrics_sampled_every_half_second_in_normalised_names(upstream, tmp_path, flags, engine, kv, preemptions):
    url = upstream("--itl", "0.01", "--slots", "4", *flags)
    rc, rep = run_json(tmp_path, url, "--concurrency", "2", "--duration", "2s", "--output-tokens", "10")
    s = rep["stages"][0]
    assert rc == 0 and rep["engine"] == engine
    assert s["server"]["max_running"] == 2 and s["server"]["max_waiting"] == 0
    assert (s["server"]["peak_kv_usage"] == pytest.approx(0.5)) if kv else s["server"]["peak_kv_usage"] is None
    assert (s["server"]["preemptions"] == 0) if preemptions else s["server"]["preemptions"] is None
    missing = [n for n in rep["notes"] if "does not report" in n]
    assert any("KV-cache usage" in n for n in missing) != kv
    assert any("preemptions" in n for n in missing) != preemptions
    # one sample every 0.5 s on a fixed grid (plus one baseline at the start of each stage)
    t = rep["timeseries"]["server"]["t_s"]
    gaps = sorted(b - a for a, b in zip(t, t[1:]) if b - a > 0.1)
    assert len(t) >= 4 and gaps[len(gaps) // 2] == pytest.approx(0.5, abs=0.1)
    assert rep["timeseries"]["server"]["running"][-1] is not None


def _fake_gpus(used: int, total: int):
    from oomguard.gpus.nvml import DetectedGpu

    return lambda: [DetectedGpu(index=0, name="NVIDIA H100 80GB HBM3", total_bytes=total, free_bytes=total - used,
                                used_bytes=used, spec=None)]


def test_gpu_memory_sampled_through_nvml_when_local(upstream, tmp_path, monkeypatch):
    import oomguard.gpus.nvml as nvml

    monkeypatch.setattr(nvml, "detect_gpus", _fake_gpus(70 * 2**30, 80 * 2**30))
    url = upstream("--itl", "0.01")
    html = tmp_path / "r.html"
    rc, rep = run_json(tmp_path, url, "--concurrency", "2", "--duration", "1.5s", "--output-tokens", "10",
                       "--html", str(html))
    s = rep["stages"][0]
    assert rc == 0 and rep["gpu_memory_sampled"] is True
    assert s["server"]["peak_gpu_used_bytes"] == 70 * 2**30 and s["server"]["gpu_total_bytes"] == 80 * 2**30
    assert 70 * 2**30 in rep["timeseries"]["server"]["gpu_used_bytes"]
    assert "GPU memory (NVML)" in html.read_text()
    # not for a remote server, and not with --no-gpu
    rc, rep = run_json(tmp_path, url, "--concurrency", "1", "--duration", "0.5s", "--output-tokens", "4", "--no-gpu")
    assert rep["gpu_memory_sampled"] is False and rep["stages"][0]["server"]["peak_gpu_used_bytes"] is None


def test_gpu_memory_with_the_real_nvml(upstream, tmp_path):
    from oomguard.gpus.nvml import detect_gpus

    url = upstream("--itl", "0.01")
    rc, rep = run_json(tmp_path, url, "--concurrency", "1", "--duration", "1s", "--output-tokens", "4")
    assert rc == 0
    if not detect_gpus():
        # no GPU here: the run goes on without GPU figures and says why
        assert rep["gpu_memory_sampled"] is False and rep["stages"][0]["server"]["peak_gpu_used_bytes"] is None
        assert any(n.startswith("GPU memory not sampled: NVML sees no GPU") for n in rep["notes"])
        pytest.skip("no GPU visible through NVML: only the no-GPU path was checked")
    assert rep["gpu_memory_sampled"] is True and rep["stages"][0]["server"]["peak_gpu_used_bytes"] > 0


def test_live_progress_display(upstream, tmp_path, capsys):
    url = upstream("--itl", "0.01")
    rc = main(["loadtest", url, "--concurrency", "2", "--duration", "1.5s", "--output-tokens", "10",
               "--progress", "live"])
    captured = capsys.readouterr()
    assert rc == 0 and "Traceback" not in captured.err
    assert "2 concurrent" in captured.err and "KV" in captured.err  # the live panel, on stderr
    assert "verdict: held 1.5 s at 2 concurrent" in " ".join(captured.out.split())  # the table, on stdout


def test_bad_files_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    notjson = tmp_path / "share.json"
    notjson.write_text("{broken")
    for argv, needle in (
        (["--dataset", f"jsonl:{empty}"], "has no requests"),
        (["--dataset", f"sharegpt:{notjson}"], "not a ShareGPT JSON file"),
        (["--dataset", f"jsonl:{tmp_path}"], "is a directory"),
        (["--html", str(tmp_path / "no" / "such" / "dir" / "r.html")], "does not exist"),
        (["--json", str(tmp_path)], "is a directory"),
        (["--goodput", "ttft=fast"], "--goodput ttft"),
        (["--extra-body", "[1]"], "JSON object"),
    ):
        assert main(["loadtest", "http://127.0.0.1:1", *argv, "--progress", "off"]) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_workloads_from_files_peak_and_goodput(upstream, tmp_path):
    url = upstream("--itl", "0.002")
    jsonl = tmp_path / "w.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": "word " * n, "max_tokens": m}) + "\n"
                             for n, m in ((10, 3), (20, 5), (30, 7))))
    rc, rep = run_json(tmp_path, url, "--dataset", f"jsonl:{jsonl}", "--concurrency", "1", "--max-requests", "6",
                       "--duration", "30s")
    s = rep["stages"][0]
    assert rc == 0 and s["ended_because"] == "max_requests" and s["requests"]["ok"] == 6
    assert s["tokens"]["output"] == 2 * (3 + 5 + 7)  # the file's max_tokens, in order, cycling

    share = tmp_path / "sg.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "why is the sky blue?"},
                                                    {"from": "gpt", "value": "x" * 4000}]}]))
    rc, rep = run_json(tmp_path, url, "--dataset", f"sharegpt:{share}", "--output-tokens", "40", "--endpoint",
                       "chat", "--concurrency", "2", "--max-requests", "4", "--duration", "30s")
    assert rc == 0 and rep["stages"][0]["tokens"]["mean_output"] == 40  # the reply's length, capped

    # the peak prompt: prompt + output fill max_model_len (4096) when no p99 is given
    rc, rep = run_json(tmp_path, url, "--dataset", "peak", "--output-tokens", "96", "--concurrency", "2",
                       "--max-requests", "4", "--duration", "30s", "--no-stream",
                       "--goodput", "e2e=1ms")
    s = rep["stages"][0]
    assert rc == 0 and s["requests"]["errors"] == 0
    assert 4096 - 96 - 16 - 8 <= s["tokens"]["mean_prompt"] <= 4096 - 96
    assert any("peak prompt" in n for n in rep["notes"])
    assert s["requests"]["goodput"] == 0 < s["requests"]["ok"]  # nobody finishes a request in 1 ms


def test_an_output_that_cannot_be_written_loses_no_result(upstream, capsys):
    """A path that fails only when written (here /proc, which refuses new files even to root): exit 2, one line,
    and the report saved where the line says."""
    url = upstream()
    rc = main(["loadtest", url, "--concurrency", "1", "--duration", "1s", "--output-tokens", "4",
               "--json", "/proc/oomguard-report.json", "--progress", "off"])
    err = capsys.readouterr().err
    assert rc == 2 and "the report is in" in err and "Traceback" not in err
    saved = err.split("the report is in ", 1)[1].split()[0]
    assert json.loads(open(saved).read())["stages"][0]["requests"]["ok"] >= 1


def test_a_closed_loop_queue_is_judged_only_when_samples_catch_the_server_running():
    """Millisecond requests slip between samples taken every 0.5 s: every sample shows none running and one on its
    way in. That says nothing about a queue; a server seen running 1 of 4 at most does queue the rest."""
    from oomguard.loadtest.client import RequestResult
    from oomguard.loadtest.report import shortfalls
    from oomguard.loadtest.runner import StageState
    from oomguard.loadtest.sampler import MetricPoint
    from oomguard.loadtest.shapes import Load

    st = StageState(index=0, load=Load("concurrency", 4), t_start=0.0, deadline=4.0, cap=4)
    st.results = [RequestResult(start=0.01 * i, end=0.01 * i + 0.001, ok=True) for i in range(50)]
    too_fast = [MetricPoint(t=0.5 * i, running=0.0, waiting=1.0) for i in range(8)]
    assert shortfalls(st, too_fast) == []
    queued = [MetricPoint(t=0.5 * i, running=1.0, waiting=3.0) for i in range(8)]
    assert any("ran at most 1" in why for why in shortfalls(st, queued))


def test_requests_waiting_a_step_on_their_way_in_are_no_queue_where_the_engine_times_its_queue():
    """Two requests kept out, each a few milliseconds: every sample shows one running and one waiting. vLLM's queue
    timer tells the two apart: a step's wait on the way in (a tenth of a request's time) is no queue; a request's
    whole time behind another is."""
    from oomguard.loadtest.client import RequestResult
    from oomguard.loadtest.report import shortfalls
    from oomguard.loadtest.runner import StageState
    from oomguard.loadtest.sampler import MetricPoint
    from oomguard.loadtest.shapes import Load

    st = StageState(index=0, load=Load("concurrency", 2), t_start=0.0, deadline=4.0, cap=2)
    st.results = [RequestResult(start=0.002 * i, end=0.002 * i + 0.002, ok=True) for i in range(2000)]

    def points(queue_seconds_each: float):
        return [MetricPoint(t=0.5 * i, running=1.0, waiting=1.0, queue_seconds_count=250.0 * i,
                            queue_seconds_sum=250.0 * i * queue_seconds_each) for i in range(8)]

    assert shortfalls(st, points(0.0002)) == []
    assert any("kept 1 requests waiting" in why for why in shortfalls(st, points(0.002)))
    untimed = [MetricPoint(t=0.5 * i, running=1.0, waiting=1.0) for i in range(8)]   # llama-server: no timer
    assert any("kept 1 requests waiting" in why for why in shortfalls(st, untimed))
