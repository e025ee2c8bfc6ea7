"""vLLM V1's scheduler as a pure core: paged KV blocks, continuous batching, chunked prefill, preemption.

No I/O and no clock: `schedule()` decides what one engine step computes, `update(output)` applies the step's
result (tokens computed, one token sampled per request that caught up, finished requests freed). The HTTP
shell sleeps for the step's roofline time between the two.

Mirrors vllm/v1/core/sched/scheduler.py (FCFS policy, no speculative decoding, no prefix caching):
- The block pool holds `num_gpu_blocks` blocks; block 0 is the null block and is never handed out, so
  `num_gpu_blocks - 1` are usable and KV usage is `1 - free / (num_gpu_blocks - 1)`.
- A request holds `cdiv(num_computed_tokens + num_new_tokens, block_size)` blocks
  (KVCacheManager.allocate_slots); allocation fails when the pool has fewer free blocks than it needs.
- Step: token budget = max_num_batched_tokens. RUNNING requests first, in order; each gets
  `min(num_tokens - num_computed_tokens, budget, max_model_len - 1 - num_computed_tokens)` tokens (a decode gets
  1, a long prompt a chunk). When its blocks cannot be allocated the newest RUNNING request is preempted
  (`running.pop()`: blocks freed, num_computed_tokens = 0, put at the front of WAITING), repeatedly, until the
  allocation succeeds or the request itself was preempted.
- Only when nothing was preempted in this step, WAITING requests are admitted in order while
  `len(running) < max_num_seqs` and budget remains; a prompt longer than the budget is chunked (chunked
  prefill on) or stops admission until a step has enough budget (off); admission also stops at the first
  request whose blocks cannot be allocated (no preemption for waiting requests).
- After the step, a request whose computed tokens caught up with its tokens samples one token; it finishes
  at max_tokens (finish_reason "length") or when it reaches max_model_len.
- A preempted request is recomputed: when re-admitted its prompt and the tokens it had generated are
  prefilled again (chunked like any prompt).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from oomguard.units import cdiv

WAITING, RUNNING, PREEMPTED, FINISHED, ABORTED = "waiting", "running", "preempted", "finished", "aborted"


class KvCacheExhausted(RuntimeError):
    """Raised instead of preempting when the scheduler runs with crash_on_kv_exhaustion (simulated OOM)."""

    def __init__(self, request_id: str, needed_blocks: int, free_blocks: int):
        super().__init__(f"request {request_id} needs {needed_blocks} more KV blocks; {free_blocks} free")
        self.request_id, self.needed_blocks, self.free_blocks = request_id, needed_blocks, free_blocks


@dataclass(frozen=True)
class SchedulerConfig:
    num_gpu_blocks: int
    block_size: int = 16
    max_model_len: int = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    crash_on_kv_exhaustion: bool = False

    def __post_init__(self):
        if self.num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be at least 2 (block 0 is the null block)")
        if self.block_size < 1 or self.max_model_len < 2 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_model_len, max_num_seqs and max_num_batched_tokens must be positive")

    @property
    def usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """vLLM's 'Maximum concurrency for max_model_len tokens per request'."""
        return self.num_gpu_blocks / cdiv(self.max_model_len, self.block_size)


@dataclass(eq=False)
class SimRequest:
    request_id: str
    prompt_len: int
    max_tokens: int
    arrival: float = 0.0
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    status: str = WAITING
    blocks: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    finish_reason: str | None = None
    # timestamps the shell fills in (scheduler time, not wall time)
    first_scheduled: float | None = None
    first_token: float | None = None
    finished_at: float | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens (what a recompute must prefill again)."""
        return self.prompt_len + self.num_output_tokens


@dataclass(frozen=True)
class ScheduledChunk:
    request_id: str
    num_tokens: int          # tokens computed this step
    context_before: int      # tokens already in the KV cache (read by attention)
    prefill: bool            # part of a (re)prefill, not a single decode token


@dataclass
class SchedulerOutput:
    step: int
    scheduled: list[ScheduledChunk]
    preempted: list[str]
    admitted: list[str]
    token_budget_left: int

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(c.num_tokens for c in self.scheduled)

    @property
    def prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.scheduled if c.prefill)

    @property
    def decode_tokens(self) -> int:
        return sum(c.num_tokens for c in self.scheduled if not c.prefill)

    @property
    def kv_tokens_read(self) -> int:
        """Tokens of KV cache attention reads this step (context of every scheduled request)."""
        return sum(c.context_before + c.num_tokens for c in self.scheduled)

    @property
    def empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token (finish_reason set on the last one of a request)."""

    request_id: str
    index: int                 # 0-based position among the request's output tokens
    finish_reason: str | None  # "length" when it is the last


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self._free: deque[int] = deque(range(1, config.num_gpu_blocks))  # block 0: null block
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.requests: dict[str, SimRequest] = {}
        self.num_preemptions_total = 0
        self.steps = 0

    # ------------------------------------------------------------ queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.config.usable_blocks

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.config.block_size)

    # ------------------------------------------------------------ requests
    def add_request(self, request: SimRequest) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id}")
        if request.prompt_len < 1:
            raise ValueError("a request needs at least one prompt token")
        if request.prompt_len >= self.config.max_model_len:
            raise ValueError(f"prompt of {request.prompt_len} tokens does not fit max_model_len "
                             f"{self.config.max_model_len}")
        request.status = WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> bool:
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._free_blocks(request)
        request.status = ABORTED
        return True

    # ------------------------------------------------------------ blocks
    def _allocate(self, request: SimRequest, num_new_tokens: int) -> bool:
        need = self.blocks_needed(request.num_computed_tokens + num_new_tokens) - len(request.blocks)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        request.blocks.extend(self._free.popleft() for _ in range(need))
        return True

    def _free_blocks(self, request: SimRequest) -> None:
        # vLLM frees in reverse order so the tail blocks are evicted first; order does not matter here
        self._free.extend(reversed(request.blocks))
        request.blocks = []

    def _preempt(self, request: SimRequest) -> None:
        self._free_blocks(request)
        request.status = PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(request)

    # ------------------------------------------------------------ the step
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: list[ScheduledChunk] = []
        preempted: list[str] = []
        admitted: list[str] = []

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget,
                          cfg.max_model_len - 1 - request.num_computed_tokens)
            if num_new <= 0:
                index += 1
                continue
            can_schedule = True
            while not self._allocate(request, num_new):
                if cfg.crash_on_kv_exhaustion:
                    need = self.blocks_needed(request.num_computed_tokens + num_new) - len(request.blocks)
                    raise KvCacheExhausted(request.request_id, need, self.num_free_blocks)
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    can_schedule = False
                    break
            if not can_schedule:
                break
            decode = num_new == 1 and request.num_output_tokens > 0 \
                and request.num_computed_tokens == request.num_tokens - 1
            scheduled.append(ScheduledChunk(request.request_id, num_new, request.num_computed_tokens,
                                            prefill=not decode))
            request.num_computed_tokens += num_new
            budget -= num_new
            index += 1

        if not preempted:
            while self.waiting and budget > 0:
                if len(self.running) >= cfg.max_num_seqs:
                    break
                request = self.waiting[0]
                num_new = request.num_tokens - request.num_computed_tokens
                if not cfg.enable_chunked_prefill and num_new > budget:
                    break  # waits for a step with enough budget (vLLM stops admitting here)
                num_new = min(num_new, budget)
                if not self._allocate(request, num_new):
                    break
                self.waiting.popleft()
                self.running.append(request)
                request.status = RUNNING
                admitted.append(request.request_id)
                scheduled.append(ScheduledChunk(request.request_id, num_new, request.num_computed_tokens,
                                                prefill=True))
                request.num_computed_tokens += num_new
                budget -= num_new

        self.steps += 1
        return SchedulerOutput(self.steps, scheduled, preempted, admitted, budget)

    def update(self, output: SchedulerOutput) -> list[TokenEvent]:
        """Apply a finished step: sample one token for every request that caught up; free finished ones."""
        events: list[TokenEvent] = []
        for chunk in output.scheduled:
            request = self.requests.get(chunk.request_id)
            if request is None or request.status != RUNNING:
                continue  # aborted (or preempted later in the same step) while the step ran
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            request.num_output_tokens += 1
            reason = None
            if request.num_output_tokens >= request.max_tokens or request.num_tokens >= self.config.max_model_len:
                reason = "length"
            events.append(TokenEvent(request.request_id, request.num_output_tokens - 1, reason))
            if reason:
                self._finish(request, reason)
        return events

    def step(self) -> tuple[SchedulerOutput, list[TokenEvent]]:
        output = self.schedule()
        return output, self.update(output)

    def _finish(self, request: SimRequest, reason: str) -> None:
        request.status = FINISHED
        request.finish_reason = reason
        self.running.remove(request)
        self._free_blocks(request)
        self.requests.pop(request.request_id, None)

    # ------------------------------------------------------------ invariants (tests)
    def check_invariants(self) -> None:
        held = [b for r in self.running for b in r.blocks]
        assert len(held) == len(set(held)), "a block is held twice"
        assert 0 not in held and 0 not in self._free, "the null block was handed out"
        assert len(held) + len(self._free) == self.config.usable_blocks, "blocks leaked"
        assert len(self.running) <= self.config.max_num_seqs
        for r in self.running:
            assert len(r.blocks) == self.blocks_needed(r.num_computed_tokens), (r.request_id, len(r.blocks))
        for r in self.waiting:
            assert not r.blocks and r.num_computed_tokens == 0
