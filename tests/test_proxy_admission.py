"""The pure admission core: hysteresis, priorities, queue bounds, timeouts, Retry-After, routing, fail-closed."""

from __future__ import annotations

import pytest

from oomguard.proxy.admission import AdmissionController, Limits, Priority, State, Ticket


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make(names=("a",), **limits) -> tuple[AdmissionController, Clock]:
    clock = Clock()
    c = AdmissionController(names, Limits(**limits), clock=clock)
    return c, clock


def state(c: AdmissionController, name: str = "a") -> State:
    return c.upstreams[name].state(c.clock(), c.limits)[0]


def test_hysteresis_pauses_at_high_stays_paused_between_resumes_below_low() -> None:
    c, _ = make()
    c.observe("a", 0.50)
    assert state(c) is State.OPEN
    c.observe("a", 0.89)
    assert state(c) is State.OPEN
    c.observe("a", 0.90)
    assert state(c) is State.PAUSED
    c.observe("a", 0.85)
    assert state(c) is State.PAUSED  # between the watermarks: the latch holds
    c.observe("a", 0.80)
    assert state(c) is State.PAUSED  # resume only strictly below the low watermark
    c.observe("a", 0.79)
    assert state(c) is State.OPEN
    c.observe("a", 0.85)
    assert state(c) is State.OPEN  # and stays open until the high watermark again


def test_paused_upstream_queues_then_dispatches_on_resume() -> None:
    c, _ = make()
    c.observe("a", 0.95)
    t = Ticket()
    d = c.submit(t)
    assert d.outcome == "queued" and t.upstream is None
    assert c.observe("a", 0.85) == []
    woken = c.observe("a", 0.79)
    assert woken == [t] and t.upstream == "a"
    assert c.upstreams["a"].in_flight == 1


def test_priority_classes_strict_and_fifo_within_class() -> None:
    c, _ = make()
    c.observe("a", 0.95)
    order = [Priority.LOW, Priority.NORMAL, Priority.HIGH, Priority.NORMAL, Priority.HIGH, Priority.LOW]
    tickets = [Ticket(priority=p) for p in order]
    for t in tickets:
        assert c.submit(t).outcome == "queued"
    assert c.queue_length(Priority.HIGH) == 2 and c.queue_length() == 6
    woken = c.observe("a", 0.1)
    expected = [tickets[2], tickets[4], tickets[1], tickets[3], tickets[0], tickets[5]]
    assert woken == expected


def test_in_flight_cap_queues_and_release_dispatches_next() -> None:
    c, _ = make(max_in_flight=2)
    c.observe("a", 0.1)
    t1, t2, t3 = Ticket(), Ticket(), Ticket()
    assert c.submit(t1).outcome == "admitted"
    assert c.submit(t2).outcome == "admitted"
    assert c.submit(t3).outcome == "queued"
    assert c.release(t1) == [t3]
    assert c.release(t1) == []  # a second release is a no-op
    assert c.upstreams["a"].in_flight == 2


def test_prompt_token_cap_but_a_lone_large_request_still_runs() -> None:
    c, _ = make(max_prompt_tokens_in_flight=1000)
    c.observe("a", 0.1)
    big = Ticket(prompt_tokens=5000)
    assert c.submit(big).outcome == "admitted"  # alone on the upstream: allowed
    small = Ticket(prompt_tokens=10)
    assert c.submit(small).outcome == "queued"
    assert c.release(big) == [small]
    t = Ticket(prompt_tokens=900)
    assert c.submit(t).outcome == "admitted"  # 10 + 900 <= 1000
    assert c.submit(Ticket(prompt_tokens=200)).outcome == "queued"


def test_queue_full_gives_429_and_high_priority_evicts_newest_low() -> None:
    c, _ = make(max_queue=2)
    c.observe("a", 0.95)
    low1, low2 = Ticket(priority=Priority.LOW), Ticket(priority=Priority.LOW)
    c.submit(low1)
    c.submit(low2)
    d = c.submit(Ticket(priority=Priority.LOW))
    assert d.outcome == "rejected" and d.rejection.status == 429 and d.rejection.reason == "queue_full"
    assert d.rejection.retry_after >= 1
    high = Ticket(priority=Priority.HIGH)
    d = c.submit(high)
    assert d.outcome == "queued"
    assert [t for t, _ in d.evicted] == [low2]
    assert d.evicted[0][1].status == 429 and d.evicted[0][1].reason == "evicted"
    assert c.position(high) == 1 and c.position(low1) == 2 and c.position(low2) is None


def test_queue_timeout_expires_with_retry_after() -> None:
    c, clock = make(queue_timeout=10.0)
    c.observe("a", 0.95)
    t = Ticket()
    c.submit(t)
    clock.advance(5)
    assert c.expire() == []
    clock.advance(5.1)
    out = c.expire()
    assert [x for x, _ in out] == [t]
    assert out[0][1].status == 429 and out[0][1].reason == "queue_timeout"
    assert c.queue_length() == 0


def test_retry_after_follows_observed_drain_rate() -> None:
    c, clock = make(max_in_flight=100, drain_window=30.0, max_retry_after=60)
    c.observe("a", 0.1)
    tickets = [Ticket() for _ in range(10)]
    for t in tickets:
        c.submit(t)
    for t in tickets:  # 10 completions over 5 seconds: 2 per second
        clock.advance(0.5)
        c.release(t)
    c.observe("a", 0.1)
    assert c.drain_rate() == pytest.approx(10 / 4.5)
    assert c.retry_after(20) == 9  # ceil(20 / 2.22)
    assert c.retry_after(10_000) == 60  # clamped
    assert c.retry_after(0) == 1
    clock.advance(60)  # the window forgets
    assert c.drain_rate() == 0.0
    assert c.retry_after(5) == int(c.limits.queue_timeout)


def test_all_down_gives_503_immediately() -> None:
    c, _ = make(("a", "b"))
    d = c.submit(Ticket())
    assert d.outcome == "rejected" and d.rejection.status == 503 and d.rejection.reason == "no_upstream"
    assert d.rejection.retry_after == c.limits.down_retry_after
    c.observe("a", 0.1)
    assert c.submit(Ticket()).outcome == "admitted"


def test_stale_metrics_fail_closed() -> None:
    c, clock = make(poll_interval=0.5)
    c.observe("a", 0.1)
    clock.advance(1.4)
    assert state(c) is State.OPEN
    clock.advance(0.2)  # 1.6 s > 3 intervals
    assert state(c) is State.PAUSED
    assert c.upstreams["a"].state(c.clock(), c.limits)[1] == "metrics stale"
    t = Ticket()
    assert c.submit(t).outcome == "queued"
    assert c.observe("a", 0.1) == [t]


def test_routing_prefers_headroom_kv_then_in_flight_and_skips_engines_that_queue() -> None:
    c, _ = make(("a", "b", "c"), kv_step=0.05)
    c.observe("a", 0.50, waiting=0)
    c.observe("b", 0.20, waiting=5)   # the engine queues what it cannot run: nothing more goes there
    c.observe("c", 0.21, waiting=0)
    t = Ticket()
    c.submit(t)
    assert t.upstream == "c"
    assert c.upstreams["b"].state(c.clock(), c.limits) == (State.PAUSED, "the engine has 5 requests waiting")
    c.observe("b", 0.22, waiting=0)   # b's queue drained: b and c tie on kv, fewer in flight wins
    t2 = Ticket()
    c.submit(t2)
    assert t2.upstream == "b"


def test_paused_and_down_upstreams_are_skipped() -> None:
    c, _ = make(("a", "b"))
    c.observe("a", 0.95)
    c.observe("b", 0.50)
    t = Ticket()
    c.submit(t)
    assert t.upstream == "b"
    c.mark_down("b", "connection refused")
    t2 = Ticket()
    assert c.submit(t2).outcome == "queued"  # a is paused (not down): wait, no 503


def test_requeue_marks_down_and_keeps_front_place_and_deadline() -> None:
    c, clock = make(("a",), max_in_flight=1)
    c.observe("a", 0.1)
    t1 = Ticket()
    c.submit(t1)
    t2 = Ticket()
    c.submit(t2)
    deadline = t1.deadline
    assert c.requeue(t1, "connection reset") == []
    assert state(c) is State.DOWN and c.upstreams["a"].in_flight == 0
    assert c.position(t1) == 1 and c.position(t2) == 2 and t1.deadline == deadline
    clock.advance(1)
    assert c.observe("a", 0.1) == [t1]  # back up: the requeued one goes first


def test_models_route_and_context_length() -> None:
    c, _ = make(("a", "b"))
    c.set_models("a", ["m1"], 4096)
    c.set_models("b", ["m2"], 2048)
    c.observe("a", 0.5)
    c.observe("b", 0.1)
    t = Ticket(model="m1")
    c.submit(t)
    assert t.upstream == "a"
    t = Ticket(model="unknown")
    c.submit(t)
    assert t.upstream == "b"  # nobody lists it: the emptiest upstream answers (with its own 404)
    assert c.max_model_len() == 2048


def test_cancel_removes_queued_ticket_only() -> None:
    c, _ = make()
    c.observe("a", 0.95)
    t = Ticket()
    c.submit(t)
    assert c.cancel(t) is True and c.cancel(t) is False
    assert c.queue_length() == 0


@pytest.mark.parametrize("kwargs", [dict(low_watermark=0.9, high_watermark=0.8), dict(high_watermark=1.2),
                                    dict(max_in_flight=0), dict(poll_interval=0)])
def test_limits_validate(kwargs) -> None:
    with pytest.raises(ValueError):
        Limits(**kwargs)


def test_priority_parse() -> None:
    assert Priority.parse(None) is Priority.NORMAL
    assert Priority.parse(" High ") is Priority.HIGH
    assert Priority.parse("low") is Priority.LOW
    with pytest.raises(ValueError):
        Priority.parse("urgent")


def test_snapshot_shape() -> None:
    c, _ = make(("a",))
    c.observe("a", 0.42, running=3, waiting=0)
    snap = c.snapshot()
    assert snap["upstreams"]["a"]["state"] == "open" and snap["upstreams"]["a"]["kv_usage"] == 0.42
    assert snap["queue"] == {"high": 0, "normal": 0, "low": 0}
    assert snap["limits"]["high_watermark"] == 0.90 and snap["limits"]["low_watermark"] == 0.80


def test_no_more_is_admitted_than_the_engines_kv_cache_holds_at_its_longest() -> None:
    """vLLM preempts only when a running request finds no free block: requests whose prompt + max_tokens fit the
    engine's blocks together never make it preempt."""
    c, _ = make(("a",))
    c.observe("a", 0.1, running=0, waiting=0)
    c.set_kv_capacity("a", 39 * 16, 16)   # cache_config_info: 40 blocks of 16 tokens, block 0 the null block
    tickets = [Ticket(kv_tokens=200) for _ in range(4)]   # 200 tokens: 13 blocks each
    for t in tickets:
        c.submit(t)
    assert [t.upstream for t in tickets] == ["a", "a", "a", None]   # 3 x 13 = 39 blocks
    assert c.release(tickets[0]) == [tickets[3]]
    big = Ticket(kv_tokens=5000)   # alone it always goes (the engine judges it); not beside others
    c.submit(big)
    assert big.upstream is None


def test_prompt_estimate_learns_the_engines_count() -> None:
    from oomguard.proxy.tokens import PromptRatio

    ratio = PromptRatio()
    assert ratio.estimate(50) == 100   # about 4 bytes a token before any answer
    for _ in range(30):
        ratio.observe(50, 75)          # the engine reports 75 tokens for 400 bytes
    assert 74 <= ratio.estimate(50) <= 76


def test_a_rejection_names_what_holds_each_engine() -> None:
    c, _ = make(("a", "b"), max_queue=1, max_in_flight=1)
    c.observe("a", 0.95, waiting=0)            # paused: KV above the watermark
    c.observe("b", 0.10, waiting=0)
    first, second, third = Ticket(), Ticket(), Ticket()
    c.submit(first)                            # b takes it: b is now at its in-flight cap
    c.submit(second)                           # queued
    decision = c.submit(third)
    assert decision.outcome == "rejected"
    message = decision.rejection.message
    assert "a: kv usage 95% above the watermark" in message and "b: at the proxy's in-flight cap (1)" in message


def test_streamed_requests_are_admitted_by_their_projected_peak_not_their_sum() -> None:
    """Requests decode a token a step and free their blocks when they end: streamed requests that started at
    different times never hold all their longest at once, so more fit than prompt + max_tokens summed allows."""
    from oomguard.proxy.admission import projected_peak_tokens

    c, _ = make(("a",))
    c.observe("a", 0.1, running=0, waiting=0)
    c.set_kv_capacity("a", 1000, 1)
    first, second, third = (Ticket(prompt_tokens=100, kv_tokens=400, stream=True) for _ in range(3))
    for t in (first, second, third):
        c.submit(t)
    assert third.upstream is None           # none has progressed: 3 x 400 > 1000
    c.progress(first, 90)                   # 190 held, 210 to go: at its end 400 + 310 + 310 = 1,020 > 1,000
    assert third.upstream is None
    c.progress(first, 250)                  # 350 held, 50 to go
    # just before the first ends 400 + 150 + 150 = 700, then the second and third at their ends 800 <= 1000
    # (by the sum of longest: 1,200)
    assert third.upstream == "a"
    # a request whose progress is never seen counts at its longest throughout
    opaque = Ticket(prompt_tokens=100, kv_tokens=400)
    assert projected_peak_tokens([opaque], Ticket(prompt_tokens=10, kv_tokens=20, stream=True)) == 400 + 20


def test_projected_peak_is_exact_when_requests_decode_in_step() -> None:
    from oomguard.proxy.admission import projected_peak_tokens

    a = Ticket(prompt_tokens=50, kv_tokens=550, stream=True)                  # 50 held, 500 to go
    b = Ticket(prompt_tokens=300, kv_tokens=400, stream=True, generated=60)   # 360 held, 40 to go
    new = Ticket(prompt_tokens=0, kv_tokens=1, stream=True)
    # 1 step: 51 + 361 + 1 = 413; 40 steps (b ends): 90 + 400 = 490; 500 steps: a alone at 550
    assert projected_peak_tokens([a, b], new) == 550
    assert projected_peak_tokens([a, b], new) <= sum(t.kv_tokens for t in (a, b, new))


def test_requests_sent_just_before_a_scrape_are_in_transit_not_a_queue() -> None:
    """A request the proxy just sent waits a scheduler step on its way in: a scrape that shows it waiting does not
    pause the engine; a queue beyond what was just sent does."""
    c, _ = make(("a",))
    c.observe("a", 0.1, running=0, waiting=0)
    sent = Ticket()
    c.submit(sent)
    assert sent.upstream == "a"
    c.observe("a", 0.1, running=0, waiting=1)        # the one just sent, on its way in
    assert c.upstreams["a"].state(c.clock(), c.limits)[0].value == "open"
    c.observe("a", 0.1, running=1, waiting=1)        # nothing sent since: a request the engine keeps waiting
    assert c.upstreams["a"].state(c.clock(), c.limits)[0].value == "paused"


def test_new_requests_wait_for_a_restarting_engine_when_asked() -> None:
    """oomguard serve restarts the engine behind the proxy: new requests queue (within their timeout) instead of 503."""
    c, _ = make(("a",))
    assert c.submit(Ticket()).outcome == "rejected"           # every upstream down: 503 by default
    waiting, _ = make(("a",), queue_while_down=True)
    ticket = Ticket()
    assert waiting.submit(ticket).outcome == "queued"
    assert waiting.observe("a", 0.1, running=0, waiting=0) == [ticket]   # served once the engine is back
