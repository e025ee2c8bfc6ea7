"""Step time from a roofline of one GPU: compute-bound prefill, bandwidth-bound decode.

A step that computes T tokens (prefill chunks and decode tokens together) and reads the KV cache of its
requests takes the longer of
    compute = flops_per_token * T / peak_flops                     (2 x parameters per GPU x tokens)
    memory  = (weight_bytes + kv_bytes_per_token * kv_tokens_read) / bandwidth
divided by `speed` (the simulator runs at speed 100 to see a minute of GPU time in 0.6 s). Per GPU figures: with
tensor parallelism every GPU holds 1/TP of the weights and KV heads and does 1/TP of the work.
This is an upper bound of what the hardware allows (no kernel efficiency, no communication, no sampling).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    flops_per_token: float          # 2 x (active) parameters held by one GPU
    weight_bytes: float             # weight bytes one GPU reads every step
    kv_bytes_per_token: float       # KV bytes of one token on one GPU
    peak_flops: float               # dense bf16 FLOP/s of the GPU
    bandwidth: float                # memory bytes/s of the GPU
    speed: float = 1.0

    def __post_init__(self):
        if self.speed <= 0 or self.peak_flops <= 0 or self.bandwidth <= 0:
            raise ValueError("speed, peak_flops and bandwidth must be positive")

    def compute_seconds(self, tokens: int) -> float:
        return self.flops_per_token * tokens / self.peak_flops

    def memory_seconds(self, kv_tokens_read: int) -> float:
        return (self.weight_bytes + self.kv_bytes_per_token * kv_tokens_read) / self.bandwidth

    def gpu_seconds(self, tokens: int, kv_tokens_read: int) -> float:
        """Unscaled GPU time of one step."""
        if tokens <= 0:
            return 0.0
        return max(self.compute_seconds(tokens), self.memory_seconds(kv_tokens_read))

    def decode_tokens_per_second(self, batch: int, context: int) -> float:
        """Generated tokens/s of `batch` requests of `context` tokens each, in GPU time (for docs and tests)."""
        return batch / self.gpu_seconds(batch, batch * context)
