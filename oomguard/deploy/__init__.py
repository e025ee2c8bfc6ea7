"""Deployment manifests from a plan, for the engines vLLM scales out on.

One planned configuration (`spec.Deployment`: the model, the vLLM flags of the `vllm serve` line the plan printed,
the GPUs and nodes of one replica, and the plan's KV tokens, concurrency and weight bytes) becomes a plain dict by
each target's pure `document(d)` (beside it: `DESCRIPTION`, `notes(d)` for the header, and `vllm_words(doc)`, the
`vllm serve` words the target's templates make of the document):

    kserve.py     KServe `LLMInferenceService` (serving.kserve.io/v1alpha1)
    llmd.py       values of llm-d's `llm-d-modelservice` Helm chart
    prodstack.py  values of vLLM production-stack's `vllm-stack` Helm chart
    ray.py        a Ray Serve LLM config file (`LLMConfig` under `build_openai_app`)
    epp.py        an `EndpointPickerConfig` for the Gateway API Inference Extension's Endpoint Picker (llm-d-router)

`render.py` is the one shell: it picks the target, writes YAML (PyYAML, imported there only) and the comment
header that says what the numbers are; `oomguard/plan/manifest.py` decides whether a plan gets a manifest at all
(only a configuration that starts does). What each target's templates do with the values (which keys become which
vLLM flags) is written once, in that target's module.
"""
