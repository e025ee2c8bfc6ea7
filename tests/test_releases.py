"""vLLM's per-version behaviour has one home (oomguard/engines/vllm/releases.py), and it reads as its history."""

import ast
from pathlib import Path

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import NEWEST, OLDEST

PACKAGE = Path(__file__).resolve().parents[1] / "oomguard"
HOME = {PACKAGE / "engines" / "vllm" / "releases.py", PACKAGE / "engines" / "vllm" / "versions.py"}


def _is_version_operand(node: ast.AST) -> bool:
    """A literal (0, 14, 0), or a name/attribute that says it holds a version."""
    if isinstance(node, ast.Tuple) and len(node.elts) == 3 and all(
            isinstance(e, ast.Constant) and isinstance(e.value, int) for e in node.elts):
        return True
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "version" in name.lower() and not name.isupper()


def test_no_module_compares_versions_outside_the_release_table():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path in HOME:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE))
                                                     for op in node.ops):
                if any(_is_version_operand(x) for x in [node.left, *node.comparators]):
                    offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not offenders, f"ask oomguard.engines.vllm.releases.release(version) instead: {offenders}"


def test_facts_change_where_vllm_changed_them():
    assert release((0, 19, 0)).gpu_memory_utilization == 0.9        # vllm/config/cache.py 0.19.0
    assert release((0, 20, 0)).gpu_memory_utilization == 0.92       # vllm/config/cache.py 0.20.0
    assert not release((0, 19, 1)).cuda_graphs_in_budget and release((0, 20, 0)).cuda_graphs_in_budget
    assert release((0, 7, 3)).default_engine == "v0" and release((0, 8, 0)).default_engine == "v1"
    assert release((0, 10, 2)).kv_usage_metrics == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert release((0, 11, 0)).kv_usage_metrics == ("vllm:kv_cache_usage_perc",)
    assert release((0, 15, 0)).regressions and not release((0, 17, 0)).regressions
    # models/deepseek_v2.py DeepseekV2MLAAttention.__init__: IndexCache behind use_index_cache in 0.21-0.22, read from
    # index_topk_freq / index_skip_topk_offset in 0.23, an indexer only where top-k is computed from 0.24
    assert [release((0, m, 0)).dsa_index_share for m in (20, 21, 22, 23, 33)] == \
        ["none", "opt_in", "opt_in", "config", "config"]
    assert not release((0, 23, 0)).dsa_indexer_only_where_topk and release((0, 24, 0)).dsa_indexer_only_where_topk


def test_every_release_in_range_is_defined():
    for minor in range(OLDEST[1], NEWEST[1] + 1):
        rel = release((0, minor, 0))
        assert rel.default_engine in ("v0", "v1") and 0 < rel.gpu_memory_utilization < 1
