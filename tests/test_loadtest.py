"""oomguard loadtest against a trivial local upstream (oomguard.loadtest.upstream, started on 127.0.0.1)."""

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
        proc = subprocess.Popen([sys.executable, "-m", "oomguard.loadtest.upstream", "--port", "0", *args],
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


@pytest.mark.parametrize("load", [["--rate", "50"], ["--rate", "50", "--poisson"], ["--burst", "10/0.5s"]])
def test_open_loop_shapes(upstream, tmp_path, load):
    url = upstream()
    rc, rep = run_json(tmp_path, url, *load, "--duration", "1s", "--no-stream", "--endpoint", "chat",
                       "--output-tokens", "4", "--no-metrics")
    s = rep["stages"][0]
    assert rc == 0 and s["requests"]["errors"] == 0
    assert 25 <= s["requests"]["ok"] <= 75


def test_stop_condition_fires(upstream, tmp_path):
    url = upstream("--itl", "0.02", "--slots", "4")
    rc, rep = run_json(tmp_path, url, "--concurrency", "8", "--duration", "10s", "--output-tokens", "50",
                       "--stop-when", "preemptions>0")
    s = rep["stages"][0]
    assert rc == 1 and s["ended_because"] == "stop_condition" and s["held_s"] < 5
    assert s["stopped_by"][0]["metric"] == "preemptions"
    assert "did not hold" in rep["verdict"] and "preemptions" in rep["verdict"]


def test_find_capacity_on_upstream(upstream, tmp_path):
    url = upstream("--itl", "0.01", "--slots", "6", "--vllm-names", "old")
    rc, rep = run_json(tmp_path, url, "--find-capacity", "--concurrency", "1:16", "--duration", "1s",
                       "--output-tokens", "30", "--kv-limit", "1.0")
    assert rc == 0
    assert rep["capacity"]["capacity"] == 6 and rep["capacity"]["broke_at"] == 7
    assert rep["verdict"].startswith("capacity 6 concurrent")


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
                             "--duration", "60s", "--json", str(out), "--progress", "off"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    rep = json.loads(out.read_text())
    assert rep["interrupted"] and rep["stages"][0]["requests"]["ok"] > 0
    assert rep["verdict"].startswith("interrupted")


def test_html_report_in_chromium(upstream, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed: apt-get install -y chromium (CI installs it)"
    url = upstream("--itl", "0.005", "--slots", "12")
    html = tmp_path / "report.html"
    rc = main(["loadtest", url, "--concurrency", "4:8", "--duration", "1s", "--output-tokens", "20",
               "--html", str(html), "--progress", "off"])
    assert rc == 0
    text = html.read_text()
    assert "src=" not in text and "href=" not in text and "<script src" not in text  # self-contained
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", """<script>
      const charts = [...document.querySelectorAll('svg.chart')];
      const drawn = charts.filter(c => [...c.querySelectorAll('.series')].some(s => s.getBBox().width > 50));
      document.body.setAttribute('data-probe', charts.length + ':' + drawn.length);
    </script></body>"""))
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(common + ["--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=60)
    assert 'data-probe="6:6"' in dom.stdout, dom.stderr[-2000:]
    png = tmp_path / "shot.png"
    subprocess.run(common + ["--window-size=1200,2600", f"--screenshot={png}", html.as_uri()],
                   capture_output=True, timeout=60)
    assert png.stat().st_size > 30_000
