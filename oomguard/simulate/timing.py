"""The simulator's step time: the GPU roofline (oomguard/gpus/roofline.py) applied to one scheduled step."""

from __future__ import annotations

from oomguard.gpus.roofline import Roofline as _GpuRoofline
from oomguard.simulate.scheduler import SchedulerOutput


class Roofline(_GpuRoofline):
    def step_seconds(self, output: SchedulerOutput) -> float:
        """Wall time to sleep for one scheduled step (GPU time / speed)."""
        return self.gpu_seconds(output.num_scheduled_tokens, output.kv_tokens_read) / self.speed
