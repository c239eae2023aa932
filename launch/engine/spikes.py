"""Optional loss-spike guard (`train.skip_spikes`, OLMo-core's rule; docs/running.md, the table of events): skip
the update of a step whose loss or gradient norm exceeds the mean + k·σ of the last N accepted steps. A skipped
step's data is consumed and the schedule moves on. One host sync per step: why it is off by default."""

from __future__ import annotations

import math
import statistics
from collections import deque

import torch
from torch import Tensor

from launch.runtime.process_group import all_reduce_sum


class SpikeGuard:
    def __init__(self, window: int, sigma: float, world_size: int) -> None:
        self.sigma, self.world_size = sigma, world_size
        self.history: dict[str, deque[float]] = {"loss": deque(maxlen=window), "grad_norm": deque(maxlen=window)}
        self.skipped = 0

    def is_spike(self, step_loss: Tensor, grad_norm: Tensor) -> bool:
        """Whether this step is a spike (the same answer on every rank); records accepted values."""
        norm_tensor = torch.as_tensor(grad_norm, device=step_loss.device)
        values = torch.stack([step_loss.detach().float().reshape(()), norm_tensor.float().reshape(())])
        loss, norm = (all_reduce_sum(values) / self.world_size).tolist()  # the grad norm is global already
        observed = {"loss": loss, "grad_norm": norm}
        spike = False
        for key, value in observed.items():
            past = self.history[key]
            if len(past) == past.maxlen and math.isfinite(value):
                mean, std = statistics.fmean(past), statistics.pstdev(past)
                spike |= value > mean + self.sigma * std
        if spike:
            self.skipped += 1
        elif all(math.isfinite(v) for v in observed.values()):  # non-finite: the divergence guard's
            for key, value in observed.items():
                self.history[key].append(value)
        return spike
