"""`oomguard serve --status URL`: the state of a running serve, as text or JSON."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from oomguard.errors import UsageError


def fetch_status(url: str, timeout: float = 5.0) -> dict:
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    if not url.endswith("/status"):
        url += "/status"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            data = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise UsageError(f"cannot read serve's status at {url}: {getattr(exc, 'reason', exc)}") from None
    if not isinstance(data, dict) or "state" not in data:
        raise UsageError(f"{url} did not answer with serve's status")
    return data


def render(data: dict) -> str:
    req = data.get("requests", {})
    lines = [f"state:     {data['state']}",
             f"engine:    {' '.join(data.get('engine_command', []))}",
             f"proxy:     {data.get('proxy_url', '-')}   queue {data.get('queue_length', 0):g}",
             f"requests:  ok {req.get('ok', 0)}, rejected {req.get('rejected', 0)}, failed {req.get('failed', 0)}"]
    for g in data.get("gpu_memory", []):
        lines.append(f"gpu {g['index']}:     {g['name']} {g['used_bytes'] / 2**30:.2f} / {g['total_bytes'] / 2**30:.2f} "
                     f"GiB used")
    restarts = data.get("restarts", [])
    lines.append(f"restarts:  {len(restarts)} of at most {data.get('max_restarts', '?')}")
    for i, r in enumerate(restarts, 1):
        changed = {k: v for k, v in r["flags_after"].items() if r["flags_before"].get(k) != v}
        ready = f"ready in {r['seconds_to_ready']:.1f} s" if r.get("seconds_to_ready") is not None else "not ready"
        lines.append(f"  {i}. {r['cause']} {r.get('finding_class') or '-'}: {changed or 'same configuration'}; {ready}")
    return "\n".join(lines)


def print_status(url: str, as_json: bool) -> int:
    data = fetch_status(url)
    print(json.dumps(data, indent=2) if as_json else render(data))
    return 0
