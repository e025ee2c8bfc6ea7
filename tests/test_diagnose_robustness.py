"""Robustness: arbitrary bytes, binary garbage, huge lines, truncated and interleaved logs, ANSI colour, CRLF and
mutated real messages never raise and never hang; a large log streams in bounded memory with right line numbers."""

import io
import random
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomguard.diagnose import LOG_CLASSES, diagnose_sources, diagnose_text
from oomguard.diagnose.reader import MAX_LINE, iter_lines
from oomguard.engines.vllm import messages
from oomguard.units import GiB

REAL = [
    messages.kv_too_small((0, 19, 0), "v1", 131072, int(16 * GiB), int(4.51 * GiB), 36928, 0),
    messages.no_cache_memory((0, 22, 0), "v1"),
    messages.free_memory_too_low((0, 14, 0), int(7.3 * GiB), int(139.7 * GiB), 0.9, 125.7 * GiB),
    messages.tp_heads(40, 3),
    messages.bf16_unsupported("Tesla V100-SXM2-16GB", (7, 0)),
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB "
    "of which 1.24 GiB is free. Process 11 has 9.00 GiB memory in use. Including non-PyTorch memory, this process "
    "has 12.40 GiB memory in use.",
    "  File \"/x/vllm/v1/worker/gpu_model_runner.py\", line 2000, in profile_run",
    "Traceback (most recent call last):",
    "(EngineCore_DP0 pid=2) INFO 10-08 11:59:30 [kv_cache_utils.py:1087] GPU KV cache size: 8,512 tokens",
    "INFO 10-08 11:59:00 [utils.py:233] non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 32768}",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error",
    "openai.APIConnectionError: Connection error.",
]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(diagnosis):
    data = diagnosis.to_dict()
    for f in data["findings"]:
        assert f["class"] in LOG_CLASSES
        assert 0 <= f["confidence"] <= 1
        assert all(isinstance(e["line"], int) for e in f["evidence"])
    return data


@FAST
@given(st.binary(max_size=4000))
def test_arbitrary_bytes(data):
    check(diagnose_sources([("b", io.BytesIO(data))], use_planner=False))


@FAST
@given(st.text(max_size=3000))
def test_arbitrary_text(text):
    check(diagnose_text(text, use_planner=False))


@FAST
@given(st.lists(st.sampled_from(REAL), min_size=1, max_size=12), st.randoms(use_true_random=False),
       st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_interleaved_truncated_coloured_real_lines(lines, rnd, newline, colour):
    lines = list(lines)
    rnd.shuffle(lines)
    if colour:
        lines = [f"\x1b[3{rnd.randint(0, 7)}m{line}\x1b[0m" for line in lines]
    text = newline.join(lines)
    cut = rnd.randint(0, len(text))
    check(diagnose_sources([("x", io.BytesIO(text[:cut].encode("utf-8", "replace")))], use_planner=False))


@FAST
@given(st.sampled_from(REAL), st.lists(st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=3)),
                                       max_size=8))
def test_mutated_real_messages(line, edits):
    raw = bytearray(line.encode())
    for pos, junk in edits:
        pos = min(pos, len(raw))
        raw[pos:pos + len(junk)] = junk
    check(diagnose_sources([("m", io.BytesIO(bytes(raw)))], use_planner=False))


def test_crlf_and_ansi_do_not_change_the_answer():
    plain = "INFO vLLM API server version 0.11.0\nValueError: " + REAL[0] + "\n"
    messy = plain.replace("ValueError", "\x1b[1;31mValueError\x1b[0m").replace("\n", "\r\n")
    a = diagnose_sources([("a", io.BytesIO(plain.encode()))], use_planner=False).to_dict()
    b = diagnose_sources([("b", io.BytesIO(messy.encode()))], use_planner=False).to_dict()
    assert a["findings"][0]["class"] == b["findings"][0]["class"] == "kv_cache_too_small"
    assert a["findings"][0]["fixes"] == b["findings"][0]["fixes"]
    assert "\x1b" not in b["findings"][0]["evidence"][0]["text"] and "\r" not in b["findings"][0]["evidence"][0]["text"]


def test_huge_lines_are_capped_and_counted():
    data = b"x" * (5 * MAX_LINE * 4) + b"\nValueError: " + REAL[3].encode() + b"\n" + b"\xff" * 100000
    lines = list(iter_lines(io.BytesIO(data)))
    assert len(lines) == 3 and lines[1][0] == 2
    assert all(len(text) <= MAX_LINE for _, text in lines)
    d = diagnose_sources([("h", io.BytesIO(data))], use_planner=False)
    assert d.findings[0].cls == "tp_misconfig" and d.findings[0].evidence[0].line == 2


def test_a_large_log_streams_in_bounded_memory():
    rnd = random.Random(7)
    filler = [
        "INFO 10-08 12:00:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: 812.3 tokens/s, Avg generation "
        "throughput: 95.1 tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache usage: 41.2%",
        'INFO:     127.0.0.1:{p} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "(APIServer pid=1) INFO 10-08 12:00:{s:02d} [engine.py:331] Added request chatcmpl-{p}.",
    ]

    def log(n):
        head = "INFO vLLM API server version 0.11.0\nINFO:     Application startup complete.\n"
        body = "".join(rnd.choice(filler).format(s=rnd.randint(0, 59), r=rnd.randint(1, 64), p=rnd.randint(1, 9999))
                       + "\n" for _ in range(n))
        return (head + body + REAL[5] + "\n").encode()

    small, big = log(5000), log(40000)
    for data in (small, big):
        tracemalloc.start()
        d = diagnose_sources([("big", io.BytesIO(data))], use_planner=False)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert d.findings[0].cls == "gpu_memory_in_use"  # 9 GiB held by process 11
        assert d.findings[0].evidence[-1].line == data.count(b"\n")
        assert peak < 8 << 20, peak  # far below the input size: nothing grows with the log
    # time is measured in benchmarks/diagnose_speed.py (ratios in one run), not asserted here
