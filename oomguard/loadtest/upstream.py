"""A trivial, fast OpenAI-compatible upstream on raw asyncio, for the load generator's tests and benchmark.

Not a simulator (that is `oomguard simulate`): it answers instantly or streams `max_tokens` chunks at a fixed
inter-token latency, and keeps a /metrics page in vLLM's names whose figures follow its own load:
`slots` requests fit (`--engine sglang|llamacpp` uses those engines' names instead); KV usage is active/slots (capped at 1) and every request that starts while `slots` are
busy counts a preemption. Faults on demand: every Nth request answers HTTP 500, the server dies after N
requests (closes every connection and stops listening), prompts longer than max_model_len get vLLM's 400.

    python -m oomguard.loadtest.upstream --port 0 --itl 0.02 --slots 16   # prints "listening on http://..."
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass

_MODELS_TMPL = '{"object":"list","data":[{"id":"%s","object":"model","owned_by":"oomguard","max_model_len":%d}]}'


@dataclass
class UpstreamConfig:
    model: str = "tiny-upstream"
    max_model_len: int = 4096
    ttft: float = 0.0  # seconds before the first token
    itl: float = 0.0  # seconds between streamed tokens
    slots: int = 1_000_000  # requests that fit in the "KV cache"
    fail_every: int = 0  # every Nth completion request answers HTTP 500
    die_after: int = 0  # after N completion requests, close everything and stop listening
    vllm_names: str = "new"  # "new": vllm:kv_cache_usage_perc; "old": vllm:gpu_cache_usage_perc
    engine: str = "vllm"  # whose metric names /metrics uses: "vllm", "sglang" or "llamacpp"


class _State:
    def __init__(self, cfg: UpstreamConfig):
        self.cfg = cfg
        self.active = 0
        self.requests = 0
        self.preemptions = 0
        self.peak_active = 0
        self.transports: set = set()
        self.server: asyncio.AbstractServer | None = None
        self.dead = False

    def metrics(self) -> bytes:
        kv = min(1.0, self.active / self.cfg.slots)
        running = min(self.active, self.cfg.slots)
        waiting = max(0, self.active - self.cfg.slots)
        if self.cfg.engine == "sglang":  # python/sglang/srt/metrics/collector.py: no preemption counter
            lab = f'{{model_name="{self.cfg.model}"}}'
            return (f"# TYPE sglang:token_usage gauge\nsglang:token_usage{lab} {kv}\n"
                    f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{lab} {running}\n"
                    f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{lab} {waiting}\n").encode()
        if self.cfg.engine == "llamacpp":  # llama-server --metrics: no KV usage, no preemptions
            return (f"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {running}\n"
                    f"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred {waiting}\n"
                    f"# TYPE llamacpp:n_decode_total counter\nllamacpp:n_decode_total {self.requests}\n").encode()
        kv_name = "vllm:kv_cache_usage_perc" if self.cfg.vllm_names == "new" else "vllm:gpu_cache_usage_perc"
        lab = f'{{model_name="{self.cfg.model}"}}'
        return (f"# TYPE {kv_name} gauge\n{kv_name}{lab} {kv}\n"
                f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{lab} {running}\n"
                f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{lab} {waiting}\n"
                f"# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{lab} {self.preemptions}\n"
                ).encode()


def _response(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Protocol(asyncio.Protocol):
    def __init__(self, state: _State):
        self.state = state
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False  # one request at a time per connection (no pipelining from our clients)
        self.tasks: set = set()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.state.transports.add(transport)

    def connection_lost(self, exc) -> None:
        self.state.transports.discard(self.transport)
        for t in self.tasks:
            t.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.busy:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, path, _ = lines[0].split(" ", 2)
            except ValueError:
                self.transport.close()
                return
            length = 0
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            total = head_end + 4 + length
            if len(self.buf) < total:
                return
            body = self.buf[head_end + 4:total]
            self.buf = self.buf[total:]
            self.handle(method, path.split("?", 1)[0], body)

    def handle(self, method: str, path: str, body: bytes) -> None:
        st, cfg, tr = self.state, self.state.cfg, self.transport
        if path == "/v1/models":
            tr.write(_response("200 OK", (_MODELS_TMPL % (cfg.model, cfg.max_model_len)).encode()))
        elif path == "/metrics":
            tr.write(_response("200 OK", st.metrics(), b"text/plain; version=0.0.4"))
        elif path == "/health":
            tr.write(_response("200 OK", b""))
        elif path == "/tokenize" and method == "POST":
            obj = json.loads(body or b"{}")
            text = obj.get("prompt") or obj.get("content") or ""
            tr.write(_response("200 OK", json.dumps({"count": len(text.split())}).encode()))
        elif path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            self.completion(path, body)
        else:
            tr.write(_response("404 Not Found", b'{"error":{"message":"not found"}}'))

    def completion(self, path: str, body: bytes) -> None:
        st, cfg, tr = self.state, self.state.cfg, self.transport
        st.requests += 1
        n = st.requests
        if cfg.die_after and n > cfg.die_after:
            self.die()
            return
        try:
            req = json.loads(body)
        except ValueError:
            tr.write(_response("400 Bad Request", b'{"object":"error","message":"bad JSON","code":400}'))
            return
        if cfg.fail_every and n % cfg.fail_every == 0:
            tr.write(_response("500 Internal Server Error",
                               b'{"object":"error","message":"injected failure","type":"InternalServerError",'
                               b'"code":500}'))
            return
        max_tokens = int(req.get("max_tokens") or 16)
        prompt = req.get("prompt")
        if prompt is None:
            prompt = " ".join(m.get("content", "") for m in req.get("messages", []))
        n_prompt = len(prompt.split())
        if n_prompt + max_tokens > cfg.max_model_len:
            msg = (f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
                   f"{n_prompt + max_tokens} tokens ({n_prompt} in the messages, {max_tokens} in the completion). "
                   "Please reduce the length of the messages or completion.")
            tr.write(_response("400 Bad Request", json.dumps(
                {"object": "error", "message": msg, "type": "BadRequestError", "param": None, "code": 400}).encode()))
            return
        chat = path.endswith("chat/completions")
        if not req.get("stream") and cfg.ttft == 0 and cfg.itl == 0:
            tr.write(_response("200 OK", self._full(chat, max_tokens, n_prompt)))
            return
        self.busy = True
        task = asyncio.ensure_future(self.slow(chat, bool(req.get("stream")), max_tokens, n_prompt))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @staticmethod
    def _full(chat: bool, max_tokens: int, n_prompt: int) -> bytes:
        usage = f'"usage":{{"prompt_tokens":{n_prompt},"completion_tokens":{max_tokens},' \
                f'"total_tokens":{n_prompt + max_tokens}}}'
        text = " tok" * max_tokens
        if chat:
            return ('{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
                    f'"content":"{text}"}},"finish_reason":"length"}}],{usage}}}').encode()
        return ('{"id":"c","object":"text_completion","choices":[{"index":0,'
                f'"text":"{text}","finish_reason":"length"}}],{usage}}}').encode()

    async def slow(self, chat: bool, stream: bool, max_tokens: int, n_prompt: int) -> None:
        st, cfg, tr = self.state, self.state.cfg, self.transport
        if st.active >= cfg.slots:
            st.preemptions += 1
        st.active += 1
        st.peak_active = max(st.peak_active, st.active)
        try:
            if cfg.ttft:
                await asyncio.sleep(cfg.ttft)
            if not stream:
                if cfg.itl:
                    await asyncio.sleep(cfg.itl * max(0, max_tokens - 1))
                tr.write(_response("200 OK", self._full(chat, max_tokens, n_prompt)))
            else:
                tr.write(_SSE_HEAD)
                if chat:
                    event = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,' \
                            b'"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
                else:
                    event = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,' \
                            b'"text":" tok","finish_reason":null}]}\n\n'
                ev = _chunk(event)
                perf = time.perf_counter
                next_t = perf()
                for i in range(max_tokens):
                    if i and cfg.itl:
                        next_t += cfg.itl
                        await asyncio.sleep(max(0.0, next_t - perf()))
                    if tr.is_closing():
                        return
                    tr.write(ev)
                usage = (f'data: {{"id":"c","choices":[],"usage":{{"prompt_tokens":{n_prompt},'
                         f'"completion_tokens":{max_tokens},"total_tokens":{n_prompt + max_tokens}}}}}\n\n'
                         ).encode()
                tr.write(_chunk(usage) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        finally:
            st.active -= 1
            self.busy = False
        if self.buf and not tr.is_closing():
            self.data_received(b"")

    def die(self) -> None:
        st = self.state
        st.dead = True
        if st.server is not None:
            st.server.close()
        for t in list(st.transports):
            t.abort()


async def start_upstream(cfg: UpstreamConfig, host: str = "127.0.0.1", port: int = 0):
    """Start on the running loop; returns (server, state, url)."""
    state = _State(cfg)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Protocol(state), host, port, backlog=4096)
    state.server = server
    port = server.sockets[0].getsockname()[1]
    return server, state, f"http://{host}:{port}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m oomguard.loadtest.upstream", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    for name in ("ttft", "itl"):
        p.add_argument(f"--{name}", type=float, default=0.0)
    for name in ("slots", "fail-every", "die-after", "max-model-len"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--vllm-names", choices=("new", "old"), default="new")
    p.add_argument("--engine", choices=("vllm", "sglang", "llamacpp"), default="vllm",
                   help="whose metric names /metrics uses")
    p.add_argument("--uvloop", action="store_true")
    a = p.parse_args(argv)
    cfg = UpstreamConfig(ttft=a.ttft, itl=a.itl, vllm_names=a.vllm_names, engine=a.engine)
    for name in ("slots", "fail_every", "die_after", "max_model_len"):
        if getattr(a, name) is not None:
            setattr(cfg, name, getattr(a, name))

    async def serve() -> None:
        server, state, url = await start_upstream(cfg, a.host, a.port)
        print(f"listening on {url}", flush=True)
        try:
            await server.serve_forever()
        except asyncio.CancelledError:
            pass

    if a.uvloop:
        import uvloop

        uvloop.run(serve())
    else:
        asyncio.run(serve())


if __name__ == "__main__":
    main()
