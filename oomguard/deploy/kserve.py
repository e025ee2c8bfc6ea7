"""KServe's `LLMInferenceService` for a planned replica (serving.kserve.io/v1alpha1; CRD of kserve/kserve v0.20).

What KServe does with it (config/llmisvcconfig/config-llm-template.yaml, v0.20): the main container runs
`vllm serve /mnt/models --served-model-name <spec.model.name> --port 8000 --tensor-parallel-size
<spec.parallelism.tensor> ... "$@"` with the container's `args` as "$@", so the args carry every planned flag but TP.
The controller merges this spec into its well-known configs with a strategic merge (containers by name,
pkg/controller/v1alpha2/llmisvc/config_merge.go), so the startup probe given here changes only its period and
failure threshold and keeps the template's httpGet (/health on 8000, HTTP or HTTPS as KServe's TLS is set).
`router.scheduler` creates the InferencePool and its Endpoint Picker; `scheduler.config.inline` is the
EndpointPickerConfig of epp.py, run by the llm-d-router image that config was written against.

Multi-node: KServe v0.20's templates start a replica across nodes only as data parallel (LeaderWorkerSet); a
TP x PP replica over nodes needs a custom LLMInferenceServiceConfig that starts Ray (or vLLM's multi-node mode).
The manifest then still says what that replica needs (parallelism, GPUs per pod, the flags); render.py says so.
"""

from __future__ import annotations

from oomguard.deploy import epp
from oomguard.deploy.spec import PROBE_PERIOD_SECONDS, Deployment

API_VERSION = "serving.kserve.io/v1alpha1"
KIND = "LLMInferenceService"
MAIN = "main"   # the container name KServe's templates use for vLLM and for the Endpoint Picker
STARTUP_PROBE = True   # render.py explains its size in the header
DESCRIPTION = "KServe LLMInferenceService (serving.kserve.io/v1alpha1, KServe v0.20): kubectl apply -f FILE"


def notes(d: Deployment) -> list[str]:
    out = [f"the vLLM image your LLMInferenceServiceConfig runs must be vLLM {d.vllm_version}, the version planned",
           f"the Endpoint Picker runs {epp.EPP_IMAGE}: the first with the attribute filter its config uses"]
    if d.nodes > 1:
        out.append(f"{d.nodes} nodes: KServe v0.20's templates start a replica over nodes only as data parallel; "
                   "this TP x PP replica needs an LLMInferenceServiceConfig whose template starts Ray (or vLLM's "
                   "multi-node mode) across the pods")
    return out


def document(d: Deployment) -> dict:
    parallelism = {"tensor": d.tensor_parallel_size}
    if d.pipeline_parallel_size > 1:   # recorded; no v0.20 template passes it on, so the args carry the flag too
        parallelism["pipeline"] = d.pipeline_parallel_size
    vllm = {
        "name": MAIN,
        "args": d.args(without=("tensor_parallel_size",)),
        "resources": d.pod_resources(),
        "startupProbe": {"periodSeconds": PROBE_PERIOD_SECONDS, "failureThreshold": d.startup_failure_threshold},
    }
    scheduler = {
        "config": {"inline": epp.document(d)},
        "template": {"containers": [{"name": MAIN, "image": epp.EPP_IMAGE}]},
    }
    spec = {
        "model": {"uri": f"hf://{d.model_id}", "name": d.model_id},
        "replicas": 1,
        "parallelism": parallelism,
        "template": {"containers": [vllm]},
        "router": {"route": {}, "gateway": {}, "scheduler": scheduler},
    }
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": d.name}, "spec": spec}


def vllm_words(manifest: dict) -> list[str]:
    """The `vllm serve` words (after the model) this manifest makes KServe run: the template's TP flag, then the
    main container's args."""
    spec = manifest["spec"]
    main = next(c for c in spec["template"]["containers"] if c["name"] == MAIN)
    tensor = spec.get("parallelism", {}).get("tensor")
    return (["--tensor-parallel-size", str(tensor)] if tensor else []) + list(main.get("args", []))
