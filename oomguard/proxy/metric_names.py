"""The per-engine admission gauges `oomguard proxy` exports for an Endpoint Picker and for dashboards.

One home for their names: proxy/metrics.py exports them, deploy/epp.py filters and scores endpoints on them, the
Grafana dashboard (deploy/grafana/oomguard.json) plots them. Labels as vLLM's own gauges: `model_name` (the first id
the engine's /v1/models lists, as vLLM labels its metrics with its served model name) and `engine` (the engine as the
proxy knows it: its host:port).
"""

ENGINE_LABELS = ("model_name", "engine")

# 1 while the proxy admits new requests to the engine, 0 while it holds them: KV usage reached the high watermark
# (90%) and has not yet fallen below the low one (80%), the engine queues requests itself, its metrics are stale,
# or it is down
ADMIT = "oomguard_proxy_engine_admit"
# KV tokens the engine can still take before the high watermark pauses it
KV_HEADROOM_TOKENS = "oomguard_proxy_engine_kv_headroom_tokens"
# the engine's KV cache in tokens as its cache_config_info states it: the capacity admission plans against
KV_CAPACITY_TOKENS = "oomguard_proxy_engine_kv_capacity_tokens"

ENGINE_GAUGES = (ADMIT, KV_HEADROOM_TOKENS, KV_CAPACITY_TOKENS)

HELP = {
    ADMIT: "1 while oomguard admits new requests to the engine; 0 while it holds them (KV usage reached the high "
           "watermark and has not fallen below the low one, the engine queues requests itself, stale metrics, down)",
    KV_HEADROOM_TOKENS: "KV cache tokens the engine can take before the high watermark pauses it",
    KV_CAPACITY_TOKENS: "The engine's KV cache in tokens, as its cache_config_info states it (what admission plans "
                        "against)",
}
