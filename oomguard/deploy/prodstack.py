"""Values of vLLM production-stack's `vllm-stack` Helm chart for a planned replica (vllm-project/production-stack,
chart 0.1.12).

What the chart does with `servingEngineSpec.modelSpec[].vllmConfig` (templates/deployment-vllm-multi.yaml and, with
`raySpec.enabled`, templates/ray-cluster.yaml): each key in VLLM_CONFIG becomes its vLLM flag, `extraArgs` follow
verbatim, `enableLoRA` adds --enable-lora. Two asymmetries the values must respect: the Deployment template writes
--no-enable-prefix-caching whenever `enablePrefixCaching` is not true, while the Ray template writes nothing then
(vLLM's default, on), so a plan with prefix caching off carries the flag in `extraArgs` there, and a plan that leaves
it to vLLM's default gets `enablePrefixCaching: true` (the V1 engine's default; for a hybrid model on vLLM 0.15-0.27,
whose default is off, that turns on the extra state page: plan it with --enable-prefix-caching to see its cost);
and only the Ray template reads `pipelineParallelSize`, so a single-node pipeline goes to `extraArgs`.

Multi-node is KubeRay: a head pod and `replicaCount` worker pods of `requestGPU` GPUs each, with `tensorParallelSize`
the GPUs of one pod and `pipelineParallelSize` the pods (tutorials/15-basic-pipeline-parallel.md).
"""

from __future__ import annotations

from oomguard.deploy.spec import PROBE_PERIOD_SECONDS, Deployment

CONTAINER_PORT = 8000   # the chart's default servingEngineSpec.containerPort

# vLLM flag dest -> vllmConfig key, as both templates read them
VLLM_CONFIG = {
    "max_model_len": "maxModelLen",
    "tensor_parallel_size": "tensorParallelSize",
    "max_num_seqs": "maxNumSeqs",
    "gpu_memory_utilization": "gpuMemoryUtilization",
    "dtype": "dtype",
    "max_loras": "maxLoras",
    "enable_prefix_caching": "enablePrefixCaching",
}
RAY_ONLY = {"pipeline_parallel_size": "pipelineParallelSize"}   # read by templates/ray-cluster.yaml alone
STARTUP_PROBE = True   # render.py explains its size in the header
DESCRIPTION = "values of vllm-stack (production-stack chart 0.1.12): helm install NAME vllm/vllm-stack -f FILE"


def notes(d: Deployment) -> list[str]:
    return [f"{d.nodes} nodes: KubeRay (raySpec) must be installed in the cluster"] if d.nodes > 1 else []


def document(d: Deployment) -> dict:
    ray = d.nodes > 1
    keys = {**VLLM_CONFIG, **(RAY_ONLY if ray else {})}
    vllm_config = {key: d.flags[dest] for dest, key in keys.items() if dest in d.flags}
    # the Deployment template turns prefix caching off unless told: a plan that leaves it to vLLM's default (on in
    # the V1 engine) says so explicitly
    vllm_config.setdefault("enablePrefixCaching", True)
    extra = d.args(without=(*keys, "enable_lora"))
    if ray and d.flags.get("enable_prefix_caching") is False:
        extra.append("--no-enable-prefix-caching")
    if extra:
        vllm_config["extraArgs"] = extra
    model = {
        "name": d.name,
        "repository": "vllm/vllm-openai",
        "tag": f"v{d.vllm_version}",
        "modelURL": d.model_id,
        "replicaCount": d.nodes - 1 if ray else 1,   # Ray: worker pods beside the head
        "requestCPU": d.pod_cpus,
        "requestMemory": f"{d.pod_memory_gib}Gi",
        "requestGPU": d.gpus_per_node,
        "vllmConfig": vllm_config,
    }
    if d.gpu_resource != "nvidia.com/gpu":
        model["requestGPUType"] = d.gpu_resource
    if d.flags.get("enable_lora"):
        model["enableLoRA"] = True
    if ray:
        model["raySpec"] = {"enabled": True, "headNode": {
            "requestCPU": d.pod_cpus, "requestMemory": f"{d.pod_memory_gib}Gi", "requestGPU": d.gpus_per_node}}
    return {"servingEngineSpec": {
        "modelSpec": [model],
        "startupProbe": {"initialDelaySeconds": 15, "periodSeconds": PROBE_PERIOD_SECONDS,
                         "failureThreshold": d.startup_failure_threshold,
                         "httpGet": {"path": "/health", "port": CONTAINER_PORT}},
    }}


def vllm_words(values: dict) -> list[str]:
    """The `vllm serve` words (after the model) these values make the chart run, in its templates' terms."""
    model = values["servingEngineSpec"]["modelSpec"][0]
    config = model.get("vllmConfig", {})
    ray = model.get("raySpec", {}).get("enabled", False)
    option = {key: "--" + dest.replace("_", "-") for dest, key in {**VLLM_CONFIG, **RAY_ONLY}.items()}
    words = ["--enable-lora"] if model.get("enableLoRA") else []
    for key, value in config.items():
        if key == "enablePrefixCaching":
            words += ["--enable-prefix-caching"] if value else [] if ray else ["--no-enable-prefix-caching"]
        elif key in option and (key not in RAY_ONLY.values() or ray):
            words += [option[key], str(value)]
    return words + list(config.get("extraArgs", []))
