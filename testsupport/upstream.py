"""The fake OpenAI-compatible engine the tests and benchmarks run against: raw asyncio, in a test's own event loop
or as a process of its own.

Not a simulator (that is `oomguard simulate`, the product's stand-in for vLLM): it answers at once or at a fixed
pace, and does what the test tells it to. Every setting is an attribute, read afresh on each request.

Serves POST /v1/completions and /v1/chat/completions (streamed or not), POST /v1/embeddings, POST /tokenize, and
GET /v1/models (with max_model_len), /metrics and /health; HEAD of any of them; keep-alive and pipelining.

- Answers: `tokens` tokens (default: the request's max_tokens, 16 when unset) reading "t0", "t1", ...; token i
  goes out at ttft + i * itl, and the answer ends one itl after its last token (a plain answer all at once
  then). Streams are SSE with a usage event when `stream_options.include_usage` asks for one, as vLLM does.
- /metrics in vLLM's names (`engine="sglang"` or `"llamacpp"`: those engines' names): `kv_usage`, `running` and
  `waiting` follow the load (requests in progress against `slots`) unless a test pins them; a request that starts
  while `slots` are busy counts a preemption.
- Faults: every `fail_every`th request answers `fail_status`; after `die_after_requests` requests the server dies
  (every connection cut, the port closed); a stream is cut mid-event after `die_after_tokens` tokens; a prompt
  longer than max_model_len (in words) gets vLLM's 400; `drop_reused` closes a keep-alive connection, unanswered,
  when a second completion arrives on it; `answer_bytes` answers that many bytes at the reader's pace.

    python -m testsupport.upstream --port 0 --itl 0.02 --slots 16   # prints "listening on http://..."

    async with FakeUpstream() as engine:   # in a test
        engine.kv_usage = 0.95             # the next /metrics says so
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
from collections import deque
from http import HTTPStatus
from typing import Any

from multidict import CIMultiDict

from testsupport import free_port

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
_LARGE_EVENT = b"data: " + b"x" * ((64 << 10) - 8) + b"\n\n"   # 64 KiB SSE events, 16 to a write
_LARGE_BLOCK = _LARGE_EVENT * 16
_DONE = b"data: [DONE]\n\n"


@functools.lru_cache(maxsize=256)
def answer_text(tokens: int) -> str:
    """What a plain (non-streamed) answer of `tokens` tokens says: the streamed tokens, joined by spaces."""
    return " ".join(f"t{i}" for i in range(tokens))


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _ClientGone(Exception):
    """The client closed the connection before its answer was done."""


def _error_body(status: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()


class FakeUpstream:
    """One fake engine on `host:port`. Port None: a free one picked now, so that `url` is known before the start
    (and after a stop, to start another on it); 0: whatever the kernel gives at the start."""

    def __init__(self, port: int | None = None, *, host: str = "127.0.0.1", model: str = "fake-model",
                 max_model_len: int = 4096, ttft: float = 0.0, itl: float = 0.0, slots: int = 1_000_000,
                 engine: str = "vllm", vllm_names: str = "new", fail_every: int = 0, die_after_requests: int = 0):
        self.host = host
        self.port = free_port(host) if port is None else port
        self.model = model
        self.max_model_len = max_model_len
        # the pace of an answer
        self.ttft = ttft
        self.itl = itl
        self.tokens: int | None = None   # tokens an answer has; None: the request's max_tokens
        # /metrics: None follows the load; a number pins the figure
        self.engine = engine   # whose metric names: "vllm", "sglang" or "llamacpp"
        self.vllm_names = vllm_names   # "new": vllm:kv_cache_usage_perc; "old": vllm:gpu_cache_usage_perc
        self.slots = slots
        self.kv_usage: float | None = None
        self.running: int | None = None
        self.waiting: int | None = None
        self.metrics_delay = 0.0   # seconds /metrics takes (to make the proxy's metrics stale)
        self.metrics_padding = 0   # bytes of comment lines added to /metrics (a page larger than any engine's)
        # faults
        self.fail_every = fail_every
        self.fail_status = 500
        self.die_after_requests = die_after_requests
        self.die_after_tokens: int | None = None
        self.drop_reused = False
        self.answer_bytes = 0
        # what it saw and did
        self.seen: deque[dict[str, Any]] = deque(maxlen=10_000)   # completions: path, headers, body, t
        self.requests = 0   # completion requests taken
        self.active = 0
        self.peak_active = 0
        self.preemptions = 0
        self.completed = 0
        self.cancelled = 0   # left unfinished because the client went away (or the server stopped)
        self.dropped = 0   # closed unanswered by `drop_reused`
        self._server: asyncio.AbstractServer | None = None
        self._transports: set[asyncio.Transport] = set()
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the fake upstream is not started: its port is not known yet")
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> FakeUpstream:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), self.host, self.port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Like a killed process: the port closes and open connections drop."""
        self._die()
        await asyncio.sleep(0)   # the cut connections' callbacks run, cancelling their answers
        await asyncio.gather(*self._tasks, return_exceptions=True)   # ... which are settled when this returns

    def _die(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for transport in list(self._transports):
            transport.abort()

    async def __aenter__(self) -> FakeUpstream:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # ------------------------------------------------------------------ routes
    def handle(self, conn: _Connection, method: str, path: str, headers: list, body: bytes) -> None:
        if path in COMPLETION_PATHS and method == "POST":
            self._completion(conn, path, headers, body)
        elif path == "/metrics":
            if self.metrics_delay:
                conn.spawn(self._slow_metrics(conn))
            else:
                conn.send(200, self.metrics(), b"text/plain; version=0.0.4")
        elif path == "/v1/models":
            conn.send(200, json.dumps({"object": "list", "data": [
                {"id": self.model, "object": "model", "owned_by": "vllm", "max_model_len": self.max_model_len}]
            }).encode())
        elif path == "/health":
            conn.send(200, b"")
        elif path == "/v1/embeddings" and method == "POST":
            self.seen.append({"path": path, "headers": CIMultiDict(headers), "body": json.loads(body or b"{}"),
                              "t": time.monotonic()})
            conn.send(200, b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.0,1.0]}]}')
        elif path == "/tokenize" and method == "POST":
            obj = json.loads(body or b"{}")
            conn.send(200, json.dumps({"count": len(str(obj.get("prompt") or obj.get("content") or "").split())
                                       }).encode())
        else:
            conn.send(404, _error_body(404, "not found", "NotFoundError"))

    async def _slow_metrics(self, conn: _Connection) -> None:
        await asyncio.sleep(self.metrics_delay)
        conn.send(200, self.metrics(), b"text/plain; version=0.0.4")

    def metrics(self) -> bytes:
        slots = max(1, self.slots)
        kv = min(1.0, self.active / slots) if self.kv_usage is None else self.kv_usage
        running = min(self.active, slots) if self.running is None else self.running
        waiting = max(0, self.active - slots) if self.waiting is None else self.waiting
        lab = f'{{engine="0",model_name="{self.model}"}}'
        if self.engine == "sglang":  # python/sglang/srt/metrics/collector.py: no preemption counter
            text = (f"# TYPE sglang:token_usage gauge\nsglang:token_usage{lab} {kv}\n"
                    f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{lab} {running}\n"
                    f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{lab} {waiting}\n")
        elif self.engine == "llamacpp":  # llama-server --metrics: no KV usage, no preemptions
            text = (f"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {running}\n"
                    f"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred {waiting}\n"
                    f"# TYPE llamacpp:n_decode_total counter\nllamacpp:n_decode_total {self.requests}\n")
        else:
            kv_name = "vllm:kv_cache_usage_perc" if self.vllm_names == "new" else "vllm:gpu_cache_usage_perc"
            text = (f"# TYPE {kv_name} gauge\n{kv_name}{lab} {kv}\n"
                    f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{lab} {running}\n"
                    f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{lab} {waiting}\n"
                    f"# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{lab} {self.preemptions}\n")
        if self.metrics_padding:
            text = ("# " + "x" * 1000 + "\n") * (self.metrics_padding // 1003) + text
        return text.encode()

    # ------------------------------------------------------------------ completions
    def _completion(self, conn: _Connection, path: str, headers: list, body: bytes) -> None:
        if self.drop_reused and conn.completions:
            self.dropped += 1
            conn.transport.close()
            return
        conn.completions += 1
        self.requests += 1
        n = self.requests
        if self.die_after_requests and n > self.die_after_requests:
            self._die()
            return
        try:
            req = json.loads(body)
        except ValueError:
            conn.send(400, _error_body(400, "bad JSON", "BadRequestError"))
            return
        self.seen.append({"path": path, "headers": CIMultiDict(headers), "body": req, "t": time.monotonic()})
        if self.fail_every and n % self.fail_every == 0:
            status = self.fail_status
            kind = "InternalServerError" if status >= 500 else "BadRequestError"
            conn.send(status, _error_body(status, "injected failure", kind), extra=b"x-engine: fake\r\n")
            return
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        prompt = req.get("prompt")
        if prompt is None:
            prompt = " ".join(m["content"] for m in req.get("messages", ()) if isinstance(m.get("content"), str))
        n_prompt = len(str(prompt).split())
        if n_prompt + max_tokens > self.max_model_len:
            message = (f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                       f"{n_prompt + max_tokens} tokens ({n_prompt} in the messages, {max_tokens} in the "
                       "completion). Please reduce the length of the messages or completion.")
            conn.send(400, _error_body(400, message, "BadRequestError"), extra=b"x-engine: fake\r\n")
            return
        answer = _Answer(self, path.endswith("chat/completions"), req, n_prompt,
                         self.tokens if self.tokens is not None else max_tokens)
        self._begin()
        if answer.stream or self.ttft or self.itl or self.answer_bytes or self.die_after_tokens is not None:
            conn.spawn(answer.run(conn), settled=self._settled)
        else:  # the common case in benchmarks: answered in this callback, no task
            conn.send(200, answer.whole(), extra=b"x-engine: fake\r\n")
            self.completed += 1
            self.active -= 1

    def _begin(self) -> None:
        if self.active >= self.slots:
            self.preemptions += 1
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)

    def _settled(self, task: asyncio.Task) -> None:
        self.active -= 1
        if task.cancelled() or isinstance(task.exception(), _ClientGone):
            self.cancelled += 1


class _Answer:
    """One completion's answer: whole, streamed token by token, or `answer_bytes` of filler."""

    def __init__(self, up: FakeUpstream, chat: bool, req: dict, n_prompt: int, tokens: int):
        self.up, self.chat, self.tokens, self.n_prompt = up, chat, tokens, n_prompt
        self.stream = req.get("stream") is True
        options = req.get("stream_options")
        self.usage_event = isinstance(options, dict) and options.get("include_usage") is True
        self.echo = req.get("max_tokens")   # what reached the engine, for tests of the proxy's cap

    def _usage(self) -> str:
        return (f'{{"prompt_tokens":{self.n_prompt},"completion_tokens":{self.tokens},'
                f'"total_tokens":{self.n_prompt + self.tokens}}}')

    def whole(self) -> bytes:
        text, model = answer_text(self.tokens), self.up.model
        if self.chat:
            choice = f'{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"length"}}'
            head = f'{{"id":"chatcmpl-1","object":"chat.completion","model":"{model}"'
        else:
            choice = f'{{"index":0,"text":"{text}","finish_reason":"length"}}'
            head = f'{{"id":"cmpl-1","object":"text_completion","model":"{model}"'
        return (f'{head},"choices":[{choice}],"usage":{self._usage()},'
                f'"echo_max_tokens":{json.dumps(self.echo)}}}').encode()

    def event(self, i: int) -> bytes:
        model = self.up.model
        if self.chat:
            return (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"%s","choices":[{"index":0,'
                    b'"delta":{"content":"t%d"},"finish_reason":null}]}\n\n' % (model.encode(), i))
        return (b'data: {"id":"cmpl-1","object":"text_completion","model":"%s","choices":[{"index":0,'
                b'"text":"t%d","finish_reason":null}]}\n\n' % (model.encode(), i))

    async def run(self, conn: _Connection) -> None:
        up = self.up
        if up.answer_bytes:
            await self._filler(conn, up.answer_bytes)
            up.completed += 1
            return
        start = time.perf_counter()
        ttft, itl = up.ttft, up.itl
        if not self.stream:
            await asyncio.sleep(ttft + itl * self.tokens)
            conn.send(200, self.whole(), extra=b"x-engine: fake\r\n")
            up.completed += 1
            return
        tr = conn.transport
        tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                 b"x-engine: fake\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(self.tokens + 1):   # the tokens, then the end one itl after the last
            due = start + ttft + i * itl
            delay = due - time.perf_counter()
            if delay > 0:   # on an absolute clock: the pace does not drift with the loop's lag
                await asyncio.sleep(delay)
            if tr.is_closing():
                raise _ClientGone()
            if i == up.die_after_tokens:
                tr.write(_chunk(b'data: {"partial": tr'))   # half an event, then the process dies
                tr.abort()
                return
            if i < self.tokens:
                tr.write(_chunk(self.event(i)))
        end = _chunk(b'data: {"id":"cmpl-1","choices":[],"usage":%s}\n\n' % self._usage().encode()) \
            if self.usage_event else b""
        tr.write(end + _chunk(_DONE) + b"0\r\n\r\n")
        up.completed += 1
        conn.finish()

    async def _filler(self, conn: _Connection, size: int) -> None:
        """`size` bytes as fast as the reader takes them (each write waits while the socket is full)."""
        tr = conn.transport
        if self.stream:
            tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        else:
            tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
                     % size)
        left = size
        while left > 0:
            block = _LARGE_BLOCK[:left]
            tr.write(_chunk(block) if self.stream else block)
            left -= len(block)
            await conn.drain()
        if self.stream:
            tr.write(_chunk(_DONE) + b"0\r\n\r\n")
        conn.finish()


class _Connection(asyncio.Protocol):
    """HTTP/1.1 with Content-Length request bodies (what every client here sends), one request at a time."""

    def __init__(self, up: FakeUpstream):
        self.up = up
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task | None = None   # the answer in progress; pipelined requests wait for it
        self.completions = 0
        self.head_only = False   # the request being answered is a HEAD
        self.close_after = False   # ... and asked for `Connection: close`
        self._writable: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.up._transports.add(transport)

    def connection_lost(self, exc) -> None:
        self.up._transports.discard(self.transport)
        if self.task is not None:
            self.task.cancel()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable
        if self.transport.is_closing():
            raise _ClientGone()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.task is None and not self.transport.is_closing():
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            lines = self.buf[:head_end].decode("latin-1").split("\r\n")
            try:
                method, target, _ = lines[0].split(" ", 2)
            except ValueError:
                self.transport.close()
                return
            headers, length, close = [], 0, False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name, value = name.strip(), value.strip()
                headers.append((name, value))
                lower = name.lower()
                if lower == "content-length":
                    length = int(value)
                elif lower == "connection":
                    close = value.lower() == "close"
            total = head_end + 4 + length
            if len(self.buf) < total:
                return
            body = self.buf[head_end + 4:total]
            self.buf = self.buf[total:]
            self.head_only, self.close_after = method == "HEAD", close
            self.up.handle(self, "GET" if method == "HEAD" else method, target.split("?", 1)[0], headers, body)

    def send(self, status: int, body: bytes, ctype: bytes = b"application/json", extra: bytes = b"") -> None:
        """A whole answer; the body left out for a HEAD (its length kept)."""
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            status, HTTPStatus(status).phrase.encode(), ctype, len(body), extra)
        self.transport.write(head if self.head_only else head + body)
        self.finish()

    def finish(self) -> None:
        if self.close_after:
            self.transport.close()

    def spawn(self, coro, settled=None) -> None:
        """Answer in a task; the requests behind this one wait until it is done."""
        self.task = task = asyncio.ensure_future(coro)
        self.up._tasks.add(task)
        task.add_done_callback(self.up._tasks.discard)
        if settled is not None:
            task.add_done_callback(settled)
        task.add_done_callback(self._next)

    def _next(self, task: asyncio.Task) -> None:
        self.task = None
        if not task.cancelled() and task.exception() is not None and not self.transport.is_closing():
            self.transport.abort()   # a failed answer must not leave the client waiting
        if self.buf and not self.transport.is_closing():
            self.data_received(b"")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m testsupport.upstream", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--ttft", type=float, default=0.0, help="seconds before the first token")
    p.add_argument("--itl", type=float, default=0.0, help="seconds between tokens")
    p.add_argument("--slots", type=int, default=1_000_000, help="requests that fit in the \"KV cache\"")
    p.add_argument("--fail-every", type=int, default=0, help="every Nth completion answers HTTP 500")
    p.add_argument("--die-after", type=int, default=0,
                   help="after N completions, cut every connection and stop listening")
    p.add_argument("--vllm-names", choices=("new", "old"), default="new")
    p.add_argument("--engine", choices=("vllm", "sglang", "llamacpp"), default="vllm",
                   help="whose metric names /metrics uses")
    p.add_argument("--uvloop", action="store_true")
    a = p.parse_args(argv)
    up = FakeUpstream(a.port, host=a.host, model=a.model, max_model_len=a.max_model_len, ttft=a.ttft, itl=a.itl,
                      slots=a.slots, engine=a.engine, vllm_names=a.vllm_names, fail_every=a.fail_every,
                      die_after_requests=a.die_after)

    async def serve() -> None:
        await up.start()
        print(f"listening on {up.url}", flush=True)
        await asyncio.Event().wait()   # until killed

    if a.uvloop:
        import uvloop

        uvloop.run(serve())
    else:
        asyncio.run(serve())


if __name__ == "__main__":
    main()
