"""TGI's startup phases, read from its launcher and shard server, so that an out-of-memory error a TGI log ends in
can be placed like vLLM's.

The launcher (launcher/src/main.rs) starts one shard process per GPU ("Starting shard"), waits for each to come up
("Shard ready in ..."), and only then starts the router, which runs the warm-up: the largest prefill batch the
settings allow (server/text_generation_server/models/flash_causal_lm.py:warmup), after which it sizes the KV cache
("Setting max batch total tokens to N"). A shard that exits before it is ready makes the launcher print its stderr
("Shard complete standard error output"), "Shard N failed to start" and "Error: ShardCannotStart": the shard died
while initialising the model, i.e. loading its weights. A warm-up failure is returned over gRPC instead, logged by
the shard's interceptor as "Method Warmup encountered an error" (server/text_generation_server/interceptor.py).
"""

from __future__ import annotations

PHASE_MARKERS: tuple[tuple[str, str], ...] = (
    ("text_generation_launcher: starting shard", "loading"),           # launcher/src/main.rs:shard_manager
    ("error when initializing model", "loading"),                      # server/text_generation_server/server.py
    ("shard complete standard error output", "loading"),               # launcher/src/main.rs:shard_manager
    ("shardcannotstart", "loading"),                                   # launcher/src/main.rs:LauncherError
    ("text_generation_launcher: shard ready in", "weights_loaded"),    # launcher/src/main.rs:shard_manager
    ("warming up model", "weights_loaded"),                            # backends/v3/src/lib.rs:connect_backend
    ("method warmup encountered an error", "weights_loaded"),          # server/text_generation_server/interceptor.py
    ("setting max batch total tokens to", "profiled"),                 # backends/v3/src/lib.rs:connect_backend
    ("method prefill encountered an error", "serving"),                # server/text_generation_server/interceptor.py
    ("method decode encountered an error", "serving"),                 # server/text_generation_server/interceptor.py
)
