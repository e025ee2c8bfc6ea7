"""The reviewed message tables (oomguard/engines/*/messages.json, oomguard/diagnose/layer_messages.json).

They are written from the candidates of scripts/extract_messages.py; this test checks their shape and that their
needles are usable: allowed classes and stages, lower-case needles, compiling patterns, ids unique across tables,
and no needle so generic that it fires on ordinary prose.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oomguard.failures import KINDS, FailureClass, Signature

PACKAGE = Path(__file__).resolve().parents[1] / "oomguard"
TABLES = {
    "vllm": PACKAGE / "engines" / "vllm" / "messages.json",
    "llamacpp": PACKAGE / "engines" / "llamacpp" / "messages.json",
    "layers": PACKAGE / "diagnose" / "layer_messages.json",
}
ID_PREFIXES = {
    "vllm": ("vllm.",),
    "llamacpp": ("llamacpp.",),
    "layers": ("torch.", "nccl.", "cuda.", "ray.", "hf.", "tf.", "tok.", "openai.", "httpx.", "triton.", "anyio.", "xformers.", "os.", "deepspeed.", "trl.", "langchain.", "hccl.", "hip."),
}
CLASSES = {c.value for c in FailureClass}   # ../shared/data/README.md's classes
STAGES = {
    "config", "model_access", "weights_load", "profile", "graph_capture", "kv_alloc", "startup_other", "request",
    "runtime", "client", "shutdown",
}
REQUIRED = {"id", "needle", "class", "stage", "weight", "source", "cause"}
OPTIONAL = {"pattern", "kind", "require"}
MIN_NEEDLE = 12

# Ordinary prose, with the words log lines are made of (memory, error, connection, request, model, template ...).
PROSE = """
On Monday the team met to plan the move to the new office. Nobody could find the meeting room at first, and the
projector timed out twice, so we talked instead. Maria said the old server room had not enough space and that the
connection in the east wing was slow; the request for a new cable was still not found in the ticket system. We
agreed the budget would allocate more money to training, and that a failed attempt last year should not stop us.
Peter reminded everyone that memory of the last move was still fresh: the boxes were too large to fit in the lift,
the model of the new desk was different from the catalogue, and the template for the seating plan had an error in
it. The context of the whole discussion was simple. We want a place where people can work, where the device they
need is at hand, and where nobody has to wait for a key. It is not supported by everyone yet, and some of us are
not sure the date is right, but the plan is better than what we had. Out of respect for the people who built the old
office, we will keep the sign on the door. Later that week the cache of old files was cleaned, the blocks of desks
were numbered, and a short note said the heads of each group must be divided fairly between the two floors.
"""


def load(name: str) -> dict:
    with TABLES[name].open(encoding="utf-8") as fh:
        return json.load(fh)


def rows():
    for name in TABLES:
        for row in load(name)["messages"]:
            yield name, row


ALL = list(rows())


@pytest.mark.parametrize("name", sorted(TABLES))
def test_table_shape(name):
    table = load(name)
    assert set(table) == {"_about", "messages"}
    assert isinstance(table["_about"], str) and len(table["_about"]) > 40
    assert isinstance(table["messages"], list) and len(table["messages"]) >= 30


@pytest.mark.parametrize("name,row", ALL, ids=[r["id"] for _, r in ALL])
def test_row_schema(name, row):
    keys = set(row)
    assert REQUIRED <= keys, f"missing {REQUIRED - keys}"
    assert keys <= REQUIRED | OPTIONAL, f"unknown fields {keys - REQUIRED - OPTIONAL}"
    assert re.fullmatch(r"[a-z0-9]+(?:\.[a-z0-9_]+)+", row["id"]), row["id"]
    assert row["id"].startswith(ID_PREFIXES[name])
    assert row["class"] in CLASSES
    assert row["stage"] in STAGES
    assert isinstance(row["weight"], float) and 0.5 <= row["weight"] <= 0.97
    assert row.get("kind", "error") in KINDS
    assert isinstance(row.get("require", False), bool)
    if row.get("require"):
        assert row.get("pattern"), "a row that requires its pattern must have one"
    # source: "<file>:<function> (<versions>)", as extract_messages.py --write-sources writes it
    assert re.fullmatch(r"\S+:\S+ \([^()]+\)", row["source"]), row["source"]
    assert len(row["cause"]) > 20 and row["cause"].rstrip().endswith((".", ")"))


@pytest.mark.parametrize("name,row", ALL, ids=[r["id"] for _, r in ALL])
def test_needle(name, row):
    needle = row["needle"]
    assert needle and needle == needle.lower()
    assert needle == needle.strip() and "  " not in needle and "\n" not in needle
    if len(needle) < MIN_NEEDLE:
        assert row.get("require") and "short needle" in row["cause"].lower(), \
            f"{row['id']}: a needle under {MIN_NEEDLE} characters must say why in its cause"


@pytest.mark.parametrize("name,row", [(n, r) for n, r in ALL if r.get("pattern")],
                         ids=[r["id"] for _, r in ALL if r.get("pattern")])
def test_pattern_compiles(name, row):
    regex = re.compile(row["pattern"], re.IGNORECASE)
    assert regex.groupindex or row.get("require"), "a pattern is there for its named groups or to gate its needle"


def test_ids_unique_across_tables():
    """Across these tables and every other message table shipped in the package (other engines')."""
    seen: dict[str, str] = {}
    paths = sorted(set(PACKAGE.glob("**/messages.json")) | set(PACKAGE.glob("**/*_messages.json")) | set(TABLES.values()))
    for path in paths:
        for row in json.loads(path.read_text(encoding="utf-8"))["messages"]:
            where = str(path.relative_to(PACKAGE))
            assert row["id"] not in seen, f"{row['id']} in both {seen.get(row['id'])} and {where}"
            seen[row["id"]] = where


def test_needles_unique_within_a_table():
    for name in TABLES:
        needles = [r["needle"] for r in load(name)["messages"]]
        dupes = {n for n in needles if needles.count(n) > 1}
        assert not dupes, f"{name}: {dupes}"


def test_needles_do_not_fire_on_prose():
    prose = " ".join(PROSE.lower().split())
    fired = []
    for _, row in ALL:
        if row["needle"] in prose:
            if row.get("require") and not re.search(row["pattern"], PROSE, re.IGNORECASE | re.DOTALL):
                continue   # gated by its pattern, which prose does not satisfy
            fired.append(row["id"])
    assert not fired, f"needles found in ordinary prose: {fired}"


def test_rows_build_signatures():
    """Every row is a valid Signature, the shape the signature loader uses."""
    for _, row in ALL:
        sig = Signature(row["id"], row["class"], row["needle"], row["weight"], row["source"],
                        pattern=row.get("pattern"), kind=row.get("kind", "error"), cause=row["cause"],
                        require=row.get("require", False))
        assert sig.needle == row["needle"]


def test_classes_agree_with_hand_written_tables():
    """An id shared with the Python tables names the same message, so it carries the same class."""
    from oomguard.diagnose import common_signatures
    from oomguard.engines.llamacpp import signatures as llamacpp_signatures
    from oomguard.engines.vllm import signatures as vllm_signatures

    by_id = {s.id: s for mod in (common_signatures, llamacpp_signatures, vllm_signatures) for s in mod.SIGNATURES}
    for _, row in ALL:
        if row["id"] in by_id:
            assert by_id[row["id"]].cls == row["class"], row["id"]


def test_patterns_pull_numbers_from_real_wording():
    """A few rows against text in the engines' own wording (built from the extracted templates)."""
    examples = {
        "vllm.kv_too_small": ("To serve at least one request with the model's max seq len (32768), (4.0 GiB KV cache is "
                              "needed, which is larger than the available KV cache memory (2.5 GiB). Based on the "
                              "available memory, the estimated maximum model length is 20480.",
                              {"max_model_len": 32768, "needed_gib": 4.0, "available_gib": 2.5,
                               "estimated_max_model_len": 20480}),
        "vllm.tp_heads": ("Total number of attention heads (28) must be divisible by tensor parallel size (8).",
                          {"num_attention_heads": 28, "tensor_parallel_size": 8}),
        "llamacpp.metal_buffer_max": ("ggml_metal_add_buffer: buffer 'data' size 18300780544 is larger than "
                                      "buffer maximum of 17179869184", {"size_bytes": 18300780544}),
        "llamacpp.ctx_exceeded": ("request (5000 tokens) exceeds the available context size (4096 tokens), try "
                                  "increasing it", {"prompt_tokens": 5000, "max_model_len": 4096}),
        "deepspeed.heads_mp_size": ("AssertionError: num_heads (52) must be divisible by mp_size (8)",
                                    {"num_attention_heads": 52, "tensor_parallel_size": 8}),
        "llamacpp.python_scores_past_ctx": ("ValueError: could not broadcast input array from shape (32000,) into "
                                            "shape (0,)", {"n_vocab": 32000}),
        "nccl.watchdog": ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64214, "
                          "OpType=ALLGATHER, NumelIn=1, NumelOut=32, Timeout(ms)=600000) ran for 600081 milliseconds "
                          "before timing out.", {"op_type": "ALLGATHER", "timeout_ms": 600000, "ran_ms": 600081}),
    }
    by_id = {row["id"]: row for _, row in ALL}
    for rid, (text, expected) in examples.items():
        row = by_id[rid]
        assert row["needle"] in text.lower()
        sig = Signature(rid, row["class"], row["needle"], row["weight"], row["source"], pattern=row["pattern"])
        got = sig.numbers(text)
        for key, value in expected.items():
            assert got.get(key) == value, (rid, key, got)
