"""How a MemoryReport looks: a breakdown table, a bar of one GPU's memory, the verdict, the command; or JSON."""

from __future__ import annotations

import json
import sys

from oomguard.engines.vllm.flags import format_llm_kwargs, format_vllm_command, format_yaml_config
from oomguard.engines.vllm.memory import MemoryReport
from oomguard.failures import FailureClass
from oomguard.plan.api import serve_flags
from oomguard.units import GiB

# (label, colour) of each slice of the bar, in the order vLLM fills the GPU
_SLICES = (("in use before vLLM", "grey50"), ("weights", "blue"), ("LoRA slots", "bright_blue"),
           ("drafter", "purple"), ("non-torch", "yellow"), ("graphs", "cyan"), ("KV cache", "green"),
           ("drafter KV", "dark_green"), ("sampler state", "bright_magenta"), ("warm-up peak", "magenta"),
           ("free", "grey23"))


def memory_slices(report: MemoryReport) -> list[tuple[str, int]]:
    """Bytes of each slice of the first GPU once vLLM is up: what other processes and the CUDA context held before
    it started, its allocations, the transient peak of the sampler warm-up, and what stays free (the same figure
    the verdict line gives)."""
    w = report.first
    kv = max(report.num_gpu_blocks * w.bytes_per_block, 0)
    free = max(report.headroom_bytes, 0)
    held = report.start_used_bytes + w.weights_bytes + w.non_torch_bytes + w.cuda_graph_bytes + kv + \
        w.sampling_state_bytes
    slices = [("in use before vLLM", report.start_used_bytes),
              ("weights", w.weights_bytes - w.lora_bytes - w.speculative_weights_bytes), ("LoRA slots", w.lora_bytes),
              ("drafter", w.speculative_weights_bytes), ("non-torch", w.non_torch_bytes),
              ("graphs", w.cuda_graph_bytes), ("KV cache", kv - w.speculative_kv_bytes),
              ("drafter KV", w.speculative_kv_bytes), ("sampler state", w.sampling_state_bytes),
              ("warm-up peak", max(report.total_memory_bytes - held - free, 0)), ("free", free)]
    # LoRA, the drafter and V2's sampler state show only where used
    return [(label, size) for label, size in slices
            if size or label not in ("LoRA slots", "drafter", "drafter KV", "sampler state")]


def _bar(report: MemoryReport, width: int = 60):
    from rich.text import Text

    slices = memory_slices(report)
    total = max(sum(b for _, b in slices), report.total_memory_bytes)
    text = Text()
    colours = dict(_SLICES)
    drawn = 0
    for i, (label, size) in enumerate(slices):
        cells = round(size / total * width) if i < len(slices) - 1 else width - drawn
        cells = max(cells, 1 if size > 0 else 0)
        text.append("█" * max(min(cells, width - drawn), 0), style=colours[label])
        drawn += cells
    legend = Text("  ")
    for label, size in slices:
        legend.append("■ ", style=colours[label])
        legend.append(f"{label} {size / GiB:.2f}  ")
    return text, legend


def print_report(report: MemoryReport, as_json: bool = False, ignored: tuple[str, ...] = (),
                 quantization: str | None = None, extra: tuple[str, ...] = (), output: str = "table",
                 nearest=None) -> None:
    """`quantization`: the --quantization the user gave (the report holds the resolved method, which a
    pre-quantized checkpoint needs no flag for); `extra`: the pasted command's other options, kept in the line;
    `output` "yaml": only the file for `vllm serve --config`."""
    data = report.to_dict()
    data["ignored_flags"] = list(ignored)
    flags = {**serve_flags(report), "quantization": quantization}
    data["command"] = format_vllm_command(report.model_id, flags, extra)
    data["llm_kwargs"] = format_llm_kwargs(report.model_id, flags)
    if as_json or output == "yaml":   # PyYAML is imported only for the outputs that carry the file
        data["yaml"] = format_yaml_config(report.model_id, flags)
    if nearest is not None:   # a failing plan: the nearest configuration that starts (plan/nearest.py)
        data["nearest_start"] = {**nearest.to_dict(), "command": format_vllm_command(
            report.model_id, {**serve_flags(nearest.report), "quantization": nearest.changes.get(
                "quantization", quantization)}, extra)}
    if output == "yaml":
        sys.stdout.write(data["yaml"])
        return
    if as_json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from rich.console import Console

    console = Console()
    print_breakdown(console, report)
    if ignored:
        console.print(f"[dim]not memory-relevant or not modelled (kept in the command below): {' '.join(ignored)}[/]")
    if nearest is not None:
        n = data["nearest_start"]
        change = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" '{json.dumps(v)}'" if isinstance(v, dict)
                                                         else f" {v}") for k, v in n["changes"].items())
        console.print(f"[bold]Nearest configuration that starts:[/] {change} (KV cache {n['kv_cache_gib']} GiB, "
                      f"{n['kv_cache_tokens']:,} tokens, {n['max_concurrency']}x requests of "
                      f"{n['max_model_len']:,} tokens)\n  {n['command']}")
    elif report.verdict == "fails" and report.error_class != FailureClass.DTYPE_CAPABILITY:  # its error says the fix
        console.print("[bold]No single change or pair of changes makes it start on these GPUs[/] (more GPUs, a "
                      "smaller checkpoint, or `oomguard plan ... --p99-tokens N --peak-concurrency C` to search)")
    console.print("[dim]assumptions: " + "; ".join(report.assumptions) + "[/]")
    # the LLM class takes keyword arguments; `vllm serve` the command line
    console.print(f"\n  {data['llm_kwargs'] if report.config['usage_context'] == 'llm' else data['command']}\n")


def print_breakdown(console, report: MemoryReport) -> None:
    """The per-GPU table, the memory bar, the KV figures, the verdict and the warnings."""
    from rich.table import Table

    w = report.first
    title = (f"{report.model_id} on {report.gpu_count} x {report.gpu_name} "
             f"({report.total_memory_bytes / GiB:.2f} GiB each), vLLM {report.vllm_version} ({report.engine})")
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("per GPU" + (f" (stage 0 of {len(report.workers)})" if len(report.workers) > 1 else ""))
    table.add_column("GiB", justify="right")
    table.add_column("source", style="dim")
    prov = report.provenance
    rows = [
        ("requested (total x utilization)", report.requested_memory_bytes,
         f"{report.config['gpu_memory_utilization']} x {report.total_memory_bytes / GiB:.2f} GiB"),
        ("weights", w.weights_bytes, prov["weights_gib"]),
        ("activation peak (profile run)", w.activation_peak_bytes, prov["activation_peak_gib"]),
        ("non-torch memory", w.non_torch_bytes, prov["non_torch_gib"]),
        ("CUDA graphs" + ("" if report.cuda_graphs_in_budget else " (outside the budget)"), w.cuda_graph_bytes,
         prov["cuda_graph_gib"]),
        ("available KV cache", w.kv_cache_bytes, prov["kv_cache_gib"]),
    ]
    # the parts LoRA, speculative decoding and multimodal inputs take of the figures above, where used
    parts = [("  of which LoRA adapter slots", w.lora_bytes, "exact arithmetic from the LoRA flags", 2),
             ("  of which the drafter", w.speculative_weights_bytes, "speculative decoding's drafter", 2),
             ("  of which encoder outputs held", w.encoder_cache_bytes, "vision encoder profile", 3),
             ("  of which the drafter's layers", w.speculative_kv_bytes, "exact arithmetic from the blocks", 6)]
    for label, value, source, after in sorted(parts, key=lambda p: -p[3]):
        if value:
            rows.insert(after, (label, value, source))
    if w.sampling_state_bytes:   # model runner V2's penalty counts (in the budget from 0.27), above the KV cache
        kv_row = next(i for i, row in enumerate(rows) if row[0] == "available KV cache")
        rows.insert(kv_row, ("sampler state (model runner V2)" + ("" if report.sampling_state_in_budget else
                                                                 " (outside the budget)"),
                             w.sampling_state_bytes, prov["sampling_state_gib"]))
    for label, value, source in rows:
        table.add_row(label, f"{value / GiB:.2f}", source)
    console.print(table)
    if report.host_memory_bytes:
        console.print(f"host (CPU) memory for offloading: {report.host_memory_bytes / GiB:.2f} GiB on this machine; "
                      "it adds no GPU KV capacity")
    bar, legend = _bar(report)
    console.print(bar)
    console.print(legend)
    groups = len(report.kv_layout.groups) if report.kv_layout else 1
    if groups > 1 or report.kv_cache_tokens != report.num_gpu_blocks * report.block_size:
        # hybrid layouts share each block among layer groups; vLLM's token figure is its own arithmetic
        how = ("concurrency x max_model_len" if report.kv_cache_tokens == int(report.max_concurrency *
                                                                              report.max_model_len)
               else f"blocks / {groups} layer groups x block size")
        console.print(f"KV cache: {report.num_gpu_blocks:,} blocks of {report.block_size} tokens, each shared by "
                      f"{groups} layer group(s); vLLM reports {report.kv_cache_tokens:,} tokens ({how}); maximum "
                      f"concurrency for {report.max_model_len:,} tokens per request: {report.max_concurrency:.2f}x")
    else:
        console.print(f"KV cache: {report.num_gpu_blocks:,} blocks of {report.block_size} tokens = "
                      f"{report.kv_cache_tokens:,} tokens; maximum concurrency for {report.max_model_len:,} tokens "
                      f"per request: {report.max_concurrency:.2f}x")
    if report.verdict == "at_risk":
        outcome = "vLLM starts at the predicted figures" if report.starts else report.error
        console.print(f"[bold yellow]At risk:[/] {outcome}, but the estimates' uncertainty reaches "
                      f"{'; '.join(report.risks)}.")
    elif report.starts:
        console.print(f"[bold green]vLLM starts.[/] {report.headroom_bytes / GiB:.2f} GiB stays free on the tightest GPU.")
    else:
        console.print(f"[bold red]vLLM fails to start ({report.error_class}):[/] {report.error}")
        if report.estimated_max_model_len:
            console.print(f"Fix: --max-model-len {report.estimated_max_model_len} fits the KV cache you have.")
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def print_catalogs(gpus: bool, models: bool) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if gpus:
        from oomguard.gpus.catalog import list_gpus
        table = Table("key", "name", "GiB (as CUDA reports)", "cc", show_edge=False)
        for g in list_gpus():
            table.add_row(g.key, g.name, f"{g.total_memory_bytes / GiB:.2f}", f"{g.compute_capability[0]}.{g.compute_capability[1]}")
        console.print(table)
    if models:
        from oomguard.models.load import catalog_ids
        names = sorted({n[:-5].replace("--", "/", 1) for n in catalog_ids().values()})
        console.print("\n".join(names))
    return 0
