"""A Ray Serve LLM config file for a planned replica: `serve run FILE` / `serve deploy FILE` with one `LLMConfig`
under `ray.serve.llm:build_openai_app` (ray-project/ray, python/ray/llm/_internal/serve/core/configs/llm_config.py).

`engine_kwargs` are vLLM's EngineArgs by name, the flags of the plan's `vllm serve` line (Ray runs vLLM with the
"ray" distributed executor). The placement group holds one `{"GPU": 1}` bundle per rank, TP x PP of them
(engines/vllm/vllm_models.py `VLLMEngineConfig.placement_bundles`): STRICT_PACK on one node; across nodes PACK, which
fills a node before the next, so each TP group stays on one node and the pipeline stages span the nodes.
`deployment_config.max_ongoing_requests` caps what Ray's router sends one replica at the safety margin of the
requests the plan says it holds. Ray adds the accelerator type to every bundle as a resource (`accelerator_type:X`),
so it is set only for the GPUs Ray labels nodes with by itself.
"""

from __future__ import annotations

from oomguard.deploy.spec import Deployment

IMPORT_PATH = "ray.serve.llm:build_openai_app"
DESCRIPTION = "Ray Serve LLM config (LLMConfig under build_openai_app): serve run FILE"

# GPU catalog key prefix -> ray.util.accelerators name Ray detects on its own (A100-40G/-80G must be added by hand)
ACCELERATOR_TYPES = (
    ("h100", "H100"), ("h200", "H200"), ("h20", "H20"), ("b200", "B200"), ("a100", "A100"), ("a10g", "A10G"),
    ("l40s", "L40S"), ("l4-", "L4"), ("t4-", "T4"), ("v100", "V100"), ("p100", "P100"),
)


def accelerator_type(gpu_key: str) -> str | None:
    return next((name for prefix, name in ACCELERATOR_TYPES if gpu_key.startswith(prefix)), None)


def llm_config(d: Deployment) -> dict:
    config: dict = {
        "model_loading_config": {"model_id": d.model_id, "model_source": d.model_id},
        "engine_kwargs": dict(d.flags),
        "placement_group_config": {"bundles": [{"GPU": 1} for _ in range(d.gpus)],
                                   "strategy": "PACK" if d.nodes > 1 else "STRICT_PACK"},
        "deployment_config": {"num_replicas": 1, "max_ongoing_requests": d.admit_concurrency},
    }
    accelerator = accelerator_type(d.gpu_key)
    if accelerator:
        config["accelerator_type"] = accelerator
    return config


def document(d: Deployment) -> dict:
    return {"applications": [{"name": "llm", "route_prefix": "/", "import_path": IMPORT_PATH,
                              "args": {"llm_configs": [llm_config(d)]}}]}


def notes(d: Deployment) -> list[str]:
    out = [f"the Ray cluster's image must run vLLM {d.vllm_version}, the version planned"]
    if d.extra_args:
        out.append("not carried (engine_kwargs take EngineArgs by name, not command-line words): "
                   + " ".join(d.extra_args))
    return out
