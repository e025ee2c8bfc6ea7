"""The live progress display (rich, on stderr) and its plain-line fallback for logs."""

from __future__ import annotations

import sys
import time

from oomguard.loadtest.shapes import format_duration


def _fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def _fmt_frac(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"


def _g(x) -> str:
    return "n/a" if x is None else f"{x:g}"


class Progress:
    """mode: "live" (rich Live), "lines" (a line every 10 s), "off"."""

    def __init__(self, mode: str, total_label: str = ""):
        self.mode = mode
        self.live = None
        self.last_line = 0.0
        self.total_label = total_label
        self._tokens_seen = (0.0, 0)

    def __enter__(self) -> "Progress":
        if self.mode == "live":
            from rich.console import Console
            from rich.live import Live

            self.live = Live(console=Console(stderr=True), refresh_per_second=4, transient=False)
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def message(self, text: str) -> None:
        if self.mode == "off":
            return
        if self.live is not None:
            self.live.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def tick(self, runner, st, vals: dict) -> None:
        if self.mode == "off":
            return
        now = runner.now()
        elapsed = now - st.t_start
        duration = st.deadline - st.t_start
        window = [r for r in st.results[-2000:] if r.end >= now - 5.0]
        rps = sum(1 for r in window if r.ok) / 5.0 if elapsed >= 5 else st.ok / max(elapsed, 1e-9)
        total = runner.client.tokens_received
        last_t, last_n = self._tokens_seen
        tok = (total - last_n) / (now - last_t) if now > last_t else 0.0
        if now - last_t >= 2.0:
            self._tokens_seen = (now, total)
        fields = [
            ("stage", f"{st.index + 1}: {st.load.label()}"),
            ("time", f"{format_duration(round(elapsed))} / {format_duration(duration)}"
                     + ("  (draining)" if st.stopping else "")),
            ("requests", f"{st.ok} ok, {st.errors} errors, {st.in_flight} in flight"),
            ("throughput", f"{rps:.1f} req/s, {tok:.0f} output tok/s"),
            ("TTFT (10 s)", f"p50 {_fmt_ms(vals.get('p50_ttft'))}, p99 {_fmt_ms(vals.get('p99_ttft'))}"),
            ("server", f"KV {_fmt_frac(vals.get('kv'))}, running {_g(vals.get('running'))}, "
                       f"waiting {_g(vals.get('waiting'))}, preemptions {_g(vals.get('preemptions'))}"),
        ]
        if vals.get("gpu_used_bytes") is not None:
            fields.append(("GPU memory", f"{vals['gpu_used_bytes'] / 2**30:.2f} / "
                                         f"{(vals.get('gpu_total_bytes') or 0) / 2**30:.2f} GiB"))
        if self.live is not None:
            from rich.table import Table

            t = Table.grid(padding=(0, 2))
            t.add_column(style="bold cyan")
            t.add_column()
            for k, v in fields:
                t.add_row(k, v)
            self.live.update(t)
        elif time.monotonic() - self.last_line >= 10.0:
            self.last_line = time.monotonic()
            print("loadtest: " + "; ".join(f"{k} {v}" for k, v in fields), file=sys.stderr, flush=True)
