"""Admission control for `oomguard proxy`: a pure core (no I/O, no asyncio, an injectable clock).

The rule: stop sending new requests to an engine when its KV cache usage reaches the
high watermark (0.90) and resume only when it falls below the low watermark (0.80), and while the engine itself
has requests waiting (vLLM's waiting queue, llama-server's deferred requests: it runs no more at once). Around that:

* a bounded queue with three priority classes (FIFO within a class, strict priority between classes);
* per-upstream caps on requests in flight and, optionally, on prompt tokens in flight;
* fail closed: an upstream whose last good metrics are older than `stale_after` counts as saturated;
* routing to the dispatchable upstream with the most headroom (KV usage, then waiting, then in flight);
* Retry-After from the observed drain rate (completions per second).

The HTTP shell (`oomguard.proxy.server`) calls `submit` for each request, `observe`/`mark_down` from its
pollers, `release` when a response ends, and wakes the tickets that `submit`/`dispatch` hand back.
"""

from __future__ import annotations

import enum
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable


class Priority(enum.IntEnum):
    HIGH = 0
    NORMAL = 1
    LOW = 2

    @classmethod
    def parse(cls, value: str | None) -> "Priority":
        """The `x-priority` header: high, normal (default) or low. Raises ValueError otherwise."""
        if value is None or value.strip() == "":
            return cls.NORMAL
        try:
            return cls[value.strip().upper()]
        except KeyError:
            raise ValueError(f"x-priority must be one of high, normal, low (got {value!r})") from None


class State(str, enum.Enum):
    OPEN = "open"  # dispatchable
    PAUSED = "paused"  # KV usage above the watermark (latched), or metrics stale: fail closed
    DOWN = "down"  # unreachable, or not yet seen


@dataclass(frozen=True)
class Limits:
    """Every threshold of the admission rule. Defaults 90% / 80%: pause before the KV cache is full enough to
    preempt, resume with room for the queued requests, and the gap keeps the gate from flapping."""

    high_watermark: float = 0.90
    low_watermark: float = 0.80
    max_in_flight: int = 256  # per upstream
    max_prompt_tokens_in_flight: int | None = None  # per upstream; None = no cap
    max_queue: int = 1024  # all classes together
    queue_timeout: float = 30.0  # seconds a request may wait
    poll_interval: float = 0.5
    stale_intervals: float = 3.0  # metrics older than this many intervals count as saturated
    kv_step: float = 0.05  # KV usage is compared in steps this wide, so the tie-breakers matter
    max_retry_after: int = 60
    down_retry_after: int = 5  # Retry-After of a 503 when no upstream is up
    drain_window: float = 30.0  # seconds of completions the drain rate looks at
    queue_while_down: bool = False  # no upstream up: queue new requests (an engine restarting) instead of a 503

    def __post_init__(self) -> None:
        if not 0.0 < self.low_watermark < self.high_watermark <= 1.0:   # NaN fails here too
            raise ValueError(f"watermarks need 0 < low < high <= 1 "
                             f"(got low={self.low_watermark}, high={self.high_watermark})")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if self.max_queue < 0:
            raise ValueError("max_queue must be 0 or more")
        if not (math.isfinite(self.queue_timeout) and self.queue_timeout >= 0) or \
                not (math.isfinite(self.poll_interval) and self.poll_interval > 0):
            raise ValueError("--queue-timeout must be a number >= 0 and --poll-interval a number > 0")
        if self.max_retry_after < 1:
            raise ValueError("--max-retry-after must be at least 1 second")

    @property
    def stale_after(self) -> float:
        return self.stale_intervals * self.poll_interval


@dataclass
class Upstream:
    """What the controller knows about one upstream engine."""

    name: str
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    metrics_at: float | None = None  # clock time of the last good scrape
    paused: bool = False  # the hysteresis latch
    down: bool = True  # unreachable; every upstream starts down until its first good scrape
    down_reason: str = "not polled yet"
    in_flight: int = 0
    prompt_tokens_in_flight: int = 0
    # the engine's KV cache in tokens (vLLM's cache_config_info: (blocks - 1) x block size; block 0 is the null
    # block) and what the requests sent to it may hold at their longest: admitting no more than fits means the
    # engine never has to preempt (v1/core/sched/scheduler.py preempts only when a running request finds no block)
    kv_capacity_tokens: int | None = None
    block_size: int = 1
    kv_tokens_in_flight: int = 0
    tickets: set = field(default_factory=set)  # the requests in flight here (for the projected KV peak)
    sent_since_scrape: int = 0   # requests dispatched since the last good scrape
    in_transit: int = 0          # ... and those dispatched in the interval before it: the scrape may show them waiting
    models: frozenset[str] | None = None  # model ids from /v1/models; None = unknown
    model_name: str | None = None  # the first of them: the served model name vLLM labels its own metrics with
    max_model_len: int | None = None
    admitted_total: int = 0

    def state(self, now: float, limits: Limits) -> tuple[State, str]:
        if self.down:
            return State.DOWN, self.down_reason
        if self.metrics_at is None or now - self.metrics_at > limits.stale_after:
            return State.PAUSED, "metrics stale"
        if self.paused:
            return State.PAUSED, f"kv usage {_pct(self.kv_usage)} above the watermark"
        if self.waiting is not None and self.waiting >= 1 and self.waiting > self.in_transit:
            # the engine queues what it cannot run (vLLM's waiting, llama-server's deferred): more would only queue
            # there, out of the proxy's priorities and timeouts, and a full KV cache preempts. Requests sent just
            # before the scrape may show as waiting on their way in (a scheduler step): they are not a queue
            return State.PAUSED, f"the engine has {self.waiting:.0f} requests waiting"
        return State.OPEN, ""

    def kv_headroom_tokens(self, limits: Limits) -> int | None:
        """KV tokens the engine can still take before the high watermark pauses it: its capacity at the watermark
        less what is in use (the engine's usage, or the blocks promised to the requests in flight if more)."""
        if not self.kv_capacity_tokens:
            return None
        used = max((self.kv_usage or 0.0) * self.kv_capacity_tokens, self.kv_tokens_in_flight)
        return max(0, int(self.kv_capacity_tokens * limits.high_watermark - used))


@dataclass(eq=False)
class Ticket:
    """One request from the moment it arrives until its response ends."""

    priority: Priority = Priority.NORMAL
    prompt_tokens: int = 0
    kv_tokens: int = 0   # what the request may hold in the KV cache at its longest: prompt + max_tokens
    stream: bool = False   # its tokens are streamed, so the shell reports its progress (`progress`)
    generated: int = 0     # output tokens seen so far
    model: str | None = None
    enqueued_at: float = 0.0
    deadline: float = math.inf
    upstream: str | None = None  # set when dispatched
    waiter: Any = None  # the shell's future; the core never touches it
    seq: int = 0
    released: bool = False


@dataclass(frozen=True)
class Rejection:
    status: int  # 429 or 503
    reason: str  # queue_full, queue_timeout, evicted, no_upstream
    retry_after: int  # seconds
    message: str


@dataclass
class Decision:
    """What `submit` did. The shell must wake every ticket in `dispatched` and answer every one in `evicted`."""

    outcome: str  # "admitted", "queued" or "rejected"
    rejection: Rejection | None = None
    dispatched: list[Ticket] = field(default_factory=list)
    evicted: list[tuple[Ticket, Rejection]] = field(default_factory=list)


class AdmissionController:
    """The admission rule over a set of upstreams. Not thread-safe; one event loop drives it."""

    def __init__(self, upstreams: Iterable[str], limits: Limits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or Limits()
        self.clock = clock
        self.upstreams: dict[str, Upstream] = {name: Upstream(name) for name in upstreams}
        if not self.upstreams:
            raise ValueError("at least one upstream is needed")
        self.queues: dict[Priority, deque[Ticket]] = {p: deque() for p in Priority}
        self._seq = itertools.count()
        self._completions: deque[float] = deque(maxlen=4096)

    # ----------------------------------------------------------------- observations from the pollers
    def observe(self, name: str, kv_usage: float | None, running: float | None = None,
                waiting: float | None = None) -> list[Ticket]:
        """A good scrape of `name`'s metrics. Applies the hysteresis; returns the tickets it dispatched."""
        up = self.upstreams[name]
        up.metrics_at = self.clock()
        up.down, up.down_reason = False, ""
        up.kv_usage, up.running, up.waiting = kv_usage, running, waiting
        up.in_transit, up.sent_since_scrape = up.sent_since_scrape, 0
        if kv_usage is not None:
            if not up.paused and kv_usage >= self.limits.high_watermark:
                up.paused = True
            elif up.paused and kv_usage < self.limits.low_watermark:
                up.paused = False
        return self.dispatch()

    def mark_down(self, name: str, reason: str) -> None:
        """`name` could not be reached (scrape failed, connection refused or dropped)."""
        up = self.upstreams[name]
        up.down, up.down_reason = True, reason or "unreachable"

    def set_kv_capacity(self, name: str, tokens: int | None, block_size: int) -> None:
        """The engine's KV cache in tokens, as its metrics state it (None: not stated)."""
        up = self.upstreams[name]
        up.kv_capacity_tokens, up.block_size = tokens, max(1, block_size)

    def set_models(self, name: str, models: Iterable[str] | None, max_model_len: int | None) -> None:
        up = self.upstreams[name]
        models = list(models) if models is not None else None
        up.models = frozenset(models) if models is not None else None
        up.model_name = models[0] if models else None
        up.max_model_len = max_model_len

    # ----------------------------------------------------------------- requests
    def submit(self, ticket: Ticket) -> Decision:
        """A new request. It joins the back of its class, then whatever can be dispatched is."""
        now = self.clock()
        for up in self.upstreams.values():
            if not up.down:
                break
        else:  # all down
            if not self.limits.queue_while_down:
                return Decision("rejected", Rejection(
                    503, "no_upstream", self.limits.down_retry_after,
                    "No upstream engine is reachable right now; retry later."))
        ticket.seq = next(self._seq)
        ticket.enqueued_at = now
        ticket.deadline = now + self.limits.queue_timeout
        ticket.upstream, ticket.released = None, False
        evicted: list[tuple[Ticket, Rejection]] = []
        if self.queue_length() >= self.limits.max_queue:
            victim = self._lowest_below(ticket.priority)
            if victim is None:
                return Decision("rejected", self._rejection(429, "queue_full", self.queue_length()))
            self.queues[victim.priority].remove(victim)
            evicted.append((victim, self._rejection(429, "evicted", self.queue_length())))
        if not evicted and not any(self.queues.values()):
            # nobody waits: the ticket goes straight to an upstream that takes it (what dispatch would do)
            open_ups = [up for up in self.upstreams.values() if up.state(now, self.limits)[0] is State.OPEN]
            up = self._route(ticket, open_ups) if open_ups else None
            if up is not None:
                self._assign(ticket, up)
                return Decision("admitted")
        self.queues[ticket.priority].append(ticket)
        dispatched = self.dispatch()
        outcome = "admitted" if ticket.upstream is not None else "queued"
        return Decision(outcome, None, [t for t in dispatched if t is not ticket], evicted)

    def dispatch(self) -> list[Ticket]:
        """Move queued tickets to upstreams while any can take them: strict priority, FIFO within a class.

        Stops at the first ticket that fits nowhere (no overtaking, so a large request is not starved).
        """
        out: list[Ticket] = []
        queues = self.queues.values()  # in priority order, high first
        if not any(queues):  # the common case on release: nobody waiting
            return out
        now = self.clock()
        open_ups = [up for up in self.upstreams.values() if up.state(now, self.limits)[0] is State.OPEN]
        if not open_ups:
            return out
        for queue in queues:
            while queue:
                ticket = queue[0]
                up = self._route(ticket, open_ups)
                if up is None:
                    return out
                queue.popleft()
                self._assign(ticket, up)
                out.append(ticket)
        return out

    def requeue(self, ticket: Ticket, reason: str) -> list[Ticket]:
        """The upstream failed before answering (connection refused or dropped): mark it down and put the
        ticket back at the front of its class, keeping its deadline. Returns tickets dispatched meanwhile."""
        if ticket.upstream is not None and not ticket.released:
            self.mark_down(ticket.upstream, reason)
            self._unassign(ticket)
        ticket.upstream = None
        self.queues[ticket.priority].appendleft(ticket)
        return self.dispatch()

    def cancel(self, ticket: Ticket) -> bool:
        """The client gave up or its deadline passed. True if the ticket was still queued (and is now gone)."""
        try:
            self.queues[ticket.priority].remove(ticket)
            return True
        except ValueError:
            return False

    def expire(self) -> list[tuple[Ticket, Rejection]]:
        """Remove the queued tickets whose deadline has passed, with the 429 each gets."""
        now = self.clock()
        out = []
        for queue in self.queues.values():
            while queue and queue[0].deadline <= now:
                out.append(queue.popleft())
            # deadlines are monotone within a class except for requeued tickets; sweep the rest too
            late = [t for t in queue if t.deadline <= now]
            for t in late:
                queue.remove(t)
                out.append(t)
        return [(t, self.timeout_rejection(t)) for t in out]

    def timeout_rejection(self, ticket: Ticket) -> Rejection:
        return self._rejection(429, "queue_timeout", self.position(ticket) or self.queue_length() or 1)

    def progress(self, ticket: Ticket, generated: int) -> list[Ticket]:
        """`generated` output tokens of a streamed `ticket` have been seen: the KV peak it projects moves earlier."""
        if generated <= ticket.generated or ticket.released or ticket.upstream is None:
            return []
        ticket.generated = generated
        return self.dispatch()

    def release(self, ticket: Ticket, completed: bool = True) -> list[Ticket]:
        """The response for `ticket` ended. Frees its slot; returns the tickets dispatched into it."""
        if ticket.released or ticket.upstream is None:
            return []
        self._unassign(ticket)
        ticket.released = True
        if completed:
            self._completions.append(self.clock())
        return self.dispatch()

    # ----------------------------------------------------------------- numbers for answers and metrics
    def drain_rate(self) -> float:
        """Completions per second over the drain window (0.0 if none)."""
        now = self.clock()
        window = self.limits.drain_window
        while self._completions and now - self._completions[0] > window:
            self._completions.popleft()
        n = len(self._completions)
        if n == 0:
            return 0.0
        span = max(now - self._completions[0], 1.0)
        return n / span

    def retry_after(self, ahead: int) -> int:
        """Seconds until `ahead` requests will have drained at the observed rate, clamped to [1, max]."""
        rate = self.drain_rate()
        if rate <= 0.0:
            guess = self.limits.queue_timeout or self.limits.max_retry_after
        else:
            guess = max(ahead, 1) / rate
        return int(min(max(math.ceil(guess), 1), self.limits.max_retry_after))

    def queue_length(self, priority: Priority | None = None) -> int:
        if priority is not None:
            return len(self.queues[priority])
        return sum(map(len, self.queues.values()))

    def position(self, ticket: Ticket) -> int | None:
        """1-based place in the dispatch order, or None if not queued."""
        ahead = 0
        for priority in Priority:
            queue = self.queues[priority]
            if priority == ticket.priority:
                for i, t in enumerate(queue):
                    if t is ticket:
                        return ahead + i + 1
                return None
            ahead += len(queue)
        return None

    def max_model_len(self) -> int | None:
        """The smallest context length any upstream reported (a request may land on any of them)."""
        lens = [up.max_model_len for up in self.upstreams.values() if up.max_model_len]
        return min(lens) if lens else None

    def snapshot(self) -> dict:
        now = self.clock()
        ups = {}
        for up in self.upstreams.values():
            state, reason = up.state(now, self.limits)
            ups[up.name] = {
                "state": state.value, "reason": reason, "kv_usage": up.kv_usage, "running": up.running,
                "waiting": up.waiting, "in_flight": up.in_flight,
                "prompt_tokens_in_flight": up.prompt_tokens_in_flight,
                "kv_tokens_in_flight": up.kv_tokens_in_flight, "kv_capacity_tokens": up.kv_capacity_tokens,
                "kv_headroom_tokens": up.kv_headroom_tokens(self.limits), "model_name": up.model_name,
                "metrics_age_s": None if up.metrics_at is None else round(now - up.metrics_at, 3),
                "max_model_len": up.max_model_len, "models": sorted(up.models) if up.models else None,
                "admitted_total": up.admitted_total,
            }
        return {
            "queue": {p.name.lower(): len(q) for p, q in self.queues.items()},
            "drain_rate_per_s": round(self.drain_rate(), 3),
            "upstreams": ups,
            "limits": {
                "high_watermark": self.limits.high_watermark, "low_watermark": self.limits.low_watermark,
                "max_in_flight": self.limits.max_in_flight,
                "max_prompt_tokens_in_flight": self.limits.max_prompt_tokens_in_flight,
                "max_queue": self.limits.max_queue, "queue_timeout_s": self.limits.queue_timeout,
                "poll_interval_s": self.limits.poll_interval,
            },
        }

    # ----------------------------------------------------------------- internals
    def _route(self, ticket: Ticket, open_ups: list[Upstream]) -> Upstream | None:
        limits = self.limits
        best, best_key = None, None
        candidates = [up for up in open_ups if _serves(up, ticket.model)]
        if not candidates and ticket.model is not None:
            # no upstream lists this model: any may answer (the engine returns its own 404)
            if not any(up.models is None or ticket.model in up.models for up in self.upstreams.values()):
                candidates = open_ups
        for up in candidates:
            if up.in_flight >= limits.max_in_flight:
                continue
            cap = limits.max_prompt_tokens_in_flight
            if cap is not None and up.in_flight > 0 and up.prompt_tokens_in_flight + ticket.prompt_tokens > cap:
                continue
            if up.kv_capacity_tokens and up.in_flight > 0 and \
                    projected_peak_tokens(up.tickets, ticket, up.block_size) > up.kv_capacity_tokens:
                continue   # it could run out of blocks and preempt; the one request alone always goes
            kv = up.kv_usage or 0.0
            key = (math.floor(kv / limits.kv_step + 1e-9) if limits.kv_step > 0 else kv,
                   up.waiting or 0.0, up.in_flight)
            if best_key is None or key < best_key:
                best, best_key = up, key
        return best

    def _assign(self, ticket: Ticket, up: Upstream) -> None:
        ticket.upstream = up.name
        ticket.released = False
        up.in_flight += 1
        up.prompt_tokens_in_flight += ticket.prompt_tokens
        if ticket.kv_tokens:
            up.kv_tokens_in_flight += self._blocks(ticket, up)
        up.admitted_total += 1
        up.sent_since_scrape += 1
        up.tickets.add(ticket)

    def _unassign(self, ticket: Ticket) -> None:
        up = self.upstreams[ticket.upstream]
        up.tickets.discard(ticket)
        up.in_flight = max(0, up.in_flight - 1)
        if ticket.prompt_tokens:
            up.prompt_tokens_in_flight = max(0, up.prompt_tokens_in_flight - ticket.prompt_tokens)
        if ticket.kv_tokens:
            up.kv_tokens_in_flight = max(0, up.kv_tokens_in_flight - self._blocks(ticket, up))

    @staticmethod
    def _blocks(ticket: Ticket, up: Upstream) -> int:
        """The request's KV tokens in whole blocks, as the engine allocates them."""
        return -(-ticket.kv_tokens // up.block_size) * up.block_size

    def _lowest_below(self, priority: Priority) -> Ticket | None:
        """The newest ticket of the lowest class strictly below `priority`, to make room for a higher one."""
        for p in sorted(Priority, reverse=True):
            if p <= priority:
                return None
            if self.queues[p]:
                return self.queues[p][-1]
        return None

    def _rejection(self, status: int, reason: str, ahead: int) -> Rejection:
        retry = self.retry_after(ahead)
        why = self._why_held()
        messages = {
            "queue_full": f"The proxy's queue is full ({why}); retry later.",
            "queue_timeout": f"The request waited in the proxy's queue past its timeout ({why}); retry later.",
            "evicted": "The request was displaced from the full queue by a higher-priority one; retry later.",
        }
        return Rejection(status, reason, retry, messages.get(reason, "Retry later."))

    def _why_held(self) -> str:
        """What keeps each upstream from taking more, in the words of the rule that holds it."""
        now, parts = self.clock(), []
        for up in self.upstreams.values():
            state, reason = up.state(now, self.limits)
            if state is not State.OPEN:
                parts.append(f"{up.name}: {reason}")
            elif up.in_flight >= self.limits.max_in_flight:
                parts.append(f"{up.name}: at the proxy's in-flight cap ({self.limits.max_in_flight})")
            elif up.kv_capacity_tokens and up.in_flight:
                parts.append(f"{up.name}: its KV cache is promised to the {up.in_flight} requests in flight")
            else:
                parts.append(f"{up.name}: open")
        return "; ".join(parts)


def projected_peak_tokens(in_flight: Iterable[Ticket], new: Ticket, block_size: int = 1) -> int:
    """The most KV tokens the requests in flight and `new` will hold at once, in whole blocks per request.

    The engine decodes every running request one token a step (continuous batching) and frees a request's blocks
    when it ends, so a streamed request with h tokens held and r still to generate holds h + t + 1 tokens t steps
    from now while t < r: the sum over those still running peaks just before one of them ends. A request whose
    progress is not seen (not streamed) counts at its longest, prompt + max_tokens, throughout. Each running
    request's last block counts as full: the margin that keeps the engine from queueing requests when an estimate
    (a prompt's tokens counted from its bytes) runs short; measured in benchmarks/proxy_admission.py, summing exact
    blocks instead let the engine queue and completed 74% of direct's requests against 84%."""
    fixed, growing = 0, []
    for t in (*in_flight, new):
        if t.stream:
            held = t.prompt_tokens + t.generated
            growing.append((max(t.kv_tokens - held, 0), held))
        else:
            fixed += -(-t.kv_tokens // block_size) * block_size
    # ascending by tokens left; walking the moments just before each ends, the ones before it have freed theirs
    growing.sort()
    alive, held_alive, peak = len(growing), sum(h for _, h in growing), 0
    slack = block_size - 1   # each running request's last block may be partly empty
    for left, held in growing:
        peak = max(peak, held_alive + alive * (left + slack))
        alive -= 1
        held_alive -= held
    return fixed + peak


def _serves(up: Upstream, model: str | None) -> bool:
    return model is None or up.models is None or model in up.models


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.0%}"
