"""SIGTERM/SIGINT (preemption, Ctrl-C) set a flag; the loop saves a checkpoint and exits 0."""

from __future__ import annotations

import signal

import torch

from launch.distributed import DistEnv, all_reduce_sum


class StopFlag:
    def __init__(self) -> None:
        self.raised = False
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame) -> None:
        self.raised = True

    def restore(self) -> None:
        """Give the signals back to whoever had them (matters when train() is called as a library)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def agreed(self, env: DistEnv) -> bool:
        """All ranks stop at the same step if any rank was signalled (one tiny all-reduce)."""
        if env.world_size == 1:
            return self.raised
        flag = torch.tensor([float(self.raised)], device=env.device)
        return all_reduce_sum(flag).item() > 0
