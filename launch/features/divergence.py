"""Divergence and loss spikes, one policy. A non-finite loss or gradient norm on any rank stops the run
with one line (DivergenceError): checked at every logging step and before every checkpoint, so nothing is
saved from it (the meter notes the first such step on the device, launch/run/meter.py). Optionally
(`train.skip_spikes`, OLMo-core's rule; docs/running.md, the table of events) the update of a step whose
loss or gradient norm exceeds the mean + k·σ of the last N accepted steps is skipped: the step's data is
consumed and the schedule moves on. One host sync per step: why it is off by default. The engine only
asks (`Engine.skip_updates`)."""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from launch.checkpoint import latest_checkpoint, read_meta
from launch.errors import UserError
from launch.features.base import Feature
from launch.runtime.process_group import all_reduce_sum

if TYPE_CHECKING:
    from launch.trainer import Trainer


class DivergenceError(UserError):
    """Training produced a non-finite loss or gradient norm: nothing is saved from it."""


class SpikeGuard:
    """The rolling window of accepted steps' (loss, gradient norm) and the count of skipped updates."""

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
        elif all(math.isfinite(v) for v in observed.values()):  # non-finite: the divergence check's
            for key, value in observed.items():
                self.history[key].append(value)
        return spike


def check_finite(trainer: Trainer) -> None:
    """DivergenceError (one line: where, the last good checkpoint, what to do) if any rank saw a
    non-finite loss or gradient norm. Collective."""
    found = trainer.meter.divergence()
    if found is None:
        return
    quantity, step = found
    good = latest_checkpoint(trainer.run_dir.path / "checkpoints")
    lr = trainer.cfg.optim.lr
    where = (
        f"the last good checkpoint is {good} (step {read_meta(good)['step']}); the same command "
        f"with a lower optim.lr (e.g. optim.lr={lr / 2:g}) resumes from it"
        if good is not None
        else f"there is no checkpoint yet; start again with a lower optim.lr (e.g. optim.lr={lr / 2:g})"
    )
    raise DivergenceError(
        f"training diverged: non-finite {quantity} at step {step}; nothing was saved from it; {where}"
    )


class Divergence(Feature):
    """The check at each logging step (the loss was just read: one tiny all-reduce more) and, with
    `train.skip_spikes`, the spike guard the engine asks before each update (`skipped_steps` logged)."""

    name = "divergence"
    spikes: SpikeGuard | None = None

    def start(self, trainer: Trainer) -> None:
        t = self.cfg.train
        if not t.skip_spikes:
            return
        spikes, meter = SpikeGuard(t.spike_window, t.spike_sigma, trainer.env.world_size), trainer.meter
        trainer.engine.skip_updates(lambda norm: spikes.is_spike(meter.step_loss, norm))
        self.spikes = spikes

    def metrics(self, trainer: Trainer, step: int) -> dict[str, Any]:
        return {"skipped_steps": self.spikes.skipped} if self.spikes is not None else {}

    def log(self, trainer: Trainer, step: int, record: dict[str, Any]) -> None:
        check_finite(trainer)
