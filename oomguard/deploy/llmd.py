"""Values of llm-d's `llm-d-modelservice` Helm chart for a planned replica (llm-d-incubation/llm-d-modelservice
v0.4.12), decode pods only (no prefill/decode disaggregation).

What the chart does with them (templates/_helpers.tpl, `vllmServeModelCommand`): with `modelCommand: vllmServe` the
container runs `vllm serve <model> --port <routing.servicePort, the routing proxy off> [--tensor-parallel-size
<decode.parallelism.tensor> when > 1] --served-model-name <modelArtifacts.name>`, then the container's `args`. It
fills the GPU resource with tensor x data-local parallelism when the container does not name it; here it is named,
the GPUs each pod takes. `extraConfig` is merged into the container as is (the startup probe). An `hf://` model
is downloaded into an emptyDir of `modelArtifacts.size`.

Multi-node (`multinode: true`, `parallelism.workers` pods in a LeaderWorkerSet): the chart's command starts the
workers as data-parallel ranks; a TP x PP replica over nodes needs a `custom` modelCommand that starts Ray (or
vLLM's multi-node mode) on the leader and workers. render.py says so above such a document.
"""

from __future__ import annotations

import math

from oomguard.deploy.spec import PROBE_PERIOD_SECONDS, Deployment
from oomguard.units import GiB

SERVICE_PORT = 8000
CONTAINER = "vllm"
STARTUP_PROBE = True   # render.py explains its size in the header
DESCRIPTION = ("values of llm-d-modelservice (chart 0.4.12): helm install NAME "
               "llm-d-modelservice/llm-d-modelservice -f FILE, beside an InferencePool (llm-d-router v0.10.0+)")


def notes(d: Deployment) -> list[str]:
    if d.nodes <= 1:
        return []
    return [f"{d.nodes} nodes: the chart's vllmServe command starts LeaderWorkerSet workers as data parallel ranks; "
            "this TP x PP replica needs a custom modelCommand that starts Ray (or vLLM's multi-node mode) on them"]


def image(d: Deployment) -> str:
    return f"vllm/vllm-openai:v{d.vllm_version}"


def document(d: Deployment) -> dict:
    container = {
        "name": CONTAINER,
        "image": image(d),
        "modelCommand": "vllmServe",
        "args": d.args(without=("tensor_parallel_size",)),
        "resources": d.pod_resources(),
        "mountModelVolume": True,
        "extraConfig": {"startupProbe": {
            "httpGet": {"path": "/health", "port": SERVICE_PORT},
            "periodSeconds": PROBE_PERIOD_SECONDS, "failureThreshold": d.startup_failure_threshold}},
    }
    parallelism = {"tensor": d.tensor_parallel_size}
    if d.nodes > 1:
        parallelism["workers"] = d.nodes
    return {
        "multinode": d.nodes > 1,
        "modelArtifacts": {
            "name": d.model_id,
            "uri": f"hf://{d.model_id}",
            # room for a 16-bit checkpoint quantized online and the download's temporary files
            "size": f"{math.ceil(2 * d.weights_bytes / GiB)}Gi",
        },
        "routing": {"servicePort": SERVICE_PORT, "proxy": {"enabled": False}},
        "decode": {"create": True, "replicas": 1, "parallelism": parallelism, "containers": [container]},
        "prefill": {"create": False},
    }


def vllm_words(values: dict) -> list[str]:
    """The `vllm serve` words (after the model) these values make the chart run, as vllmServeModelCommand does."""
    decode = values["decode"]
    tensor = int(decode.get("parallelism", {}).get("tensor", 1))
    container = next(c for c in decode["containers"] if c["name"] == CONTAINER)
    return (["--tensor-parallel-size", str(tensor)] if tensor > 1 else []) + list(container.get("args", []))
