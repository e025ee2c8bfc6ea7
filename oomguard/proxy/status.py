"""`oomguard proxy --status URL`: the live state of a running proxy, as a table (or JSON)."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from oomguard.errors import UsageError


def fetch_status(url: str, api_key: str | None = None, timeout: float = 5.0) -> dict:
    base = url.rstrip("/")
    if "://" not in base:
        base = "http://" + base
    req = urllib.request.Request(base + "/oomguard/status")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - a URL the user gave
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise UsageError(f"{url} wants an API key: add --api-key KEY") from None
        raise UsageError(f"{url} answered HTTP {exc.code}; is it an oomguard proxy?") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(f"cannot reach {url}: {reason}") from None
    except ValueError:
        raise UsageError(f"{url} did not answer JSON; is it an oomguard proxy?") from None


def render_status(status: dict) -> "object":
    from rich.console import Group
    from rich.table import Table

    limits = status.get("limits", {})
    up_table = Table(title="upstreams", title_justify="left")
    for col in ("upstream", "state", "kv usage", "running", "waiting", "in flight", "metrics age", "max len",
                "admitted", "why"):
        up_table.add_column(col, justify="left" if col in ("upstream", "state", "why") else "right")
    styles = {"open": "green", "paused": "yellow", "down": "red"}
    for name, u in status.get("upstreams", {}).items():
        state = u.get("state", "?")
        up_table.add_row(
            name, f"[{styles.get(state, 'white')}]{state}[/]", _pct(u.get("kv_usage")), _num(u.get("running")),
            _num(u.get("waiting")), _num(u.get("in_flight")), _age(u.get("metrics_age_s")),
            _num(u.get("max_model_len")), _num(u.get("admitted_total")), u.get("reason") or "")
    q = status.get("queue", {})
    rejected = status.get("rejected", {})
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("queue", f"high {q.get('high', 0)}  normal {q.get('normal', 0)}  low {q.get('low', 0)}"
                             f"  (max {limits.get('max_queue', '?')}, timeout {limits.get('queue_timeout_s', '?')} s)")
    summary.add_row("watermarks", f"pause at {_pct(limits.get('high_watermark'))}, "
                                  f"resume below {_pct(limits.get('low_watermark'))}")
    summary.add_row("drain rate", f"{status.get('drain_rate_per_s', 0):.2f} req/s")
    if status.get("workers"):
        summary.add_row("workers", f"{status['workers']} (caps split between them, totals shown; "
                                   f"in flight max {limits.get('max_in_flight', '?')})")
    summary.add_row("admitted", _num(status.get("admitted")))
    summary.add_row("rejected", ", ".join(f"{k} {int(v)}" for k, v in sorted(rejected.items())) or "none")
    if status.get("token_counting"):
        summary.add_row("prompt check", status["token_counting"])
    return Group(summary, up_table)


def print_status(url: str, api_key: str | None = None, as_json: bool = False) -> int:
    status = fetch_status(url, api_key)
    if as_json:
        json.dump(status, sys.stdout, indent=2)
        print()
        return 0
    from rich.console import Console

    Console().print(render_status(status))
    return 0


def _pct(x: object) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x:.0%}" if x >= 0.1 or x == 0 else f"{x:.1%}"


def _num(x: object) -> str:
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return "-" if x is None else str(x)


def _age(x: object) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x:.1f} s"
