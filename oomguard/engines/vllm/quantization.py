"""Which quantization methods vLLM runs on which GPUs (QuantizationConfig.get_min_capability, read in 0.19)."""

from __future__ import annotations

# vllm/model_executor/layers/quantization/<method>.py: get_min_capability() (compute capability x 10)
MIN_CAPABILITY = {"fp8": 75, "awq": 75, "awq_marlin": 75, "gptq": 60, "gptq_marlin": 75, "bitsandbytes": 70,
                  "compressed-tensors": 70, "mxfp4": 80, "modelopt": 89, "modelopt_fp4": 100}


def runs_on(method: str | None, compute_capability: tuple[int, int]) -> bool:
    """True when vLLM accepts `method` on a GPU of this compute capability (unknown methods: assume yes)."""
    if method is None:
        return True
    need = MIN_CAPABILITY.get(method)
    return need is None or compute_capability[0] * 10 + compute_capability[1] >= need
