"""Robustness: arbitrary bytes, binary garbage, huge lines, truncated and interleaved logs, ANSI colour, CRLF and
mutated real messages never raise and never hang; a large log streams in bounded memory with right line numbers."""

import contextlib
import io
import random
import signal
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
    """8x the lines, the same peak memory: nothing the scanner keeps grows with the input. (Linear time is measured
    by benchmarks/diagnose_speed.py as ratios over logs of growing size, not timed here.)"""
    rnd = random.Random(7)
    filler = [
        "INFO 10-08 12:00:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: 812.3 tokens/s, Avg generation "
        "throughput: 95.1 tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache usage: 41.2%",
        'INFO:     127.0.0.1:{p} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "(APIServer pid=1) INFO 10-08 12:00:{s:02d} [engine.py:331] Added request chatcmpl-{p}.",
        # lines that feed the bounded state: error lines, traceback frames per process, signature hits, facts
        "(APIServer pid=1) ERROR 10-08 12:00:{s:02d} [serving_chat.py:236] Error in preprocessing prompt inputs",
        '(EngineCore_DP0 pid={p})   File "/x/vllm/v1/worker/gpu_model_runner.py", line {r}, in execute_model',
        "openai.APIConnectionError: Connection error. httpx.ConnectError: [Errno 111] Connection refused {p}",
        "(EngineCore_DP0 pid=2) INFO [kv_cache_utils.py:1087] GPU KV cache size: {p},512 tokens",
    ]

    def log(n):
        head = "INFO vLLM API server version 0.11.0\nINFO:     Application startup complete.\n"
        body = "".join(rnd.choice(filler).format(s=rnd.randint(0, 59), r=rnd.randint(1, 64), p=rnd.randint(1, 9999))
                       + "\n" for _ in range(n))
        return (head + REAL[5] + "\n" + body).encode()

    peaks = []
    for n in (5000, 40000):
        data = log(n)
        tracemalloc.start()
        d = diagnose_sources([("big", io.BytesIO(data))], use_planner=False)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert d.findings[0].cls == "gpu_memory_in_use"  # the first OOM (9 GiB held by process 11) is the root
        assert d.facts["lines_read"] == data.count(b"\n")
        assert max(e.line for f in d.findings for e in f.evidence) > n  # evidence reaches the end of the log
    assert peaks[1] <= peaks[0] * 1.2 + (64 << 10), peaks  # 8x the input, no more memory
    assert peaks[1] < 4 << 20, peaks                       # and far below the 4 MB input


@contextlib.contextmanager
def hang_guard(seconds):
    """Fail instead of hanging the suite when a block runs far past what it needs: a guard, not a timing."""
    def expired(*_):
        raise AssertionError(f"still running after {seconds} s: a super-linear regex or loop")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


JUNK = ["1", "a", " ", "1.", "x=1, ", "'", "1 ", "1.00 GiB ", "1,", "{'a': ", "(", "a_", "\\", "-", "1.0 MiB; "]


def all_regexes():
    from oomguard.diagnose import facts, oom, reader, scan
    from oomguard.engines.llamacpp import signatures as llamacpp
    from oomguard.engines.vllm import startup_log
    out = [(s.id, s.regex) for s in scan.ALL_SIGNATURES if s.regex is not None]
    out += [(name, rx) for name, _, rx in startup_log.FACTS + llamacpp.FACTS]
    out += list(oom._PATTERNS.items()) + [("oom.gpu", oom._GPU), ("oom.other", oom._OTHER)]
    out += [("prefix", scan._PREFIX), ("frame", scan._FRAME), ("kv_pair", facts._KV_PAIR),
            ("dict_pair", facts._DICT_PAIR), ("ansi", reader._ANSI)]
    return out


def test_no_pattern_backtracks_on_long_runs():
    """Every regex on 40,000 characters of one repeated unit (about what a window of capped lines holds). A
    quadratic pattern (a number or word class that may start mid-run) takes about a minute per pattern here; the
    linear ones all finish in about a second together."""
    regexes = all_regexes()
    assert len(regexes) > 80
    with hang_guard(60):
        for name, rx in regexes:
            for unit in JUNK:
                text = (unit * (40000 // len(unit) + 1))[:40000]
                rx.search(text)
                rx.findall(text)


def test_every_needle_followed_or_preceded_by_junk_never_hangs():
    """Each needle the scanner looks for, at the start and at the end of a full-length line of digits, words,
    sizes...: the scan reads the numbers of every hit and still finishes."""
    from oomguard.diagnose.scan import Scanner
    lines = []
    for i, needle in enumerate(Scanner()._handlers):
        unit = JUNK[i % len(JUNK)]
        lines.append(needle + (unit * (MAX_LINE // len(unit)))[:MAX_LINE])
        lines.append((unit * MAX_LINE)[:MAX_LINE - len(needle)] + needle)
    with hang_guard(45):
        check(diagnose_sources([("junk", io.BytesIO("\n".join(lines).encode()))], use_planner=False))


DATA = __import__("pathlib").Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _real_logs():
    import json
    texts = []
    for name, key in (("vllm_failures.jsonl", "error_text"), ("vllm_startup_logs.jsonl", "raw_excerpt")):
        path = DATA / name
        if path.is_file():
            texts += [json.loads(line).get(key) or "" for line in path.read_text().splitlines() if line.strip()]
    return [t for t in texts if t]


REAL_LOGS = _real_logs()


@__import__("pytest").mark.skipif(not REAL_LOGS, reason="shared data not present")
@FAST
@given(st.sampled_from(REAL_LOGS or ["x"]), st.sampled_from(REAL_LOGS or ["x"]), st.randoms(use_true_random=False),
       st.lists(st.tuples(st.integers(0, 5000), st.binary(min_size=1, max_size=6)), max_size=10),
       st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_mutated_and_interleaved_real_logs(a, b, rnd, edits, newline, colour):
    """Two real logs (failures and startups of ../shared/data) interleaved line by line, bytes overwritten,
    coloured, CRLF, cut at a random point."""
    lines_a, lines_b = a.split("\n"), b.split("\n")
    mixed = []
    while lines_a or lines_b:
        source = lines_a if (rnd.random() < 0.5 and lines_a) or not lines_b else lines_b
        line = source.pop(0)
        mixed.append(f"\x1b[3{rnd.randint(0, 7)}m{line}\x1b[0m" if colour else line)
    raw = bytearray(newline.join(mixed).encode())
    for pos, junk in edits:
        pos = min(pos, len(raw))
        raw[pos:pos + len(junk)] = junk
    cut = rnd.randint(0, len(raw))
    check(diagnose_sources([("real", io.BytesIO(bytes(raw[:cut])))], use_planner=False))
    check(diagnose_text(bytes(raw).decode("utf-8", "replace"), use_planner=True))


def test_a_garbled_serve_line_in_a_log_is_not_read_as_a_command():
    # a mangled paste ("--t" abbreviates two vLLM flags) is prose to diagnose, not an error
    from oomguard.diagnose.facts import parse_serve_command
    assert parse_serve_command("vllm serve org/model --t 2", need_path=True) is None


def test_random_bytes_never_make_an_out_of_memory_finding():
    """Binary noise holds "oom" by chance every few hundred kilobytes; it is not a message."""
    rnd = random.Random(11)
    for _ in range(3):
        data = bytes(rnd.getrandbits(8) for _ in range(2_000_000))
        d = diagnose_sources([("noise", io.BytesIO(data))], use_planner=False)
        assert not [f for f in d.findings if f.cls.startswith("oom_")], [f.cls for f in d.findings]


def test_random_letters_name_no_library():
    """Random words hold "nccl" or "oom" among their letters by chance; a library is named by its name."""
    import string
    rnd = random.Random(5)
    text = "".join(rnd.choice(string.ascii_letters + " \n") for _ in range(1_500_000))
    d = diagnose_sources([("letters", io.BytesIO(text.encode()))], use_planner=False)
    assert not [f for f in d.findings if f.cls in ("nccl",) or f.cls.startswith("oom_")], [f.cls for f in d.findings]
