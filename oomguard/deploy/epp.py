"""An `EndpointPickerConfig` for the Gateway API Inference Extension's Endpoint Picker, from a planned replica.

Written against llm-d-router v0.10.0 (the Endpoint Picker moved there from kubernetes-sigs/gateway-api-inference-
extension after v1.5.0; KServe's and llm-d's InferencePools run its image). It reads the apiVersion
`inference.networking.x-k8s.io/v1alpha1`, the group every release of the EPP has read (llm-d-router also reads
`llm-d.ai/v1alpha1`, its newer name). No Go code: stock plugins only.

* Saturation (flow control): `concurrency-detector` in hybrid mode (requests and tokens both counted, an endpoint
  saturated on either) with `maxTokenConcurrency` = the safety margin (90%, oomguard's pause watermark) of the KV
  cache tokens the plan gives one replica, and `maxConcurrency` = the same margin of the requests it holds at once;
  the detector also filters out an endpoint at either limit (`headroom` 0: no burst past the plan). The EPP's
  defaults without a plan: 1,000,000 tokens and 100 requests, whatever the GPU.
* Admission signals: a second metrics source reads the `oomguard proxy` running beside each engine (its /metrics
  on OOMGUARD_METRICS_PORT); the core metrics extractor's `customMetrics` turn its per-engine gauges into endpoint
  attributes; `endpoint-attribute-filter` keeps the endpoints oomguard admits to (the 90/80 hysteresis), and
  `endpoint-attribute-scorer` prefers those with the most KV headroom in tokens. When every endpoint is paused
  the filter gives them all back (fallbackOnEmpty) rather than fail the request: holding requests is the flow
  control queue's job, which the saturation detector above drives. Endpoints without the sidecar have no such
  attribute and pass (onMissing: Pass), so the config works, sized by the plan alone, without it.
"""

from __future__ import annotations

from oomguard.deploy.spec import Deployment
from oomguard.proxy import metric_names

API_VERSION = "inference.networking.x-k8s.io/v1alpha1"
KIND = "EndpointPickerConfig"
ROUTER_VERSION = "v0.10.0"   # the first llm-d-router release with endpoint-attribute-filter
EPP_IMAGE = f"ghcr.io/llm-d/llm-d-router-endpoint-picker:{ROUTER_VERSION}"

OOMGUARD_METRICS_PORT = 8001   # `oomguard proxy --listen 0.0.0.0:8001` beside the engine
ADMIT_ATTRIBUTE = "oomguard.admit"
HEADROOM_ATTRIBUTE = "oomguard.kv_headroom_tokens"
SATURATION = "kv-saturation"
ADMIT_FILTER = "oomguard-admit"
HEADROOM_SCORER = "oomguard-kv-headroom"
OOMGUARD_SOURCE = "oomguard-metrics"
OOMGUARD_EXTRACTOR = "oomguard-extractor"
DESCRIPTION = (f"EndpointPickerConfig for llm-d-router {ROUTER_VERSION}+ (an InferencePool's Endpoint Picker): its "
               "--config-file, or inline in KServe's spec.router.scheduler.config")


def notes(d: Deployment) -> list[str]:
    return [f"per replica: oomguard proxy beside each engine, its /metrics on port {OOMGUARD_METRICS_PORT} "
            "(see the README's 'Deploying at scale'); without it the plan-sized limits still hold"]


def document(d: Deployment) -> dict:
    plugins = [
        {"type": "metrics-data-source"},       # the engine's own /metrics on the pool's target port (vLLM's names)
        {"type": "core-metrics-extractor"},
        {"name": OOMGUARD_SOURCE, "type": "metrics-data-source",
         "parameters": {"scheme": "http", "path": "/metrics", "port": OOMGUARD_METRICS_PORT}},
        {"name": OOMGUARD_EXTRACTOR, "type": "core-metrics-extractor",
         "parameters": {"engineConfigs": [{"name": "vllm", "customMetrics": [
             {"attributeKey": ADMIT_ATTRIBUTE, "metricSpec": metric_names.ADMIT},
             {"attributeKey": HEADROOM_ATTRIBUTE, "metricSpec": metric_names.KV_HEADROOM_TOKENS}]}]}},
        {"name": SATURATION, "type": "concurrency-detector",
         "parameters": {"concurrencyMode": "hybrid", "maxTokenConcurrency": d.admit_kv_tokens,
                        "maxConcurrency": d.admit_concurrency, "headroom": 0.0}},
        {"name": ADMIT_FILTER, "type": "endpoint-attribute-filter",
         "parameters": {"attribute": ADMIT_ATTRIBUTE, "onMissing": "Pass", "fallbackOnEmpty": True,
                        "algorithm": {"type": "threshold",
                                      "threshold": {"operator": "GreaterThanOrEqual", "value": 1}}}},
        {"name": HEADROOM_SCORER, "type": "endpoint-attribute-scorer",
         "parameters": {"attributeKey": HEADROOM_ATTRIBUTE,
                        "algorithm": {"type": "linear_higher_is_better", "normalization": {"adaptiveRange": {}}}}},
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "prefix-cache-scorer"},
        {"type": "max-score-picker"},
        {"type": "single-profile-handler"},
    ]
    profile = [
        {"pluginRef": ADMIT_FILTER},
        {"pluginRef": SATURATION},
        {"pluginRef": "prefix-cache-scorer", "weight": 3},
        {"pluginRef": "queue-scorer", "weight": 2},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": HEADROOM_SCORER, "weight": 2},
        {"pluginRef": "max-score-picker"},
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "featureGates": ["flowControl"],   # saturated: requests wait in the EPP's queue (as in oomguard's proxy)
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": profile}],
        "flowControl": {"saturationDetector": {"pluginRef": SATURATION}},
        "dataLayer": {"sources": [
            {"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]},
            {"pluginRef": OOMGUARD_SOURCE, "extractors": [{"pluginRef": OOMGUARD_EXTRACTOR}]},
        ]},
    }


def metric_specs(config: dict) -> list[str]:
    """Every metric an EndpointPickerConfig reads through custom metrics (the names, selectors' labels dropped)."""
    out = []
    for plugin in config.get("plugins", []):
        for engine in (plugin.get("parameters") or {}).get("engineConfigs", []):
            out += [m["metricSpec"].split("{", 1)[0] for m in engine.get("customMetrics", [])]
    return out
