"""`oomguard diagnose --metrics URL [--watch SECONDS]`: rules over a live Prometheus endpoint.

Metric names are normalised per engine and version by `oomguard.metrics.parse_metrics` (vLLM old and new names,
llama.cpp `llama-server --metrics`, SGLang). One scrape gives the state (KV pressure, prefix-cache hit rate,
queue share of TTFT since start); a watch window adds trends (preemptions rising, queue growing, memory growing)
and rates over the window instead of since start.
"""

from __future__ import annotations

import asyncio
import math
import time

from oomguard.diagnose.model import Diagnosis, Finding, Fix
from oomguard.errors import UsageError
from oomguard.metrics import EngineSample, MetricsParseError, parse_metrics, read_page

KV_PRESSURE = 0.90
LOW_HIT_RATE = 0.30
MIN_PREFIX_QUERIES = 1000      # tokens looked up before a hit rate means anything
QUEUE_SHARE = 0.5              # queue time / TTFT above which the queue dominates TTFT
MIN_TTFT_S = 0.05
# gauges of used memory that may sit on the same page (DCGM exporter, nvidia_gpu_exporter, process metrics)
MEMORY_GAUGES = (("DCGM_FI_DEV_FB_USED", 1 << 20, "GPU framebuffer"), ("nvidia_smi_memory_used_bytes", 1, "GPU"),
                 ("process_resident_memory_bytes", 1, "host (server process)"))


async def _fetch(url: str, timeout: float) -> str:
    import aiohttp
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(url) as response:
                if response.status != 200:
                    raise UsageError(f"{url} answered HTTP {response.status}; point --metrics at the server's "
                                     "/metrics page (vLLM: http://HOST:8000/metrics; llama-server needs --metrics)")
                try:
                    return await read_page(response)
                except MetricsParseError as exc:
                    raise UsageError(f"{url}: {exc}") from None
    except UsageError:
        raise
    except asyncio.TimeoutError:
        raise UsageError(f"{url} did not answer within {timeout:g} s") from None
    except Exception as exc:  # aiohttp.ClientError, InvalidURL, OSError ...
        raise UsageError(f"cannot read {url}: {type(exc).__name__}: {exc}".rstrip(": ")) from None


def metrics_url(url: str) -> str:
    """The /metrics page of a server given by its base URL (http://host:8000, .../v1) or by the page itself."""
    from yarl import URL

    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--metrics takes an http(s) URL, not {url!r} (e.g. http://localhost:8000/metrics)")
    try:
        parsed = URL(url)
    except ValueError as exc:
        raise UsageError(f"--metrics {url!r} is not a URL ({exc})") from None
    path = parsed.path.rstrip("/")
    if path.endswith("/metrics"):
        return url
    if path in ("", "/v1"):   # the server's root or its OpenAI base: vLLM, SGLang and llama-server serve /metrics
        return str(parsed.with_path("/metrics").with_query(None))
    return url


def scrape(url: str, timeout: float = 10.0) -> EngineSample:
    url = metrics_url(url)
    text = asyncio.run(_fetch(url, timeout))
    try:
        sample = parse_metrics(text)
    except MetricsParseError as exc:
        raise UsageError(f"{url} is not a Prometheus metrics page ({exc})") from None
    if sample.engine == "unknown" and not sample.raw:
        raise UsageError(f"{url} has no metrics on it")
    return sample


def watch(url: str, seconds: float, interval: float | None = None, timeout: float = 10.0,
          sleep=time.sleep, clock=time.monotonic) -> tuple[list[tuple[float, EngineSample]], str | None]:
    """Scrape at t=0 and every `interval` seconds until `seconds` have passed (at least two samples); with why the
    watch ended early, when the server stopped answering (the samples taken until then are kept)."""
    interval = interval or max(0.5, min(5.0, seconds / 10))
    start = clock()
    samples = [(0.0, scrape(url, timeout))]
    while True:
        elapsed = clock() - start
        if elapsed >= seconds and len(samples) >= 2:
            break
        sleep(max(0.0, min(interval, seconds - elapsed) if elapsed < seconds else interval))
        try:
            samples.append((clock() - start, scrape(url, timeout)))
        except UsageError as exc:   # the server went away mid-watch: what was seen stays, and says so
            return samples, f"{exc} after {clock() - start:.0f} s"
    return samples, None


# -- rules -------------------------------------------------------------------------------------------------------
def _delta(first: EngineSample, last: EngineSample, name: str) -> float | None:
    a, b = getattr(first, name), getattr(last, name)
    if a is None or b is None:
        return None
    return b - a if b >= a else b  # a counter reset (server restart): count from zero


def _kv_tokens(sample: EngineSample) -> int | None:
    cfg = sample.cache_config
    try:
        blocks, size = int(float(cfg.get("num_gpu_blocks", ""))), int(float(cfg.get("block_size", "")))
        return blocks * size if blocks > 0 and size > 0 else None
    except ValueError:
        return None


def _tokens_per_request(first: EngineSample, last: EngineSample) -> float | None:
    done = _delta(first, last, "requests_success_total") if first is not last else last.requests_success_total
    prompt = _delta(first, last, "prompt_tokens_total") if first is not last else last.prompt_tokens_total
    gen = _delta(first, last, "generation_tokens_total") if first is not last else last.generation_tokens_total
    if not done or prompt is None or gen is None:
        if first is not last:
            return _tokens_per_request(last, last)
        return None
    return (prompt + gen) / done


def _capacity_fixes(first: EngineSample, last: EngineSample) -> list[Fix]:
    fixes: list[Fix] = []
    kv_tokens, per_request = _kv_tokens(last), _tokens_per_request(first, last)
    if kv_tokens and per_request:
        fit = max(1, int(kv_tokens // per_request))
        fixes.append(Fix(f"the KV cache holds {kv_tokens:,} tokens and a request averages {per_request:,.0f} "
                         f"(prompt + output): about {fit} fit at once", "--max-num-seqs", fit))
    util = last.cache_config.get("gpu_memory_utilization")
    try:
        util_value = float(util) if util else None
    except ValueError:
        util_value = None
    if util_value and util_value < 0.92:
        fixes.append(Fix("more of the GPU for the KV cache, if nothing else runs on it", "--gpu-memory-utilization",
                         0.92))
    if last.cache_config.get("cache_dtype", "auto") == "auto" and last.engine == "vllm":
        fixes.append(Fix("an fp8 KV cache holds twice the tokens", "--kv-cache-dtype", "fp8"))
    fixes.append(Fix("more replicas or GPUs add KV capacity; admission control keeps the excess queued outside",
                     action="add a replica (--data-parallel-size) or put `oomguard proxy` in front"))
    return fixes


def metric_findings(samples: list[tuple[float, EngineSample]], stopped: str | None = None) -> list[Finding]:
    findings: list[Finding] = []
    first, last = samples[0][1], samples[-1][1]
    window = samples[-1][0] - samples[0][0]
    span = f" over {window:.0f} s" if window > 0 else ""

    def evidence(text: str) -> list:
        from oomguard.diagnose.model import EvidenceLine
        return [EvidenceLine(0, text, "metrics")]

    # KV pressure: nearly full with requests waiting
    worst = max(samples, key=lambda s: (s[1].kv_usage or 0.0))
    sample = worst[1]
    if sample.kv_usage is not None and sample.kv_usage >= KV_PRESSURE and (sample.waiting or 0) > 0:
        findings.append(Finding("kv_pressure", 0.9, f"The KV cache is {sample.kv_usage:.0%} full with "
                                f"{sample.waiting:.0f} requests waiting: the server is out of KV capacity.",
                                evidence(f"kv_usage={sample.kv_usage:.3f} running={sample.running} "
                                         f"waiting={sample.waiting}"), _capacity_fixes(first, last)))
    # preemptions rising
    if len(samples) > 1:
        rise = _delta(first, last, "preemptions_total")
        if rise and rise > 0:
            findings.append(Finding("preemptions_rising", 0.85, f"{rise:.0f} requests were preempted{span}: vLLM "
                                    "evicts running requests when the KV cache runs out and recomputes them later.",
                                    evidence(f"num_preemptions_total {first.preemptions_total} -> "
                                             f"{last.preemptions_total}"), _capacity_fixes(first, last)))
    elif last.preemptions_total:
        findings.append(Finding("preemptions_rising", 0.5, f"{last.preemptions_total:.0f} preemptions since the "
                                "server started (watch with --watch to see whether they are still rising).",
                                evidence(f"num_preemptions_total {last.preemptions_total}"),
                                _capacity_fixes(first, last)))
    # queue growing
    waits = [s.waiting for _, s in samples if s.waiting is not None]
    if len(waits) >= 3 and waits[-1] > waits[0] and all(b >= a for a, b in zip(waits, waits[1:])) and waits[-1] >= 2:
        findings.append(Finding("queue_growing", 0.8, f"The waiting queue grew from {waits[0]:.0f} to "
                                f"{waits[-1]:.0f}{span}: requests arrive faster than the server finishes them.",
                                evidence("waiting: " + " -> ".join(f"{w:.0f}" for w in waits[:12])),
                                _capacity_fixes(first, last)))
    # prefix cache that does not pay
    enabled = str(last.cache_config.get("enable_prefix_caching", "")).lower() == "true"
    if len(samples) > 1 and last.prefix_cache_queries_total is not None:
        queries = _delta(first, last, "prefix_cache_queries_total")
        hits = _delta(first, last, "prefix_cache_hits_total") or 0.0
        rate = hits / queries if queries else None
    else:
        queries, rate = last.prefix_cache_queries_total, last.hit_rate
    if rate is None and last.prefix_cache_hit_rate is not None:
        rate, queries = last.prefix_cache_hit_rate, MIN_PREFIX_QUERIES
    if enabled and rate is not None and (queries or 0) >= MIN_PREFIX_QUERIES and rate < LOW_HIT_RATE:
        findings.append(Finding("prefix_cache_low_hit_rate", 0.7, f"Prefix caching is on but only {rate:.0%} of "
                                f"prompt tokens hit the cache{span}: the bookkeeping costs more than it saves.",
                                evidence(f"prefix cache hits/queries = {rate:.3f} over {queries:,.0f} tokens"),
                                [Fix("this workload shares few prefixes", "--no-enable-prefix-caching", True)]))
    # memory growing across the window
    if len(samples) >= 4:
        for name, scale, label in MEMORY_GAUGES:
            series = [s.raw.get(name) for _, s in samples]
            if any(v is None for v in series):
                continue
            growth = (series[-1] - series[0]) * scale
            if all(b >= a for a, b in zip(series, series[1:])) and growth > max(64 << 20, 0.01 * series[0] * scale):
                findings.append(Finding("memory_growing", 0.7, f"{label} memory grew on every scrape{span} "
                                        f"(+{growth / (1 << 20):,.0f} MiB): a leak, or a cache without a bound.",
                                        evidence(f"{name}: {series[0]:,.0f} -> {series[-1]:,.0f}"),
                                        [Fix("a leak grows until the process dies",
                                             action="watch longer (--watch 600); if it keeps growing, restart on a "
                                                    "schedule and report it with the engine version")]))
                break
    # every slot busy and requests deferred (engines without a KV gauge: llama-server's -np slots)
    if sample.kv_usage is None and not any(f.cls == "kv_pressure" for f in findings):
        deferred = max(samples, key=lambda s: s[1].waiting or 0.0)[1]
        if (deferred.waiting or 0) > 0:
            findings.append(Finding("queue_growing", 0.8, f"All {deferred.running or 0:.0f} busy slots are full and "
                                    f"{deferred.waiting:.0f} requests are deferred: the server takes no more requests "
                                    "at once than it has slots.", evidence(f"requests_processing={deferred.running} "
                                                                           f"requests_deferred={deferred.waiting}"),
                                    _slot_fixes(deferred)))
    # TTFT dominated by queueing
    def mean(sum_name: str, count_name: str) -> float | None:
        if len(samples) > 1:
            total, count = _delta(first, last, sum_name), _delta(first, last, count_name)
        else:
            total, count = getattr(last, sum_name), getattr(last, count_name)
        return total / count if total is not None and count else None
    ttft, queue = mean("ttft_seconds_sum", "ttft_seconds_count"), mean("queue_seconds_sum", "queue_seconds_count")
    # one scrape gives averages since the server started: they speak of now only while requests are in flight
    busy_now = len(samples) > 1 or (last.running or 0) + (last.waiting or 0) > 0
    if ttft and queue is not None and ttft >= MIN_TTFT_S and queue / ttft >= QUEUE_SHARE and busy_now:
        findings.append(Finding("ttft_queue_bound", 0.75, f"Requests wait {queue:.2f} s of their {ttft:.2f} s time "
                                f"to first token in the queue ({queue / ttft:.0%}){span}: the server is saturated, "
                                "not slow at prefill.", evidence(f"mean queue {queue:.3f} s, mean TTFT {ttft:.3f} s"),
                                _capacity_fixes(first, last)))
    if stopped:
        findings.append(Finding("server_stopped", 0.9, f"The server stopped answering /metrics during the watch "
                                f"({stopped}): it crashed, hung or was stopped; the figures before it are above.",
                                evidence(str(stopped)), [Fix("the server's own log says why it stopped",
                                                             action="run oomguard diagnose on the server's log")]))
    findings.sort(key=lambda f: -f.confidence)
    shown: set = set()
    for finding in findings:   # the capacity fixes several findings share are printed once, with the first
        fresh = [f for f in finding.fixes if (f.flag, f.value, f.action) not in shown]
        if len(fresh) < len(finding.fixes):
            finding.notes.append("the other fixes are those of the finding above")
        shown.update((f.flag, f.value, f.action) for f in finding.fixes)
        finding.fixes = fresh
    return findings


def _slot_fixes(sample: EngineSample) -> list[Fix]:
    slots = int(sample.running or 1)
    return [Fix("more slots serve more requests at once; -c is shared by the slots, so raise it with -np to keep "
                "each slot's context", "-np", slots * 2),
            Fix("more replicas add capacity; admission control keeps the excess queued outside",
                action="add a llama-server replica or put `oomguard proxy` in front")]


def metric_facts(samples: list[tuple[float, EngineSample]]) -> dict:
    last = samples[-1][1]
    facts: dict = {"engine": last.engine, "samples": len(samples),
                   "window_s": round(samples[-1][0] - samples[0][0], 1)}
    for name in ("kv_usage", "running", "waiting", "preemptions_total", "kv_tokens"):
        value = getattr(last, name)
        if value is not None:
            facts[name] = round(value, 4) if isinstance(value, float) and not math.isnan(value) else value
    if last.hit_rate is not None:
        facts["prefix_cache_hit_rate"] = round(last.hit_rate, 4)
    for key in ("num_gpu_blocks", "block_size", "gpu_memory_utilization", "enable_prefix_caching", "cache_dtype"):
        if key in last.cache_config:
            facts[key] = last.cache_config[key]
    kv = _kv_tokens(last)
    if kv:
        facts["kv_cache_tokens"] = kv
    return facts


def diagnose_metrics(url: str, watch_seconds: float | None = None, interval: float | None = None) -> Diagnosis:
    samples, stopped = watch(url, watch_seconds, interval) if watch_seconds else ([(0.0, scrape(url))], None)
    return Diagnosis(metric_findings(samples, stopped), metric_facts(samples), 0)
