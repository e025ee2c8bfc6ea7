"""The simulated vLLM OpenAI server: aiohttp shell around the pure scheduler, with roofline step timing.

Endpoints as vLLM serves them: GET /health, /version, /v1/models (with max_model_len), /metrics; POST
/tokenize (the count this module's rule gives), /v1/completions and /v1/chat/completions (SSE streaming or not, OpenAI shapes as vLLM returns them).

Token counting (the simulator has no tokenizer): a prompt string counts one token per word and one per
punctuation character (regex `\\w+|[^\\w\\s]`); a list of token ids counts its length; a chat request counts its
messages' text plus vLLM-Llama-3-like template overhead (1 + 5 per message + 4 for the assistant header).
Generated text is one word per token (so counting it back gives completion_tokens). Requests always run to
max_tokens (no EOS; `stop` is ignored); without max_tokens they run to max_model_len, as vLLM's default.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from aiohttp import web

from oomguard.simulate.metrics import SimMetrics
from oomguard.simulate.openai_errors import check_context, error_body
from oomguard.simulate.plan import SimPlan
from oomguard.simulate.scheduler import Scheduler, SchedulerConfig, SimRequest, TokenEvent
from oomguard.simulate.timing import Roofline

_TOKEN = re.compile(r"\w+|[^\w\s]")
WORDS = ("the", "cache", "block", "token", "memory", "model", "server", "request", "batch", "layer", "queue",
         "prefill", "decode", "attention", "kernel", "tensor", "graph", "stream", "budget", "page", "slot",
         "engine", "sample", "weight", "head", "value", "key", "context", "window", "limit", "step", "time")
CHAT_TEMPLATE_TOKENS = (1, 5, 4)  # begin, per message, assistant header
MIN_SLEEP_S = 0.002
_dumps = functools.partial(json.dumps, separators=(",", ":"))


def _json(data, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=_dumps)


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def prompt_tokens(prompt) -> int:
    if isinstance(prompt, str):
        return count_tokens(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return prompt_tokens(prompt[0])
    raise ValueError("prompt must be a string or a list of token ids (batched prompts are not simulated)")


def chat_tokens(messages) -> int:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    begin, per_message, header = CHAT_TEMPLATE_TOKENS
    total = begin + header
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("each message must be an object with role and content")
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        total += per_message + count_tokens(str(content))
    return total


def token_id(index: int) -> int:
    """A stand-in token id for /tokenize (the simulator has no vocabulary)."""
    return 1000 + (index * 7919) % 30000


def token_text(index: int) -> str:
    return " " + WORDS[(index * 7 + 3) % len(WORDS)]


@dataclass
class _Live:
    request: SimRequest
    queue: asyncio.Queue
    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    done: bool = False


class EngineDead(RuntimeError):
    pass


class SimEngine:
    """The engine loop: schedule, sleep the step's roofline time, sample, deliver tokens, keep metrics."""

    def __init__(self, plan: SimPlan, speed: float = 1.0, crash_on_kv_exhaustion: bool = False,
                 served_model_name: str | None = None, on_fatal: Callable[[BaseException], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.plan = plan
        self.speed = speed
        self.model_name = served_model_name or plan.model
        self.scheduler = Scheduler(SchedulerConfig(
            num_gpu_blocks=plan.num_gpu_blocks, block_size=plan.block_size, max_model_len=plan.max_model_len,
            max_num_seqs=plan.max_num_seqs, max_num_batched_tokens=plan.max_num_batched_tokens,
            enable_chunked_prefill=plan.enable_chunked_prefill, crash_on_kv_exhaustion=crash_on_kv_exhaustion))
        self.roofline = Roofline(plan.flops_per_token, plan.weights_bytes, plan.kv_bytes_per_token, plan.peak_flops,
                                 plan.bandwidth, speed)
        sched = self.scheduler
        self.metrics = SimMetrics(plan.vllm_version, self.model_name, plan.cache_config_labels(),
                                  kv_usage=lambda: sched.kv_usage, running=lambda: len(sched.running),
                                  waiting=lambda: len(sched.waiting))
        self.on_fatal = on_fatal
        self.clock = clock
        self.dead: BaseException | None = None
        self._live: dict[str, _Live] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._deadline = 0.0
        self.steps = 0

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="oomguard-simulate-engine")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass

    # ------------------------------------------------------------ requests
    def submit(self, prompt_len: int, max_tokens: int) -> _Live:
        if self.dead:
            raise EngineDead(str(self.dead))
        request = SimRequest(f"req-{uuid.uuid4().hex[:16]}", prompt_len, max_tokens)
        live = _Live(request, asyncio.Queue(), self.clock())
        self.scheduler.add_request(request)
        self._live[request.request_id] = live
        assert self._wake is not None
        self._wake.set()
        return live

    def abort(self, live: _Live) -> None:
        if not live.done:
            live.done = True
            self.scheduler.abort(live.request.request_id)
            self._live.pop(live.request.request_id, None)

    # ------------------------------------------------------------ loop
    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                output = self.scheduler.schedule()
            except Exception as exc:  # KvCacheExhausted in crash mode; anything else is a bug: fail loudly
                self._die(exc)
                return
            now = self.clock()
            for rid in output.admitted:
                live = self._live.get(rid)
                if live and live.first_scheduled is None:
                    live.first_scheduled = now
                    self.metrics.queue.observe(now - live.arrival)
            if output.preempted:
                self.metrics.preemptions.inc(len(output.preempted))
            if output.empty:  # waiting requests that cannot be admitted and nothing running: wait for a change
                self._wake.clear()
                await self._wake.wait()
                continue
            # a virtual clock keeps the average step rate right even when one sleep overshoots
            # asyncio timers have ~1 ms resolution, so short steps only yield and the debt is slept off later
            self._deadline = max(self._deadline, now) + self.roofline.step_seconds(output)
            ahead = self._deadline - self.clock()
            await asyncio.sleep(ahead if ahead >= MIN_SLEEP_S else 0)
            self.steps += 1
            self._deliver(self.scheduler.update(output))

    def _deliver(self, events: list[TokenEvent]) -> None:
        now = self.clock()
        for event in events:
            live = self._live.get(event.request_id)
            if live is None:
                continue
            m = self.metrics
            m.generation_tokens.inc()
            if live.first_token is None:
                live.first_token = now
                m.ttft.observe(now - live.arrival)
                m.prompt_tokens.inc(live.request.prompt_len)
            elif live.last_token is not None:
                m.observe_token_gap(now - live.last_token)
            live.last_token = now
            live.queue.put_nowait(event)
            if event.finish_reason:
                live.done = True
                self._live.pop(event.request_id, None)
                r = live.request
                m.e2e.observe(now - live.arrival)
                m.inference.observe(now - (live.first_scheduled or live.arrival))
                m.prompt_hist.observe(r.prompt_len)
                m.generation_hist.observe(r.num_output_tokens)
                if m.tpot is not None and r.num_output_tokens > 1:
                    m.tpot.observe((now - live.first_token) / (r.num_output_tokens - 1))
                m.request_success(event.finish_reason)

    def _die(self, exc: BaseException) -> None:
        self.dead = exc
        for live in list(self._live.values()):
            live.queue.put_nowait(exc)
        self._live.clear()
        if self.on_fatal:
            self.on_fatal(exc)


# ---------------------------------------------------------------- HTTP
def _json_error(engine: SimEngine, message: str, status: int = 400, err_type: str = "BadRequestError",
                param: str | None = None) -> web.Response:
    return _json(error_body(engine.plan.vllm_version, message, status, err_type, param), status=status)


async def _read_body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    return body


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None}


def build_app(engine: SimEngine, api_key: str | None = None) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app["engine"] = engine

    def authorized(request: web.Request) -> bool:
        if not api_key:
            return True
        import hmac
        return hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {api_key}")

    async def health(_: web.Request) -> web.Response:
        if engine.dead:
            return web.Response(status=503)
        return web.Response(status=200)

    async def version(_: web.Request) -> web.Response:
        return _json({"version": ".".join(map(str, engine.plan.vllm_version))})

    async def models(request: web.Request) -> web.Response:
        if not authorized(request):
            return _json({"error": "Unauthorized"}, status=401)
        created = int(time.time())
        return _json({"object": "list", "data": [{
            "id": engine.model_name, "object": "model", "created": created, "owned_by": "vllm",
            "root": engine.plan.model, "parent": None, "max_model_len": engine.plan.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                            "created": created, "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}],
        }]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=engine.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def generate(request: web.Request, chat: bool) -> web.StreamResponse:
        if not authorized(request):
            return _json({"error": "Unauthorized"}, status=401)
        try:
            body = await _read_body(request)
            n = chat_tokens(body.get("messages")) if chat else prompt_tokens(body.get("prompt", ""))
            if int(body.get("n") or 1) != 1:
                raise ValueError("n > 1 is not simulated")
        except (ValueError, TypeError) as exc:
            return _json_error(engine, str(exc))
        model = body.get("model")
        if model is not None and model != engine.model_name:
            return _json_error(engine, f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
        raw_max = body.get("max_completion_tokens") if chat else None
        raw_max = raw_max if raw_max is not None else body.get("max_tokens")
        try:
            requested = None if raw_max is None else int(raw_max)
        except (TypeError, ValueError):
            return _json_error(engine, "max_tokens must be an integer")
        if requested is not None and requested < 1:
            return _json_error(engine, f"max_tokens must be at least 1, got {requested}.")
        if n < 1:
            return _json_error(engine, "The prompt must contain at least one token.")
        message, max_tokens = check_context(engine.plan.vllm_version, engine.plan.max_model_len, n, requested)
        if message:
            return _json_error(engine, message)
        try:
            live = engine.submit(n, max_tokens)
        except EngineDead:
            return _json_error(engine, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                               500, "InternalServerError")
        rid = ("chatcmpl-" if chat else "cmpl-") + live.request.request_id[4:]
        created = int(time.time())
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) if stream else False
        try:
            if stream:
                return await _stream(request, engine, live, rid, created, chat, n, include_usage)
            return await _whole(engine, live, rid, created, chat, n)
        finally:
            engine.abort(live)  # no-op once finished; frees the blocks of a request whose client went away

    async def tokenize(request: web.Request) -> web.Response:
        # vLLM's POST /tokenize (entrypoints/openai/serving_tokenization.py): the count the engine will see
        if not authorized(request):
            return _json({"error": "Unauthorized"}, status=401)
        try:
            body = await _read_body(request)
            n = chat_tokens(body["messages"]) if "messages" in body else prompt_tokens(body.get("prompt", ""))
        except (ValueError, TypeError) as exc:
            return _json_error(engine, str(exc))
        return _json({"count": n, "max_model_len": engine.plan.max_model_len,
                      "tokens": [token_id(i) for i in range(n)], "token_strs": None})

    async def completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=True)

    async def on_startup(_: web.Application) -> None:
        await engine.start()

    async def on_cleanup(_: web.Application) -> None:
        await engine.stop()

    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def _next(live: _Live) -> TokenEvent:
    item = await live.queue.get()
    if isinstance(item, BaseException):
        raise EngineDead(str(item))
    return item


async def _whole(engine: SimEngine, live: _Live, rid: str, created: int, chat: bool, n: int) -> web.Response:
    pieces: list[str] = []
    reason = None
    try:
        while reason is None:
            event = await _next(live)
            pieces.append(token_text(event.index))
            reason = event.finish_reason
    except EngineDead:
        return _json_error(engine, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                           500, "InternalServerError")
    text = "".join(pieces)
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "reasoning_content": None, "content": text,
                                          "tool_calls": []},
                  "logprobs": None, "finish_reason": reason, "stop_reason": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                  "prompt_logprobs": None}
        obj = "text_completion"
    return _json({"id": rid, "object": obj, "created": created, "model": engine.model_name,
                              "choices": [choice], "usage": _usage(n, len(pieces)), "prompt_logprobs": None})


async def _stream(request: web.Request, engine: SimEngine, live: _Live, rid: str, created: int, chat: bool,
                  n: int, include_usage: bool) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    obj = "chat.completion.chunk" if chat else "text_completion"

    async def send(payload: dict | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
        await resp.write(f"data: {data}\n\n".encode())

    def chunk(choice: dict) -> dict:
        return {"id": rid, "object": obj, "created": created, "model": engine.model_name, "choices": [choice]}

    if chat:
        await send(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}))
    count = 0
    try:
        reason = None
        while reason is None:
            event = await _next(live)
            count += 1
            reason = event.finish_reason
            text = token_text(event.index)
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": reason,
                          "stop_reason": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
            await send(chunk(choice))
        if include_usage:
            await send({"id": rid, "object": obj, "created": created, "model": engine.model_name, "choices": [],
                        "usage": _usage(n, count)})
    except EngineDead:
        await send({"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root "
                              "cause.", "type": "InternalServerError", "param": None, "code": 500}})
    await send("[DONE]")
    await resp.write_eof()
    return resp


def print_lines(lines: list[str], stream=None) -> None:
    stream = stream or sys.stdout
    for line in lines:
        print(line, file=stream)
    stream.flush()
