"""`oomguard plan ... --format kserve|llmd|prodstack|ray|epp`: the deployment of the planned configuration.

A manifest is written only for a configuration the plan says starts: for one that fails or is at risk nothing
goes to stdout, one line on stderr says why (and names the nearest configuration that starts, when there is one),
and the exit code is the verdict's (1 fails, 3 at risk), so a pipeline that applies the output stops there.
"""

from __future__ import annotations

import math
import sys

from oomguard.engines.vllm.flags import format_vllm_command

EXIT_CODES = {"starts": 0, "fails": 1, "at_risk": 3}


def write_plan_manifest(fmt: str, report, gpu, flags: dict, extra: tuple[str, ...], topology, nearest) -> int:
    """The single plan's manifest: the flags of the `vllm serve` line it prints; the concurrency is the requests of
    max_model_len its KV cache holds (vLLM's "Maximum concurrency"), never more than max_num_seqs."""
    from oomguard.plan.api import serve_flags

    if report.verdict != "starts":
        hint = ""
        if nearest is not None:
            changed = {**serve_flags(nearest.report),
                       "quantization": nearest.changes.get("quantization", flags.get("quantization"))}
            hint = f"; the nearest configuration that starts: {format_vllm_command(report.model_id, changed, extra)}"
        elif report.verdict == "at_risk" and report.estimated_max_model_len:
            hint = f"; --max-model-len {report.estimated_max_model_len} fits at the low end of the estimate"
        return _refuse(fmt, report, hint)
    command_flags = {**serve_flags(report), "quantization": flags.get("quantization")}
    return _write(fmt, report, gpu, command_flags, extra, topology, math.floor(report.max_concurrency))


def write_recommend_manifest(fmt: str, rec, topology, extra: tuple[str, ...] = ()) -> int:
    """The chosen configuration's manifest: it holds the workload's peak (that is why it was chosen)."""
    chosen = rec.chosen
    if chosen is None:
        print(_one_line(f"oomguard: nothing fits this workload ({rec.no_fit.breaks}); no {fmt} manifest written "
                        "(`--format table` shows the smallest changes that would fit)"), file=sys.stderr)
        return 1
    return _write(fmt, chosen.report, rec.gpu, chosen.command_flags(), extra, topology, rec.workload.peak_concurrency,
                  model_id=chosen.checkpoint.model.model_id)


def _write(fmt, report, gpu, flags, extra, topology, concurrency: int, model_id: str | None = None) -> int:
    from oomguard.deploy.render import render
    from oomguard.deploy.spec import deployment

    d = deployment(model_id or report.model_id, flags, report, gpu, topology=topology, concurrency=concurrency,
                   extra=extra)
    sys.stdout.write(render(fmt, d, format_vllm_command(d.model_id, dict(d.flags), d.extra_args)))
    return 0


def _refuse(fmt: str, report, hint: str) -> int:
    if report.verdict == "fails":
        why = f"vLLM fails to start ({report.error_class}): {report.error}"
    else:
        why = f"vLLM may not start: the estimates' uncertainty reaches {'; '.join(report.risks)}"
    print(_one_line(f"oomguard: {why}; no {fmt} manifest written (only a configuration that starts gets one){hint}"),
          file=sys.stderr)
    return EXIT_CODES[report.verdict]


def _one_line(text: str) -> str:
    """One line, whatever vLLM's or the search's message holds."""
    return " ".join(text.split())
