"""The HTTP side: one aiohttp session, OpenAI-compatible requests with streaming, and exact timing.

aiohttp was chosen by measurement (benchmarks/loadgen_speed.py): one process drives more requests per second
and more concurrent streams with it than with a plain httpx loop.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from oomguard.errors import UsageError
from oomguard.loadtest.workload import RequestSpec

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it. Times are seconds since the run began (perf_counter based)."""

    start: float
    end: float = 0.0
    ok: bool = False
    status: int = 0  # HTTP status; 0 when no response came (refused, reset, timeout, cancelled)
    error_kind: str | None = None  # "http", "connect", "disconnect", "timeout", "stream", "bad-response"
    error: str | None = None
    ttft: float | None = None
    itls: list[float] | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cancelled: bool = False  # stopped by us at the end of a stage: neither a success nor an error
    stage: int = 0

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def failed(self) -> bool:
        return not self.ok and not self.cancelled


def normalise_base_url(url: str) -> str:
    """'http://host:8000', '.../v1', '.../v1/' -> 'http://host:8000' (UsageError on anything else)."""
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"bad URL {url!r}: give the server's base URL, e.g. http://127.0.0.1:8000 "
                         "(with or without /v1)")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError:
        raise UsageError(f"bad URL {url!r}: the port is not a number in 1..65535") from None
    path = parts.path.rstrip("/")
    for suffix in ("/v1/chat/completions", "/v1/completions", "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return f"{parts.scheme}://{parts.netloc}{path}"


def is_local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.")


_DIGITS = re.compile(r"\d+")


def error_group(kind: str | None, status: int, message: str | None) -> tuple[str, str]:
    """A key that groups errors that differ only in numbers: ("HTTP 400", "... N tokens ...")."""
    label = f"HTTP {status}" if kind == "http" else (kind or "error")
    return label, _DIGITS.sub("N", message or "")


def _error_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:300] or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("msg") or err.get("detail")
            if msg:
                return str(msg)[:300]
        elif isinstance(err, str):
            return err[:300]
        if obj.get("message"):
            return str(obj["message"])[:300]
    return text[:300]


class OpenAIClient:
    """Sends one OpenAI-compatible request and measures it. Share one instance for the whole run."""

    def __init__(self, base_url: str, *, model: str = "", endpoint: str = "completions", stream: bool = True,
                 api_key: str | None = None, ignore_eos: bool = True, request_timeout: float = 600.0,
                 max_connections: int = 0, extra_body: dict | None = None, clock_zero: float | None = None):
        if endpoint not in ENDPOINTS:
            raise UsageError(f"--endpoint must be one of {', '.join(ENDPOINTS)}")
        self.base_url = base_url
        self.url = base_url + ENDPOINTS[endpoint]
        self.model = model
        self.endpoint = endpoint
        self.stream = stream
        self.ignore_eos = ignore_eos
        self.request_timeout = request_timeout
        self.extra_body = dict(extra_body or {})
        self.t0 = time.perf_counter() if clock_zero is None else clock_zero
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._max_connections = max_connections
        self.session: aiohttp.ClientSession | None = None
        self.tokens_received = 0  # output tokens so far, for the live display

    async def __aenter__(self) -> "OpenAIClient":
        self.session = make_session(self._max_connections, self.request_timeout, self.headers)
        return self

    async def __aexit__(self, *exc) -> None:
        if self.session is not None:
            await self.session.close()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def body(self, spec: RequestSpec) -> bytes:
        payload: dict = {"model": self.model, "max_tokens": spec.max_tokens, "stream": self.stream}
        if self.endpoint == "chat":
            msgs = spec.messages or (("user", spec.prompt),)
            payload["messages"] = [{"role": r, "content": c} for r, c in msgs]
        else:
            payload["prompt"] = spec.prompt
        if self.stream:
            payload["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            payload["ignore_eos"] = True
        if self.extra_body:
            payload.update(self.extra_body)
        return json.dumps(payload, separators=(",", ":")).encode()

    async def send(self, spec: RequestSpec, stage: int = 0) -> RequestResult:
        assert self.session is not None, "use `async with OpenAIClient(...)`"
        data = self.body(spec)
        perf = time.perf_counter
        t0 = self.t0
        res = RequestResult(start=perf() - t0, stage=stage)
        try:
            for attempt in range(4):
                try:
                    await self._post(data, res)
                    break
                except aiohttp.ClientConnectorError:
                    raise
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                    # a keep-alive connection the server had closed (llama.cpp's cpp-httplib does): again on
                    # another one, but only when nothing of the answer had come yet
                    if attempt == 3 or res.status:
                        raise
                    res.start = perf() - t0
        except asyncio.CancelledError:
            res.cancelled = True
            res.end = perf() - t0
            raise
        except asyncio.TimeoutError:
            res.error_kind, res.error = "timeout", f"no answer within {self.request_timeout:g} s"
        except aiohttp.ClientConnectorError as exc:
            res.error_kind, res.error = "connect", _connect_message(exc)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
            res.error_kind = "disconnect"
            res.error = "the server closed the connection" + (" mid-stream" if res.ttft is not None else "") \
                        + f" ({type(exc).__name__}: {exc})"[:300]
        except aiohttp.ClientError as exc:
            res.error_kind, res.error = "connect", f"{type(exc).__name__}: {exc}"[:300]
        finally:
            if not res.end:
                res.end = perf() - t0
        return res

    async def _post(self, data: bytes, res: RequestResult) -> None:
        async with self.session.post(self.url, data=data) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.error_kind, res.error = "http", _error_message(await resp.read())
            elif self.stream:
                await self._read_stream(resp, res)
            else:
                self._read_body(await resp.read(), res)

    def _read_body(self, body: bytes, res: RequestResult) -> None:
        try:
            obj = json.loads(body)
            choice = obj["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            res.error_kind, res.error = "bad-response", "the 200 response is not an OpenAI completion"
            return
        usage = obj.get("usage") or {}
        res.output_tokens = int(usage.get("completion_tokens") or 0) or _count_words(choice)
        res.prompt_tokens = usage.get("prompt_tokens")
        now = time.perf_counter() - self.t0
        res.ttft = now - res.start  # without streaming the first token arrives with the last
        res.ok = True
        self.tokens_received += res.output_tokens

    async def _read_stream(self, resp: aiohttp.ClientResponse, res: RequestResult) -> None:
        """Server-sent events, split into lines here (cheaper than the stream reader's readline); every event in
        one read from the socket gets the time of that read."""
        perf, t0, loads = time.perf_counter, self.t0, json.loads
        itls: list[float] = []
        chunks = 0
        last = 0.0
        usage = None
        done = False
        pending = b""
        async for data in resp.content.iter_any():
            now = perf() - t0
            lines = (pending + data).split(b"\n") if pending else data.split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True  # read on to the end of the body, so that the connection is reused
                    continue
                try:
                    obj = loads(payload)
                except ValueError:
                    res.error_kind, res.error = "stream", f"bad SSE event: {payload[:120]!r}"
                    return
                if "error" in obj:
                    err = obj["error"]
                    res.error_kind = "stream"
                    res.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
                    return
                choices = obj.get("choices")
                if choices:
                    c = choices[0]
                    text = c.get("text")
                    if text is None:
                        delta = c.get("delta") or {}
                        text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    if text:
                        if chunks == 0:
                            res.ttft = now - res.start
                        else:
                            itls.append(now - last)
                        last = now
                        chunks += 1
                        self.tokens_received += 1
                elif obj.get("usage"):
                    usage = obj["usage"]
        if not done and usage is None:
            res.error_kind = "disconnect"
            res.error = "the stream ended without [DONE]" + (" mid-stream" if chunks else "")
            return
        res.itls = itls
        res.output_tokens = chunks
        if usage:
            n = int(usage.get("completion_tokens") or 0)
            if n > chunks:
                self.tokens_received += n - chunks
            res.output_tokens = max(n, chunks)
            res.prompt_tokens = usage.get("prompt_tokens")
        res.ok = True


def _count_words(choice: dict) -> int:
    text = choice.get("text")
    if text is None:
        text = (choice.get("message") or {}).get("content") or ""
    return len(text.split())


def _connect_message(exc: aiohttp.ClientConnectorError) -> str:
    os_err = getattr(exc, "os_error", None)
    reason = getattr(os_err, "strerror", None) or str(os_err or exc)
    return f"cannot connect to {exc.host}:{exc.port}: {reason}"[:300]


def make_session(max_connections: int = 0, request_timeout: float = 600.0,
                 headers: dict | None = None) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ttl_dns_cache=300,
                                     keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=request_timeout)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers,
                                 skip_auto_headers=("User-Agent",), auto_decompress=False)


@dataclass
class ServerInfo:
    """What the server says about itself before the run."""

    model: str
    models: list[str] = field(default_factory=list)
    max_model_len: int | None = None  # vLLM: /v1/models; llama.cpp: /props n_ctx per slot
    owned_by: str | None = None


async def discover(session: aiohttp.ClientSession, base_url: str, model: str | None,
                   timeout: float = 10.0) -> ServerInfo:
    """GET /v1/models: the model name (first one unless --model), and max_model_len where the server says it.

    An unreachable server or a URL that is not an OpenAI-compatible server is a UsageError (exit 2)."""
    url = base_url + "/v1/models"
    to = aiohttp.ClientTimeout(total=timeout)
    try:
        async with session.get(url, timeout=to) as resp:
            status = resp.status
            body = await resp.read()
    except aiohttp.ClientConnectorError as exc:
        raise UsageError(f"cannot reach {base_url}: {_connect_message(exc)}") from None
    except asyncio.TimeoutError:
        raise UsageError(f"cannot reach {base_url}: no answer to GET /v1/models within {timeout:g} s") from None
    except aiohttp.ClientError as exc:
        raise UsageError(f"cannot reach {base_url}: {type(exc).__name__}: {exc}") from None
    entries: list[dict] = []
    if status == 200:
        try:
            obj = json.loads(body)
            entries = [e for e in obj.get("data", []) if isinstance(e, dict) and e.get("id")]
        except (ValueError, AttributeError):
            entries = []
    if status in (401, 403):
        raise UsageError(f"{url} answered HTTP {status}: set the API key (--api-key-env names the variable)")
    if not entries and not model:
        what = f"HTTP {status}" if status != 200 else "no models"
        raise UsageError(f"{url} answered {what}: is this an OpenAI-compatible server? "
                         "(give --model NAME if it has no /v1/models)")
    names = [str(e["id"]) for e in entries]
    if model and names and model not in names:
        raise UsageError(f"model {model!r} is not served at {base_url} (it serves: {', '.join(names)})")
    chosen = model or names[0]
    entry = next((e for e in entries if e.get("id") == chosen), {})
    info = ServerInfo(model=chosen, models=names, owned_by=entry.get("owned_by"))
    mml = entry.get("max_model_len")
    if isinstance(mml, int) and mml > 0:
        info.max_model_len = mml
    else:
        info.max_model_len = await _llamacpp_ctx(session, base_url)
    return info


async def _llamacpp_ctx(session: aiohttp.ClientSession, base_url: str) -> int | None:
    """llama.cpp's /props: default_generation_settings.n_ctx is the context of one slot."""
    try:
        async with session.get(base_url + "/props", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                return None
            obj = json.loads(await resp.read())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    dgs = obj.get("default_generation_settings") or {}
    n = dgs.get("n_ctx") or obj.get("n_ctx")
    return int(n) if isinstance(n, (int, float)) and n > 0 else None


async def count_tokens(session: aiohttp.ClientSession, base_url: str, model: str, text: str) -> int | None:
    """The server's own token count for text, through /tokenize (vLLM and llama.cpp); None when absent."""
    payload = {"model": model, "prompt": text, "content": text, "add_special_tokens": False}
    try:
        async with session.post(base_url + "/tokenize", json=payload,
                                timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status != 200:
                return None
            obj = json.loads(await resp.read())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    if isinstance(obj.get("count"), int):
        return obj["count"]
    tokens = obj.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None
