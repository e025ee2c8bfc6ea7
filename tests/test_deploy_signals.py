"""The admission signals an Endpoint Picker reads from `oomguard proxy`, the Grafana dashboard, and vLLM's metric
names as oomguard reads them: every metric name the README's EPP config, the emitted EndpointPickerConfig and the
dashboard refer to is exported (oomguard's) or read (vLLM's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import oomguard
from oomguard.deploy import epp
from oomguard.engines.vllm import metrics as vllm_metrics
from oomguard.engines.vllm.releases import release
from oomguard.metrics import parse_metrics
from oomguard.proxy import metric_names
from oomguard.proxy.admission import AdmissionController, Limits
from oomguard.proxy.metrics import ProxyMetrics

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(oomguard.__file__).parent
DASHBOARD = PACKAGE / "deploy" / "grafana" / "oomguard.json"
ENGINE = "10.0.0.5:8000"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def proxy(capacity_tokens: int | None = 100_000):
    """A proxy's admission core and metrics registry with one upstream that has been polled (no HTTP)."""
    controller = AdmissionController([ENGINE], Limits(), clock=Clock())
    controller.set_models(ENGINE, [MODEL, "a-lora-adapter"], 8192)
    if capacity_tokens:
        controller.set_kv_capacity(ENGINE, capacity_tokens, 16)
    return controller, ProxyMetrics(controller)


def samples(registry_metrics: ProxyMetrics) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(registry_metrics.render().decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def exported_names() -> set[str]:
    """Every sample name the proxy's registry exports once it has seen an engine (counters' _total included)."""
    controller, m = proxy()
    controller.observe(ENGINE, 0.5, running=1, waiting=0)
    m.on_reject("queue_full")
    from oomguard.proxy.admission import Priority
    m.on_admit(ENGINE, Priority.NORMAL, 0.01)
    m.upstream_errors.labels(ENGINE, "before_response").inc()
    return set(samples(m))


def vllm_names() -> set[str]:
    """The vLLM metric names oomguard knows (engines/vllm/metrics.py and every release's KV usage names)."""
    names = {n for ns in vllm_metrics.NAMES.values() for n in ns}
    names |= {name for name, _, _ in vllm_metrics.LABELLED.values()} | {vllm_metrics.CACHE_CONFIG_INFO}
    names |= {f"{h}{suffix}" for h in vllm_metrics.HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    names |= {n for minor in range(6, 34) for n in release((0, minor, 0)).kv_usage_metrics}   # 0.6 to 0.33
    return names


def test_the_engine_gauges_follow_the_90_80_hysteresis_with_vllms_labels():
    controller, m = proxy()

    def gauge(name: str) -> float:
        (s,) = samples(m)[name]
        assert s.labels == {"model_name": MODEL, "engine": ENGINE}   # the served model, not a LoRA adapter
        return s.value

    assert gauge(metric_names.ADMIT) == 0   # not polled yet: down
    for usage, admitted in ((0.50, 1), (0.89, 1), (0.90, 0), (0.85, 0), (0.80, 0), (0.79, 1)):
        controller.observe(ENGINE, usage, running=1, waiting=0)
        assert gauge(metric_names.ADMIT) == admitted, usage
    assert gauge(metric_names.KV_CAPACITY_TOKENS) == 100_000
    assert gauge(metric_names.KV_HEADROOM_TOKENS) == 100_000 * 0.90 - 79_000
    controller.observe(ENGINE, 0.95, running=1, waiting=0)
    assert gauge(metric_names.KV_HEADROOM_TOKENS) == 0
    controller.observe(ENGINE, 0.10, running=1, waiting=2)   # the engine queues requests itself
    assert gauge(metric_names.ADMIT) == 0


def test_headroom_counts_the_blocks_promised_to_requests_in_flight():
    from oomguard.proxy.admission import Ticket
    controller, m = proxy(capacity_tokens=10_000)
    controller.observe(ENGINE, 0.0, running=0, waiting=0)
    controller.submit(Ticket(kv_tokens=4_000))   # in flight through the proxy, not yet in the engine's usage
    (s,) = samples(m)[metric_names.KV_HEADROOM_TOKENS]
    assert s.value == 9_000 - 4_000


def test_an_engine_that_states_no_kv_capacity_exports_no_headroom():
    controller, m = proxy(capacity_tokens=None)
    controller.observe(ENGINE, 0.5)
    got = samples(m)
    assert metric_names.ADMIT in got and metric_names.KV_HEADROOM_TOKENS not in got


def readme_epp_configs() -> list[dict]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Deploying at scale", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    docs = [yaml.safe_load(b) for b in blocks]
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == epp.KIND]


def test_every_metric_the_readme_and_the_emitted_epp_config_read_is_exported(capsys):
    from oomguard.cli import main
    configs = readme_epp_configs()
    assert len(configs) == 1, "the README shows the EPP configuration"
    assert main(["plan", MODEL, "--gpu", "h100", "--max-model-len", "8192", "--format", "epp"]) == 0
    configs.append(yaml.safe_load(capsys.readouterr().out))
    exported = exported_names()
    for config in configs:
        read = epp.metric_specs(config)
        assert set(read) == {metric_names.ADMIT, metric_names.KV_HEADROOM_TOKENS}
        assert set(read) <= exported
        # the attributes the filter and the scorer use are the ones the custom metrics produce
        produced = {m["attributeKey"] for p in config["plugins"]
                    for e in (p.get("parameters") or {}).get("engineConfigs", []) for m in e["customMetrics"]}
        used = {p["parameters"].get("attribute") or p["parameters"].get("attributeKey") for p in config["plugins"]
                if p["type"].startswith("endpoint-attribute-")}
        assert used == produced


def test_the_readme_epp_config_is_the_one_oomguard_writes(capsys):
    """Same plugins, profile and wiring; the README's numbers are those of its 70B example plan."""
    from oomguard.cli import main
    (readme,) = readme_epp_configs()
    assert main(["plan", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h100", "--gpu-count", "4", "--p99-tokens",
                 "8192", "--peak-concurrency", "32", "--format", "epp"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == readme


def dashboard_exprs() -> tuple[list[str], list[str]]:
    """The panels' queries and the variables' queries."""
    dash = json.loads(DASHBOARD.read_text())
    return ([t["expr"] for p in dash["panels"] for t in p.get("targets", [])],
            [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)])


def metric_names_in(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: `name{...}` selectors and `__name__=~"a|b"` matchers."""
    names = set(re.findall(r"(?<![\w:\"])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", expr)) - {"label_values"}
    for alternatives in re.findall(r'__name__\s*=~?\s*"([^"]+)"', expr):
        names |= set(alternatives.split("|"))
    # every vllm:/oomguard_ token in the expression is a selector the dashboard filters (none bare)
    tokens = set(re.findall(r"(?:vllm:|oomguard_)[a-zA-Z0-9_:]*", expr))
    assert tokens <= names, f"bare metric names in {expr!r}: {tokens - names}"
    return names


def test_every_dashboard_query_reads_an_exported_or_known_metric():
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"job", "instance", "model_name", "engine"} <= variables
    known = exported_names() | vllm_names()
    seen: set[str] = set()
    panels, variables_queries = dashboard_exprs()
    for expr in panels + variables_queries:
        names = metric_names_in(expr)
        assert names, expr
        assert names <= known, f"{expr!r} reads {names - known}"
        seen |= names
    for expr in panels:   # every panel follows the dashboard's job and instance choice
        assert "$job" in expr and "$instance" in expr, expr
    # both KV usage names, the waiting-by-reason split and every engine gauge of the proxy are on it
    assert {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_requests_waiting_by_reason",
            *metric_names.ENGINE_GAUGES} <= seen


@pytest.mark.parametrize("kv_name", ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"])
def test_both_kv_names_and_the_waiting_split_are_read(kv_name):
    page = (f'# TYPE {kv_name} gauge\n{kv_name}{{engine="0",model_name="m"}} 0.42\n'
            '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
            '# TYPE vllm:num_requests_waiting_by_reason gauge\n'
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 2\n'
            'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 1\n')
    sample = parse_metrics(page)
    assert sample.kv_usage == 0.42 and sample.waiting == 3
    assert (sample.waiting_capacity, sample.waiting_deferred) == (2, 1)
    older = parse_metrics(f'# TYPE {kv_name} gauge\n{kv_name} 0.5\n')   # before the split: unknown, not 0
    assert older.kv_usage == 0.5 and older.waiting_capacity is None


def test_every_reader_of_engine_metrics_goes_through_one_parser():
    """The proxy, the load test and diagnose read /metrics with oomguard.metrics.parse_metrics, whose names live in
    engines/*/metrics.py: no other module spells a vLLM metric name (the fake engine, testsupport/upstream.py, is
    outside the package)."""
    readers = {"proxy/upstreams.py", "loadtest/sampler.py", "diagnose/metrics_watch.py"}
    for path in readers:
        assert "parse_metrics" in (PACKAGE / path).read_text(), path
    writers = {"simulate/metrics.py", "engines/vllm/metrics.py", "engines/vllm/releases.py"}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.split("/")[0] in ("proxy", "loadtest", "diagnose", "metrics") and rel not in writers:
            code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
            assert not re.search(r"[\"']vllm:[a-z_]+", code), f"{rel} spells a vLLM metric name"
