"""The simulator's pure core: vLLM V1 scheduling rules on a paged KV cache, without HTTP or clocks."""

from __future__ import annotations

import random

import pytest

from oomguard.engines.vllm.versions import parse_version
from oomguard.simulate.openai_errors import check_context, error_body
from oomguard.simulate.scheduler import (FINISHED, KvCacheExhausted, Scheduler, SchedulerConfig, SimRequest, WAITING)
from oomguard.simulate.timing import Roofline


def sched(**kw) -> Scheduler:
    kw.setdefault("num_gpu_blocks", 101)
    kw.setdefault("block_size", 16)
    kw.setdefault("max_model_len", 1024)
    kw.setdefault("max_num_seqs", 64)
    kw.setdefault("max_num_batched_tokens", 512)
    return Scheduler(SchedulerConfig(**kw))


def run_to_completion(s: Scheduler, limit: int = 100_000) -> dict[str, int]:
    produced: dict[str, int] = {}
    for _ in range(limit):
        if not s.has_work:
            return produced
        _, events = s.step()
        s.check_invariants()
        for e in events:
            produced[e.request_id] = produced.get(e.request_id, 0) + 1
    raise AssertionError("did not finish")


def test_null_block_is_reserved_and_usage_counts_usable_blocks():
    s = sched(num_gpu_blocks=11)
    assert s.num_free_blocks == 10 and s.kv_usage == 0.0
    s.add_request(SimRequest("a", prompt_len=48, max_tokens=4))  # 48 tokens = 3 blocks
    s.step()
    assert s.num_free_blocks == 7
    assert s.kv_usage == pytest.approx(0.3)
    s.check_invariants()


def test_one_request_prefills_then_decodes_one_token_per_step():
    s = sched()
    s.add_request(SimRequest("a", prompt_len=100, max_tokens=5))
    out, events = s.step()
    assert out.prefill_tokens == 100 and out.decode_tokens == 0
    assert [e.index for e in events] == [0]  # the prefill step samples the first token
    for i in range(1, 5):
        out, events = s.step()
        assert out.decode_tokens == 1 and out.prefill_tokens == 0
        assert events[0].index == i
    assert events[0].finish_reason == "length"
    assert not s.has_work and s.num_free_blocks == 100


def test_chunked_prefill_splits_long_prompts_by_the_token_budget():
    s = sched(max_num_batched_tokens=256)
    s.add_request(SimRequest("a", prompt_len=600, max_tokens=2))
    chunks = []
    while True:
        out, events = s.step()
        chunks.append(out.num_scheduled_tokens)
        if events:
            break
    assert chunks == [256, 256, 88]


def test_without_chunked_prefill_a_prompt_waits_for_the_whole_budget():
    s = sched(max_num_batched_tokens=256, enable_chunked_prefill=False, max_model_len=1024)
    s.add_request(SimRequest("small", prompt_len=200, max_tokens=50))
    s.add_request(SimRequest("big", prompt_len=250, max_tokens=2))
    out, _ = s.step()
    assert [c.request_id for c in out.scheduled] == ["small"]  # big does not fit the 56 tokens left
    out, _ = s.step()
    assert [c.request_id for c in out.scheduled] == ["small", "big"]  # 1 decode + 250 prefill


def test_max_num_seqs_is_respected():
    s = sched(max_num_seqs=4, num_gpu_blocks=1001)
    for i in range(10):
        s.add_request(SimRequest(f"r{i}", prompt_len=20, max_tokens=30))
    peak = 0
    while s.has_work:
        s.step()
        peak = max(peak, len(s.running))
        assert len(s.running) <= 4
        s.check_invariants()
    assert peak == 4


def test_token_budget_shared_by_decodes_and_prefills():
    s = sched(max_num_batched_tokens=64, num_gpu_blocks=1001)
    for i in range(3):
        s.add_request(SimRequest(f"d{i}", prompt_len=10, max_tokens=100))
    s.step()  # 3 prompts of 10 tokens
    s.add_request(SimRequest("long", prompt_len=500, max_tokens=1))
    out, _ = s.step()
    assert out.decode_tokens == 3 and out.prefill_tokens == 61  # 64 - 3 decode tokens


def test_preemption_by_recompute_when_decode_needs_a_block():
    # 9 usable blocks; two requests of 64 prompt tokens (4 blocks each) decode until the 9th block is gone
    s = sched(num_gpu_blocks=10, max_num_batched_tokens=1024)
    s.add_request(SimRequest("old", prompt_len=64, max_tokens=40))
    s.add_request(SimRequest("new", prompt_len=64, max_tokens=40))
    out, _ = s.step()
    assert out.admitted == ["old", "new"] and s.num_free_blocks == 1
    preempted_at = None
    for step in range(40):
        out, _ = s.step()
        s.check_invariants()
        if out.preempted:
            preempted_at = step
            break
    assert out.preempted == ["new"]  # the newest running request is the victim
    assert s.requests["new"].status != "running" and s.requests["new"].num_computed_tokens == 0
    assert s.waiting[0].request_id == "new"  # back at the front of the queue
    assert s.num_preemptions_total == 1
    assert [c.request_id for c in out.scheduled] == ["old"]
    assert out.admitted == []  # nothing is admitted in a step that preempted
    assert preempted_at is not None
    run_to_completion(s)
    assert s.requests == {} and s.num_free_blocks == 9


def test_preempted_request_recomputes_its_generated_tokens():
    s = sched(num_gpu_blocks=10, max_num_batched_tokens=1024)
    s.add_request(SimRequest("old", prompt_len=64, max_tokens=60))
    new = SimRequest("new", prompt_len=64, max_tokens=60)
    s.add_request(new)
    while not s.num_preemptions_total:
        s.step()
    generated = new.num_output_tokens
    assert generated > 0
    # when re-admitted, it prefills prompt + generated tokens again before sampling the next one
    while new.status == WAITING or new.status == "preempted":
        out, _ = s.step()
    chunk = next(c for c in out.scheduled if c.request_id == "new")
    assert chunk.prefill and chunk.num_tokens == 64 + generated


def test_total_output_is_exact_despite_preemptions():
    rng = random.Random(7)
    s = sched(num_gpu_blocks=40, max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512)
    wanted = {}
    for i in range(30):
        prompt, out = rng.randint(5, 200), rng.randint(1, 150)
        wanted[f"r{i}"] = out
        s.add_request(SimRequest(f"r{i}", prompt_len=prompt, max_tokens=out))
    produced = run_to_completion(s)
    assert produced == wanted
    assert s.num_preemptions_total > 0
    assert s.num_free_blocks == 39


def test_requests_stop_at_max_model_len():
    s = sched(max_model_len=128)
    s.add_request(SimRequest("a", prompt_len=120, max_tokens=1000))
    produced = run_to_completion(s)
    assert produced["a"] == 8  # 120 + 8 = 128 tokens


def test_waiting_request_that_does_not_fit_blocks_the_queue_in_order():
    s = sched(num_gpu_blocks=11, max_num_batched_tokens=2048)  # 10 usable blocks = 160 tokens
    s.add_request(SimRequest("a", prompt_len=100, max_tokens=200))
    s.add_request(SimRequest("b", prompt_len=100, max_tokens=1))  # 7 blocks: does not fit beside a's 7
    s.add_request(SimRequest("c", prompt_len=10, max_tokens=1))   # would fit, but FCFS waits behind b
    out, _ = s.step()
    assert out.admitted == ["a"]
    assert [r.request_id for r in s.waiting] == ["b", "c"]


def test_abort_frees_blocks():
    s = sched()
    s.add_request(SimRequest("a", prompt_len=300, max_tokens=10))
    s.step()
    assert s.num_free_blocks < 100
    assert s.abort("a") and not s.abort("a")
    assert s.num_free_blocks == 100 and not s.has_work
    s.check_invariants()


def test_crash_mode_raises_instead_of_preempting():
    s = sched(num_gpu_blocks=10, max_num_batched_tokens=1024, crash_on_kv_exhaustion=True)
    s.add_request(SimRequest("old", prompt_len=64, max_tokens=40))
    s.add_request(SimRequest("new", prompt_len=64, max_tokens=40))
    with pytest.raises(KvCacheExhausted) as info:
        for _ in range(40):
            s.step()
    assert info.value.free_blocks == 0 and info.value.needed_blocks == 1


def test_add_request_validation():
    s = sched(max_model_len=100)
    with pytest.raises(ValueError):
        s.add_request(SimRequest("x", prompt_len=100, max_tokens=1))
    with pytest.raises(ValueError):
        s.add_request(SimRequest("y", prompt_len=0, max_tokens=1))
    with pytest.raises(ValueError):
        SchedulerConfig(num_gpu_blocks=1)


def test_finished_requests_are_forgotten():
    s = sched()
    r = SimRequest("a", prompt_len=5, max_tokens=2)
    s.add_request(r)
    run_to_completion(s)
    assert r.status == FINISHED and r.finish_reason == "length" and "a" not in s.requests


# ------------------------------------------------------------------ timing
def test_roofline_prefill_is_compute_bound_and_decode_bandwidth_bound():
    rf = Roofline(flops_per_token=2 * 8e9, weight_bytes=16e9, kv_bytes_per_token=131072, peak_flops=989e12,
                  bandwidth=3.35e12)
    prefill = rf.gpu_seconds(tokens=8192, kv_tokens_read=8192)
    assert prefill == pytest.approx(2 * 8e9 * 8192 / 989e12)
    decode = rf.gpu_seconds(tokens=1, kv_tokens_read=1000)
    assert decode == pytest.approx((16e9 + 131072 * 1000) / 3.35e12)
    assert Roofline(2 * 8e9, 16e9, 131072, 989e12, 3.35e12, speed=100).gpu_seconds(1, 1000) == decode
    fast = Roofline(2 * 8e9, 16e9, 131072, 989e12, 3.35e12, speed=100)
    s = sched()
    s.add_request(SimRequest("a", prompt_len=100, max_tokens=2))
    out = s.schedule()
    assert fast.step_seconds(out) == pytest.approx(rf.gpu_seconds(100, 100) / 100)
    assert rf.gpu_seconds(0, 0) == 0.0


# ------------------------------------------------------------------ vLLM's 400 texts
@pytest.mark.parametrize("version, needle", [
    ("0.8.5", "However, you requested 1100 tokens (1000 in the messages, 100 in the completion)"),
    ("0.10.1", "'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context length is "
               "1024 tokens and your request has 1000 input tokens (100 > 1024 - 1000)."),
    ("0.19.0", "However, you requested 100 output tokens and your prompt contains 1000 input tokens, for a total "
               "of 1100 tokens."),
])
def test_context_errors_per_version(version, needle):
    message, _ = check_context(parse_version(version), 1024, 1000, 100)
    assert message is not None and needle in message
    assert message.startswith("This model's maximum context length is 1024 tokens") or version == "0.10.1"


def test_newest_vllm_clamps_max_tokens_and_rejects_only_long_prompts():
    v = parse_version("0.33.0")
    assert check_context(v, 1024, 1000, 100) == (None, 24)
    message, _ = check_context(v, 1024, 2000, 10)
    assert "which exceeds this limit even without any output tokens" in message
    assert check_context(v, 1024, 10, None) == (None, 1014)


def test_error_body_shape_changed_in_0_10():
    assert error_body(parse_version("0.9.2"), "m")["object"] == "error"
    assert error_body(parse_version("0.10.0"), "m") == {
        "error": {"message": "m", "type": "BadRequestError", "param": None, "code": 400}}


# ------------------------------------------------------------------ property: any workload completes exactly
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(blocks=st.integers(20, 200), block_size=st.sampled_from([1, 4, 16]), budget=st.integers(16, 512),
       seqs=st.integers(1, 32), chunked=st.booleans(),
       reqs=st.lists(st.tuples(st.integers(1, 120), st.integers(1, 60)), min_size=1, max_size=25))
def test_any_workload_completes_with_exact_token_counts(blocks, block_size, budget, seqs, chunked, reqs):
    max_model_len = 200
    if blocks - 1 < -(-max_model_len // block_size):
        blocks = -(-max_model_len // block_size) + 1  # the simulator refuses smaller caches at startup
    s = Scheduler(SchedulerConfig(num_gpu_blocks=blocks, block_size=block_size, max_model_len=max_model_len,
                                  max_num_seqs=seqs, max_num_batched_tokens=max(budget, max_model_len if not chunked
                                                                                else budget),
                                  enable_chunked_prefill=chunked))
    wanted = {}
    for i, (prompt, out) in enumerate(reqs):
        s.add_request(SimRequest(f"r{i}", prompt_len=prompt, max_tokens=out))
        wanted[f"r{i}"] = min(out, max_model_len - prompt)
    assert run_to_completion(s) == wanted
    assert s.num_free_blocks == blocks - 1
