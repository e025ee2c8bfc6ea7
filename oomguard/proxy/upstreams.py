"""Upstream engines: their addresses, and the pollers that feed the admission controller.

Each poller scrapes `/metrics` every interval (names normalised by `oomguard.metrics.parse_metrics`, so vLLM
old and new, SGLang and llama.cpp all read the same) and re-learns `/v1/models` (model ids, `max_model_len`)
whenever the upstream (re)appears. An engine with no metrics page (llama-server without `--metrics`) is
polled on `/health` instead and admitted by the in-flight cap alone; the log says so.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

import aiohttp

from oomguard.errors import UsageError
from oomguard.metrics import MetricsParseError, parse_metrics, read_page

from .admission import AdmissionController, State, Ticket

log = logging.getLogger("oomguard.proxy")

MODELS_REFRESH_S = 30.0


@dataclass(frozen=True)
class UpstreamAddress:
    name: str  # host:port, unique
    base: str  # scheme://host:port[/prefix] without a trailing slash or /v1


_HOSTNAME = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+(?:%[\w.-]+)?")   # a DNS name or IPv4; an IPv6 literal


def parse_upstream(url: str) -> UpstreamAddress:
    raw = url.strip()
    if "://" not in raw:
        raw = "http://" + raw
    shown = url if len(url) <= 200 else url[:200] + "..."
    try:
        parts = urlsplit(raw)
        hostname = parts.hostname   # parsed here: a malformed IPv6 literal raises
    except ValueError:
        raise UsageError(f"--upstream must be an http(s) URL like http://127.0.0.1:8000 (got {shown!r})") from None
    if parts.username or parts.password:   # never echoed: the error would print the password
        raise UsageError("--upstream takes a plain base URL without credentials; give the engine's key with "
                         "--upstream-api-key")
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"--upstream has an invalid port (got {shown!r})") from None
    if parts.scheme not in ("http", "https") or not hostname or any(c.isspace() for c in raw) or \
            not _HOSTNAME.fullmatch(hostname):
        raise UsageError(f"--upstream must be an http(s) URL like http://127.0.0.1:8000 (got {shown!r})")
    if parts.query or parts.fragment:
        raise UsageError(f"--upstream takes a plain base URL, without query or fragment (got {shown!r})")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    port = port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    return UpstreamAddress(name=f"{host}:{port}{path}", base=f"{parts.scheme}://{host}:{port}{path}")


def kv_usage_of(sample: Any, kv_capacity_tokens: int | None) -> float | None:
    """KV usage 0..1 from a parsed sample; llama.cpp builds without the ratio give tokens / capacity."""
    if sample.kv_usage is not None:
        return float(sample.kv_usage)
    if sample.kv_tokens is not None and kv_capacity_tokens:
        return min(1.0, float(sample.kv_tokens) / kv_capacity_tokens)
    return None


class Poller:
    """Polls one upstream forever; every good scrape goes to `controller.observe`."""

    def __init__(self, address: UpstreamAddress, controller: AdmissionController, session: aiohttp.ClientSession,
                 wake: Callable[[list[Ticket]], None], headers: dict[str, str],
                 on_recover: Callable[[str], None] | None = None) -> None:
        self.address = address
        self.controller = controller
        self.session = session
        self.wake = wake
        self.headers = headers
        self.on_recover = on_recover
        self.interval = controller.limits.poll_interval
        self.has_metrics: bool | None = None  # None until known
        self.models_at: float | None = None
        self.kv_capacity_tokens: int | None = None
        self.engine: str | None = None
        self._warned: set[str] = set()
        self._kick = asyncio.Event()

    def kick(self) -> None:
        """Poll now (after a forwarding failure) instead of at the next tick."""
        self._kick.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a poller must never die: count the upstream down and go on
                log.warning("polling %s failed unexpectedly: %r", self.address.name, exc)
                self.controller.mark_down(self.address.name, f"poll error: {exc!r}"[:200])
                self.models_at = None
            delay = max(0.0, self.interval - (loop.time() - started))
            self._kick.clear()
            try:
                await asyncio.wait_for(self._kick.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass

    async def poll_once(self) -> None:
        name = self.address.name
        timeout = aiohttp.ClientTimeout(total=max(2 * self.interval, 1.0))
        was_down = self.controller.upstreams[name].down
        try:
            kv = running = waiting = None
            if self.has_metrics is not False:
                async with self.session.get(self.address.base + "/metrics", headers=self.headers,
                                            timeout=timeout) as resp:
                    if resp.status in (404, 501) and self.has_metrics is None:
                        self.has_metrics = False
                        self._warn_once("nometrics", "%s has no /metrics page (HTTP %d): admitting by the "
                                        "in-flight cap only; start llama-server with --metrics", name, resp.status)
                    elif resp.status != 200:
                        raise _PollError(f"/metrics answered HTTP {resp.status}")
                    else:
                        text = await read_page(resp)
                        self.has_metrics = True
            if self.has_metrics is False:
                async with self.session.get(self.address.base + "/health", headers=self.headers,
                                            timeout=timeout) as resp:
                    if resp.status != 200:
                        raise _PollError(f"/health answered HTTP {resp.status}")
            if was_down or self.models_at is None or loop_time() - self.models_at > MODELS_REFRESH_S:
                await self._learn_models(timeout)
            if self.has_metrics:
                sample = parse_metrics(text)
                self.engine = sample.engine
                kv = kv_usage_of(sample, self.kv_capacity_tokens)
                running, waiting = sample.running, sample.waiting
                blocks, size = sample.cache_config.get("num_gpu_blocks"), sample.cache_config.get("block_size")
                if blocks and size and blocks.isdigit() and size.isdigit() and int(blocks) > 1:
                    self.controller.set_kv_capacity(name, (int(blocks) - 1) * int(size), int(size))
                if kv is None:
                    self._warn_once("nokv", "%s (%s) exports no KV cache usage: the watermarks cannot apply to it; "
                                    "admitting by the in-flight cap only", name, sample.engine)
        except asyncio.TimeoutError:
            if not was_down:   # a slow /metrics page is a busy engine, not a dead one: its metrics go stale, and
                # stale metrics pause it (queue) while requests already sent keep flowing
                self._warn_once("slow", "%s answered /metrics too slowly: counted as saturated until it answers",
                                name)
                return
            self.controller.mark_down(name, "timed out")
            self.models_at = None
            return
        except (aiohttp.ClientError, OSError, ValueError, MetricsParseError, _PollError) as exc:
            reason = _reason(exc)
            if not was_down:
                log.warning("upstream %s is down: %s", name, reason)
            self.controller.mark_down(name, reason)
            self.models_at = None
            return
        if was_down:
            log.info("upstream %s is up (max_model_len=%s)", name,
                     self.controller.upstreams[name].max_model_len)
            if self.on_recover is not None:
                self.on_recover(name)
        up = self.controller.upstreams[name]
        before = up.state(self.controller.clock(), self.controller.limits)
        self.wake(self.controller.observe(name, kv, running, waiting))
        after = up.state(self.controller.clock(), self.controller.limits)
        if before[0] is not after[0] and not was_down:   # pause and resume, logged as they happen
            log.info("upstream %s %s%s", name, "resumed" if after[0] is State.OPEN else "paused",
                     f": {after[1]}" if after[1] else f" (was: {before[1]})")

    async def _learn_models(self, timeout: aiohttp.ClientTimeout) -> None:
        """Model ids and the context length from /v1/models (vLLM: max_model_len; llama.cpp: meta.n_ctx,
        or /props for older servers)."""
        name = self.address.name
        ids: list[str] | None = None
        max_len: int | None = None
        async with self.session.get(self.address.base + "/v1/models", headers=self.headers,
                                    timeout=timeout) as resp:
            if resp.status != 200:
                raise _PollError(f"/v1/models answered HTTP {resp.status}")
            data = await resp.json(content_type=None)
        cards = data.get("data") if isinstance(data, dict) else None
        if isinstance(cards, list):
            ids = [c["id"] for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)]
            # vLLM/SGLang/simulate: max_model_len; llama-server: meta.n_ctx (the context of one slot)
            lens = [c.get("max_model_len") if "max_model_len" in c else
                    (c["meta"].get("n_ctx") if isinstance(c.get("meta"), dict) else None)
                    for c in cards if isinstance(c, dict)]
            lens = [x for x in lens if isinstance(x, int) and not isinstance(x, bool) and x > 0]
            if lens:
                max_len = min(lens)
        if max_len is None:
            max_len = await self._llamacpp_ctx(timeout)
        self.controller.set_models(name, ids, max_len)
        self.models_at = loop_time()
        if max_len is None:
            self._warn_once("nolen", "%s reports no context length: prompts are not length-checked for it", name)

    async def _llamacpp_ctx(self, timeout: aiohttp.ClientTimeout) -> int | None:
        """llama-server: /props has the per-slot context (`default_generation_settings.n_ctx`) and the total."""
        try:
            async with self.session.get(self.address.base + "/props", headers=self.headers,
                                        timeout=timeout) as resp:
                if resp.status != 200:
                    return None
                props = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
        if not isinstance(props, dict):
            return None
        settings = props.get("default_generation_settings")
        slot_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        total = props.get("n_ctx")
        n_slots = props.get("total_slots")
        if isinstance(total, int) and total > 0:
            self.kv_capacity_tokens = total
        elif isinstance(slot_ctx, int) and isinstance(n_slots, int) and n_slots > 0:
            self.kv_capacity_tokens = slot_ctx * n_slots
        if isinstance(slot_ctx, int) and slot_ctx > 0:
            return slot_ctx
        return total if isinstance(total, int) and total > 0 else None

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)


class _PollError(Exception):
    pass


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "poll timed out"
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:197] + "..."


def loop_time() -> float:
    return asyncio.get_running_loop().time()
