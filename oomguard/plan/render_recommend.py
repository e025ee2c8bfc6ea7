"""How a Recommendation looks: the ranked candidates, the chosen breakdown, why each flag, the commands; or
the tiering plan when nothing fits. `--format yaml|json` print one machine-readable document instead."""

from __future__ import annotations

import json
import sys

from oomguard.plan.recommend import Recommendation
from oomguard.units import GiB


def print_recommendation(rec: Recommendation, fmt: str = "table", top: int = 3) -> None:
    if fmt == "json":
        json.dump(rec.to_dict(top), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if fmt == "yaml":
        if rec.chosen is None:
            sys.stdout.write("# nothing fits: no vLLM config to write (see `oomguard plan ... --format table`)\n")
            return
        sys.stdout.write(f"# vllm serve --config FILE   (oomguard plan: {rec.result.objective}, "
                         f"p99 {rec.workload.p99_tokens} tokens x {rec.workload.peak_concurrency} concurrent)\n")
        sys.stdout.write(rec.yaml_config())
        return
    from rich.console import Console
    from rich.table import Table

    from oomguard.plan.render import print_breakdown

    console = Console()
    w = rec.workload
    console.print(f"[bold]Workload:[/] p99 {w.p99_tokens:,} tokens per request (prompt + output), "
                  f"{w.peak_concurrency} at once at peak, prefix sharing {w.prefix_sharing:.0%} -> "
                  f"{w.kv_tokens_at_peak:,} KV tokens at peak")
    for note in (*w.notes, *rec.notes):
        console.print(f"[dim]  {note}[/]")
    console.print(f"[dim]{rec.result.evaluations} configurations of {rec.model.model_id} evaluated on up to "
                  f"{rec.gpu_count} x {rec.gpu.name} with vLLM {rec.vllm_version}'s memory model; objective "
                  f"{rec.result.objective}[/]")
    feasible = rec.result.feasible
    if feasible:
        table = Table(show_edge=False, title="Configurations that serve your peak without preemption",
                      title_justify="left")
        for col in ("#", "GPUs", "checkpoint", "TP x PP", "KV", "util", "max len", "seqs", "W / KV GiB", "KV holds",
                    "tok/s"):
            table.add_column(col, justify="left" if col in ("checkpoint", "KV") else "right")
        for i, c in enumerate(feasible[:top], 1):
            f = c.config
            table.add_row(str(i), str(c.gpus), c.checkpoint.label,
                          f"{f.tensor_parallel_size} x {f.pipeline_parallel_size}",
                          f.kv_cache_dtype, f"{f.gpu_memory_utilization:.2f}",
                          f"{f.max_model_len:,}", str(f.max_num_seqs),
                          f"{c.report.first.weights_bytes / GiB:.1f} / {c.report.first.kv_cache_bytes / GiB:.1f}",
                          f"{c.held / w.peak_concurrency:.1f}x",
                          f"{c.speed.decode_tokens_per_s:,.0f}")
        console.print(table)
        for i, c in enumerate(feasible[:top], 1):
            console.print(f"  [dim]#{i}[/] {c.reason}")
        console.print("[dim]  W / KV GiB: weights and KV cache per GPU; KV holds: the KV cache's room over your peak; "
                      "tok/s: decode roofline at peak[/]\n")
        chosen = rec.chosen
        if chosen.checkpoint.other_checkpoint:
            console.print(f"[bold yellow]Note:[/] #1 serves another checkpoint: {chosen.checkpoint.model.model_id}")
        print_breakdown(console, chosen.report)
        console.print("\n[bold]Why each setting[/]")
        for setting, reason in rec.why:
            console.print(f"  [cyan]{setting}[/] {reason}")
        s = chosen.speed
        console.print(f"\n[dim]Roofline at peak ({w.peak_concurrency} requests of {w.p99_tokens:,} tokens): "
                      f"~{s.decode_tokens_per_s:,.0f} tok/s decode ({s.per_request_tokens_per_s:.1f} per request, "
                      f"{s.bound}-bound), prefill up to ~{s.prefill_tokens_per_s:,.0f} tok/s: upper bounds, no kernel "
                      "inefficiency or communication counted[/]")
        console.print("\n[bold]Launch[/]")
        console.print(rec.serve_command(), soft_wrap=True, highlight=False)
        console.print(rec.llm_kwargs(), soft_wrap=True, highlight=False)
        console.print("[dim]vLLM --config file: add --format yaml; everything: --json[/]")
        return
    _print_no_fit(console, rec)


def _print_no_fit(console, rec: Recommendation) -> None:
    nf = rec.no_fit
    console.print(f"\n[bold red]Nothing fits.[/] {nf.breaks}")
    if nf.changes:
        console.print("\n[bold]Smallest changes that would fit[/]")
        for change in nf.changes:
            console.print(f"  - {change.summary}")
    console.print("\n[bold]Tiering: run it anyway, at a price[/]")
    off = nf.offload
    if off is not None:
        flags = off.candidate.command_flags()
        from oomguard.engines.vllm.flags import format_vllm_command
        console.print(f"  vLLM weight offload: [cyan]--cpu-offload-gb {off.offload_gib_per_gpu}[/] (UVA). {off.verdict}.")
        console.print("  " + format_vllm_command(off.candidate.checkpoint.model.model_id, flags), soft_wrap=True,
                      highlight=False)
        if off.prefetch is not None:
            p = off.prefetch_flags
            console.print(f"  vLLM >= 0.17 prefetch offload overlaps the copy with compute: --offload-group-size "
                          f"{p['offload_group_size']} --offload-num-in-group {p['offload_num_in_group']} "
                          f"--offload-prefetch-step 1 -> ~{off.prefetch.per_request_tokens_per_s:.2f} tok/s per "
                          f"request (the PCIe copy, {off.prefetch.offload_seconds_per_step * 1e3:,.0f} ms a step, "
                          "still sets the pace)")
    else:
        console.print("  vLLM weight offload: none helps (the KV cache of your peak alone does not fit)")
    llama = nf.llamacpp
    if llama is not None and hasattr(llama, "summary"):
        assumed = f" (host RAM at ~{llama.speed.cpu_bandwidth_bytes_per_s / 1e9:.0f} GB/s assumed)" if llama.speed else ""
        console.print(f"  llama.cpp: {llama.summary()}{assumed}")
        if hasattr(llama, "command"):
            console.print("  " + llama.command(), soft_wrap=True, highlight=False)
