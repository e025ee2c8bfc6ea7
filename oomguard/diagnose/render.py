"""How a Diagnosis looks: rich panels with the fix first, or one JSON object (the issue-4 contract)."""

from __future__ import annotations

import json
import sys

from oomguard.diagnose.model import Diagnosis, Finding

_FACT_ORDER = ("engine", "vllm_version", "model", "gpu_name", "total_gpu_memory_gib", "gpu_count", "dtype",
               "quantization", "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size",
               "data_parallel_size", "max_model_len", "gpu_memory_utilization", "max_num_seqs",
               "max_num_batched_tokens", "enforce_eager", "enable_prefix_caching", "attention_backend", "weights_gib",
               "activation_peak_gib", "non_torch_gib", "cuda_graph_gib", "available_kv_gib", "kv_cache_tokens",
               "num_gpu_blocks", "max_concurrency", "serve_command", "n_ctx", "n_ctx_slot", "n_parallel", "n_ctx_train", "gpu_layers_offloaded", "model_layers",
               "gpu_free_gib", "memory_required_gib", "gpu_required_gib", "host_ram_free_gib", "host_swap_free_gib",
               "kv_usage", "running", "waiting", "preemptions_total", "prefix_cache_hit_rate", "samples", "window_s")


def print_json(diagnosis: Diagnosis, out=None) -> None:
    out = out or sys.stdout
    json.dump(diagnosis.to_dict(), out, indent=2, default=str)
    out.write("\n")


def _finding_panel(finding: Finding, index: int):
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    body = Table.grid(padding=(0, 1))
    body.add_column(no_wrap=True)
    body.add_column()
    if finding.fixes:
        fix_text = Text()
        for i, fix in enumerate(finding.fixes, 1):
            fix_text.append(f"{i}. ", style="bold")
            fix_text.append(fix.render(), style="bold green" if i == 1 else "green")
            fix_text.append(f"  {fix.reason}\n", style="dim")
        body.add_row(Text("fix", style="bold"), fix_text)
    if finding.command:
        body.add_row(Text("run", style="bold"), Text(finding.command, style="bold cyan"))
    body.add_row(Text("cause", style="bold"), Text(finding.summary))
    for note in finding.notes:
        body.add_row(Text("note", style="bold"), Text(note, style="yellow"))
    if finding.evidence:
        ev = Text()
        for e in finding.evidence:
            where = f"{e.file}:{e.line}" if e.file not in ("-", "metrics") else (f"{e.line}" if e.line else "")
            ev.append(f"{where:>8} " if where else "", style="dim")
            ev.append(e.text.strip()[:240] + "\n", style="dim")
        body.add_row(Text("evidence", style="bold"), ev)
    title = f"[bold]{index}. {finding.cls}[/] (confidence {finding.confidence:.2f})"
    style = "red" if index == 1 else "yellow"
    return Panel(body, title=title, title_align="left", border_style=style)


def print_human(diagnosis: Diagnosis, console=None) -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    console = console or Console()
    if diagnosis.findings:
        for i, finding in enumerate(diagnosis.findings, 1):
            console.print(_finding_panel(finding, i))
    else:
        console.print("[bold green]No problem found.[/] Nothing in the input matches a known failure.")
    facts = diagnosis.facts
    shown = [(k, facts[k]) for k in _FACT_ORDER if k in facts and facts[k] is not None]
    if shown:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for key, value in shown:
            table.add_row(key, f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value))
        console.print(Panel(table, title="startup summary" if "samples" not in facts else "metrics",
                            title_align="left", border_style="blue"))
    for row in facts.get("comparison", []):
        if row["differs"]:
            console.print(f"[yellow]measured vs planner:[/] {row['what']} measured {row['measured']}, "
                          f"predicted {row['predicted']}")
    for warning in facts.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}")
    planner = facts.get("planner", "ok")
    if planner != "ok" and diagnosis.findings and not any(planner in f.notes for f in diagnosis.findings):
        console.print(f"[dim]{facts['planner']}[/]")
