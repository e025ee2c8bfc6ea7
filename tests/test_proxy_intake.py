"""The proxy's request intake (oomguard/proxy/intake.py) on its own: no server, no engine."""

from __future__ import annotations

import asyncio
import json

import pytest

from oomguard.proxy.admission import Priority
from oomguard.proxy.http import RequestTimeout
from oomguard.proxy.intake import Intake, Refusal, RequestIntake
from oomguard.proxy.server import ProxyServer
from oomguard.proxy.tokens import TokenCounter

JSON = {"content-type": "application/json"}


def body(**fields) -> bytes:
    return json.dumps({"model": "m", "prompt": "Hello", **fields}).encode()


def refusal(call) -> Refusal:
    with pytest.raises(Refusal) as caught:
        call()
    return caught.value


# ----------------------------------------------------------------------------- who is asking
def test_keys_in_either_header_and_none_without_keys() -> None:
    intake = RequestIntake(("k-one", "k-two"))
    assert intake.authorized({"authorization": "Bearer k-two"})
    assert intake.authorized({"authorization": "bearer  k-one "})
    assert intake.authorized({"x-api-key": "k-one"})
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "k-one"}, {"x-api-key": ""}):
        assert not intake.authorized(headers), headers
        r = refusal(lambda: intake.authenticate(headers))
        assert (r.status, r.kind, r.reason, r.metric) == (401, "AuthenticationError", "unauthorized", "unauthorized")
        assert r.message == "Invalid or missing API key."
    RequestIntake().authenticate({})   # no keys configured: everyone is let in


# ----------------------------------------------------------------------------- the body
class _Body:
    """Request.body() as the HTTP server gives it: the bytes, None past the limit, or RequestTimeout."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.limits: list[int] = []

    async def body(self, limit: int):
        self.limits.append(limit)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_body_over_the_limit_is_413_and_a_late_one_408() -> None:
    intake = RequestIntake(max_body_bytes=4096, body_timeout=1.5)
    req = _Body(None)
    r = refusal(lambda: asyncio.run(intake.read_body(req)))
    assert (r.status, r.kind, r.reason, r.metric) == (413, "RequestEntityTooLargeError", "body_too_large",
                                                     "body_too_large")
    assert r.message == "The request body is larger than the proxy's limit of 4096 bytes." and req.limits == [4096]
    r = refusal(lambda: asyncio.run(intake.read_body(_Body(RequestTimeout()))))
    assert (r.status, r.reason, r.metric) == (408, "body_timeout", "body_timeout")
    assert r.message == "The request body did not arrive within 1.5 s."
    assert asyncio.run(intake.read_body(_Body(b"{}"))) == b"{}"


# ----------------------------------------------------------------------------- JSON
def test_malformed_deep_and_non_object_json_are_400() -> None:
    intake = RequestIntake()
    deep = refusal(lambda: intake.parse(JSON, "/v1/completions", b"[" * 100_000 + b"]" * 100_000))
    assert (deep.status, deep.reason, deep.metric) == (400, "malformed_json", "bad_request")
    assert deep.message == "Malformed JSON in the request body: nested too deeply"
    cut = refusal(lambda: intake.parse(JSON, "/v1/completions", b'{"prompt": "x",'))
    assert cut.status == 400 and cut.message.startswith("Malformed JSON in the request body: ")
    array = refusal(lambda: intake.parse(JSON, "/v1/chat/completions", b"[1, 2]"))
    assert array.status == 400 and array.message == "The request body must be a JSON object."
    # the guarded routes parse whatever the content type says; other routes only JSON, and only an object counts
    assert refusal(lambda: intake.parse({}, "/v1/completions/", b"nope")).reason == "malformed_json"
    other = intake.parse({"content-type": "text/plain"}, "/v1/tokenize", b"nope")
    assert other.payload is None and not other.guarded and other.body == b"nope"
    listed = intake.parse({"content-type": "Application/JSON; charset=utf-8"}, "/v1/tokenize", b"[1]")
    assert listed.payload == [1] and listed.model is None and listed.prompt_tokens == 0


def test_a_refusal_answers_in_the_proxy_error_format() -> None:
    r = refusal(lambda: RequestIntake().parse({"x-priority": "urgent"}, "/v1/completions", body()))
    assert json.loads(ProxyServer._error(r.status, r.message, r.kind, param=r.param).body) == r.error()
    assert r.error() == {"error": {"message": "x-priority must be one of high, normal, low (got 'urgent')",
                                   "type": "BadRequestError", "param": "x-priority", "code": 400}}


# ----------------------------------------------------------------------------- priority
@pytest.mark.parametrize("given, expected", [
    (None, Priority.NORMAL), ("high", Priority.HIGH), (" LOW ", Priority.LOW), ("normal", Priority.NORMAL),
    ("", Priority.NORMAL),
])
def test_priority_header(given, expected) -> None:
    headers = dict(JSON) if given is None else {**JSON, "x-priority": given}
    notes: dict = {}
    got = RequestIntake().parse(headers, "/v1/completions", body(), notes=notes)
    assert got.priority is expected and notes["priority"] == expected.name.lower()


def test_an_unknown_priority_is_refused_before_the_body_is_read_as_json() -> None:
    r = refusal(lambda: RequestIntake().parse({"x-priority": "urgent"}, "/v1/completions", b"not json"))
    assert (r.status, r.reason, r.metric, r.param) == (400, "bad_priority", "bad_request", "x-priority")


# ----------------------------------------------------------------------------- tokens and the cap
def test_prompt_tokens_counted_and_the_request_described() -> None:
    notes: dict = {}
    got = RequestIntake().parse(JSON, "/v1/completions", body(prompt="x" * 80, stream=True), notes=notes)
    assert isinstance(got, Intake) and got.guarded and got.path == "/v1/completions"
    assert got.prompt_tokens == 10   # no tokenizer: one token per 8 bytes at least
    assert (got.model, got.stream, got.payload["prompt"]) == ("m", True, "x" * 80)
    assert notes == {"priority": "normal", "model": "m", "stream": True}
    exact = RequestIntake(counter=TokenCounter(encode=lambda text: len(text.split())))
    chat = {"model": "m", "messages": [{"role": "user", "content": "one two three"}]}
    assert exact.parse(JSON, "/v1/chat/completions", json.dumps(chat).encode()).prompt_tokens == 3
    raw = body(model=7)
    unchanged = RequestIntake().parse(JSON, "/v1/completions", raw)
    assert unchanged.body is raw and unchanged.model is None   # a model that is not a string is no model


def test_max_tokens_cap() -> None:
    intake = RequestIntake(max_tokens_cap=64)
    notes: dict = {}
    over = intake.parse(JSON, "/v1/completions", body(max_tokens=1000), notes=notes)
    assert json.loads(over.body)["max_tokens"] == 64 and notes["max_tokens_capped"] == 64
    unset = intake.parse(JSON, "/v1/completions", body())
    assert json.loads(unset.body)["max_tokens"] == 64   # unset means "up to the context": capped too
    both = json.loads(intake.parse(JSON, "/v1/chat/completions", json.dumps(
        {"messages": [], "max_completion_tokens": 500, "max_tokens": 100}).encode()).body)
    assert (both["max_completion_tokens"], both["max_tokens"]) == (64, 64)
    under = body(max_tokens=10)
    assert intake.parse(JSON, "/v1/completions", under).body is under   # within the cap: forwarded as sent
    embed = json.dumps({"model": "m", "input": "x"}).encode()
    assert intake.parse(JSON, "/v1/embeddings", embed).body is embed   # embeddings generate nothing


def test_a_prompt_that_cannot_fit_the_context_gets_vllms_message() -> None:
    intake = RequestIntake()
    long = body(prompt="word " * 2000, max_tokens=10)
    r = refusal(lambda: intake.parse(JSON, "/v1/completions", long, 512))
    assert (r.status, r.kind, r.reason, r.metric) == (400, "BadRequestError", "context_length", "context_length")
    assert r.message.startswith("This model's maximum context length is 512 tokens. However, you requested 10 "
                                "output tokens and your prompt contains at least 1250")
    assert intake.parse(JSON, "/v1/completions", long).prompt_tokens == 1250   # no limit known: not checked
    assert intake.parse(JSON, "/v1/completions", body(max_tokens=10), 512).prompt_tokens == 1
