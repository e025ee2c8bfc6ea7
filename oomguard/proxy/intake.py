"""The proxy's request intake: who is asking (the API key), what they sent (the body within its limits, its
JSON, the x-priority header) and what it will cost (the prompt's tokens, max_tokens capped).

`RequestIntake.parse` turns a request's headers and body into an `Intake`, or raises a `Refusal` that carries the
HTTP status and the OpenAI-style error to answer with; it neither routes nor admits (server.py and admission.py
do). Everything here runs once per request, before the request is queued.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Iterable, NamedTuple

from .admission import Priority
from .http import Request, RequestTimeout
from .tokens import TokenCounter, context_error, requested_max_tokens

try:  # faster JSON when available; the stdlib otherwise
    import orjson as _orjson

    json_loads = _orjson.loads

    def json_dumps(obj: Any) -> bytes:
        return _orjson.dumps(obj)
except ImportError:  # pragma: no cover - depends on the environment
    def json_loads(data: bytes) -> Any:
        return json.loads(data)

    def json_dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

# The inference routes: their body must be a JSON object, whose prompt is counted and whose KV cost is admitted.
GUARDED = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")
PRIORITY_NAMES = {p: p.name.lower() for p in Priority}


class Intake(NamedTuple):
    """A request that passed intake. (A named tuple: made for every request, at a fraction of a dataclass's cost.)"""
    path: str            # the route, without a trailing slash
    body: bytes          # what goes to the engine: as sent, or re-encoded where the max_tokens cap changed it
    payload: Any         # the parsed JSON body (a dict on the guarded routes); None when there is none
    priority: Priority
    guarded: bool        # an inference route (GUARDED)
    model: str | None
    stream: bool
    prompt_tokens: int   # the counter's count (a lower bound without a tokenizer); 0 when not counted


class Refusal(Exception):
    """A request refused at intake: `status` and the OpenAI-style error to answer with; `reason` for the access
    log, `metric` for oomguard_proxy_rejected_total (None: not counted there)."""

    def __init__(self, status: int, message: str, kind: str, reason: str, metric: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.reason, self.metric, self.param = reason, metric, param

    def error(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


class RequestIntake:
    """The intake settings of one proxy (keys, body limits, the max_tokens cap) and its token counter."""

    def __init__(self, api_keys: Iterable[str] = (), *, max_body_bytes: int = 8 << 20, body_timeout: float = 60.0,
                 max_tokens_cap: int | None = None, counter: TokenCounter | None = None) -> None:
        # keys kept as SHA-256 digests: every comparison is between equal-length values, in constant time
        self._api_keys = tuple(hashlib.sha256(k.encode()).digest() for k in api_keys)
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.max_tokens_cap = max_tokens_cap
        self.counter = counter or TokenCounter(source="not loaded yet")   # replaced once the model is known

    # ----------------------------------------------------------------- who is asking
    def authorized(self, headers: Any) -> bool:
        """A key of ours in `Authorization: Bearer` or `x-api-key` (always, when the proxy has no keys)."""
        if not self._api_keys:
            return True
        header = headers.get("authorization") or ""
        token = header[7:].strip() if header[:7].lower() == "bearer " else headers.get("x-api-key") or ""
        given = hashlib.sha256(token.encode()).digest()
        ok = False
        for key in self._api_keys:  # every key compared, in constant time each
            ok |= hmac.compare_digest(given, key)
        return ok

    def authenticate(self, headers: Any) -> None:
        if self._api_keys and not self.authorized(headers):
            raise Refusal(401, "Invalid or missing API key.", "AuthenticationError", "unauthorized", "unauthorized")

    # ----------------------------------------------------------------- what they sent
    async def read_body(self, req: Request) -> bytes:
        """The whole body, waiting for the rest of it (`Request.body_now` first: usually it came with the head)."""
        try:
            body = await req.body(self.max_body_bytes)
        except RequestTimeout:
            raise Refusal(408, f"The request body did not arrive within {self.body_timeout:g} s.",
                          "RequestTimeoutError", "body_timeout", "body_timeout") from None
        if body is None:
            raise Refusal(413, f"The request body is larger than the proxy's limit of {self.max_body_bytes} bytes.",
                          "RequestEntityTooLargeError", "body_too_large", "body_too_large")
        return body

    def parse(self, headers: Any, path: str, body: bytes, max_model_len: int | None = None,
              notes: dict[str, Any] | None = None) -> Intake:
        """The request as admission sees it, or a Refusal. `headers` have lower-case names; `max_model_len` is
        the served context (None: unknown, no length check); `notes` collects the access log's fields."""
        notes = {} if notes is None else notes
        given = headers.get("x-priority")
        if given is None:
            priority = Priority.NORMAL
        else:
            try:
                priority = Priority.parse(given)
            except ValueError as exc:
                raise Refusal(400, str(exc), "BadRequestError", "bad_priority", "bad_request",
                              param="x-priority") from None
        notes["priority"] = PRIORITY_NAMES[priority]
        path = path.rstrip("/")
        guarded = path in GUARDED
        payload: Any = None
        if guarded or (body and (headers.get("content-type") or "").split(";", 1)[0].strip().lower()
                       == "application/json"):
            try:
                payload = json_loads(body) if body else None
            except (ValueError, RecursionError) as exc:   # a body nested deeper than the parser goes is malformed too
                deep = isinstance(exc, RecursionError) or "depth limit" in str(exc)  # the stdlib's, orjson's
                raise Refusal(400, f"Malformed JSON in the request body: {'nested too deeply' if deep else exc}",
                              "BadRequestError", "malformed_json", "bad_request") from None
            if guarded and not isinstance(payload, dict):
                raise Refusal(400, "The request body must be a JSON object.", "BadRequestError", "malformed_json",
                              "bad_request")
        model = None
        stream = False
        prompt_tokens = 0
        if isinstance(payload, dict):
            model = payload.get("model")
            if not isinstance(model, str):
                model = None
            stream = payload.get("stream") is True
            notes["model"] = model
            notes["stream"] = stream
            if guarded:
                body, prompt_tokens = self._count_and_cap(path, payload, body, max_model_len, notes)
        return Intake(path, body, payload, priority, guarded, model, stream, prompt_tokens)

    # ----------------------------------------------------------------- what it will cost
    def _count_and_cap(self, path: str, payload: dict, body: bytes, limit: int | None,
                       notes: dict[str, Any]) -> tuple[bytes, int]:
        """Cap max_tokens (the body re-encoded when it changed), then refuse a prompt that cannot fit `limit`."""
        counted = self.counter.count_prompt(payload, path)
        embeddings = path.endswith("/embeddings")
        cap = self.max_tokens_cap
        if cap is not None and not embeddings:
            changed = False
            for key in ("max_tokens", "max_completion_tokens"):
                value = payload.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                    payload[key] = cap
                    changed = True
            if requested_max_tokens(payload) is None:   # unset means "up to the context": the cap applies
                payload["max_tokens"] = cap
                changed = True
            if changed:
                body = json_dumps(payload)
                notes["max_tokens_capped"] = cap
        if counted is not None and limit:
            message = context_error(counted, requested_max_tokens(payload), limit, self.counter.exact, embeddings)
            if message is not None:
                raise Refusal(400, message, "BadRequestError", "context_length", "context_length")
        return body, counted or 0
