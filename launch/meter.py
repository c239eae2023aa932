"""What a training-log line measures between two logging steps: the mean train loss (summed on the
device, read once per line) and the throughput."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from launch.distributed import DistEnv, all_reduce_sum


class StepMeter:
    def __init__(self, env: DistEnv) -> None:
        self.env = env
        self._loss_sum = torch.zeros((), device=env.device)
        self._steps = 0
        self._tokens = 0
        self._t0 = time.perf_counter()

    def add_micro_batch(self, loss: Tensor) -> None:
        """A micro-batch's share of its step's mean loss (device tensor: no host sync)."""
        self._loss_sum += loss

    def end_step(self, tokens: int) -> None:
        self._steps += 1
        self._tokens += tokens

    def restart_clock(self) -> None:
        """Exclude what just happened (evaluation, a checkpoint) from the throughput."""
        self._t0 = time.perf_counter()

    def read(self) -> dict[str, float]:
        """`train_loss` (mean over ranks and steps since the last read) and `tokens_per_s`; resets.
        Collective: every rank calls it at the same step."""
        loss = all_reduce_sum(self._loss_sum).item() / self.env.world_size / max(self._steps, 1)
        now = time.perf_counter()
        out = {"train_loss": loss, "tokens_per_s": self._tokens / max(now - self._t0, 1e-9)}
        self._loss_sum.zero_()
        self._steps, self._tokens, self._t0 = 0, 0, time.perf_counter()
        return out
