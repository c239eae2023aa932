"""What a training-log line measures between two logging steps, so runs compare on equal terms (the keys:
docs/running.md, `metrics.jsonl`), and the divergence watch: the first step with a non-finite loss or gradient norm
is noted on the device every step (no host sync) and read, agreed across ranks, only when the run syncs anyway
(logging steps) or must know (before a checkpoint is written)."""

from __future__ import annotations

import contextlib
import math
import re
import resource
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from launch.runtime.process_group import DistEnv, all_reduce_sum

# Dense (no sparsity) bf16 tensor-core peak TFLOP/s by board, from NVIDIA's datasheets (they print
# the sparse figure, twice these): H100 SXM 989.4, H100 NVL 835, H100 PCIe 756 (H100 datasheet,
# nvidia.com/en-us/data-center/h100); H200 SXM 989, H200 NVL 835 (nvidia.com/en-us/data-center/h200);
# GH200 989 (GH200 datasheet); A100 SXM and PCIe 312 (A100 datasheet); L40S 362.05 (L40S datasheet);
# A10 125 (A10 datasheet). Matched against torch.cuda.get_device_name() in this order, so a PCIe or
# NVL board is never read as an SXM one; a name not matched gets no MFU rather than a wrong one.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"GH200", 989.4),
    (r"H100.*NVL", 835.0),
    (r"H100.*PCIe", 756.0),
    (r"H100", 989.4),  # "NVIDIA H100 80GB HBM3" is the SXM5 board
    (r"H200.*NVL", 835.0),
    (r"H200", 989.4),
    (r"A100", 312.0),
    (r"L40S", 362.05),
    (r"\bA10\b", 125.0),
)


def peak_tflops_of(name: str) -> float | None:
    """The dense bf16 peak of the board named `name` (as CUDA names it), or None if not known."""
    return next((tflops for pattern, tflops in PEAK_TFLOPS if re.search(pattern, name, re.IGNORECASE)), None)


def peak_tflops(device: torch.device) -> float | None:
    return peak_tflops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


class StepMeter:
    def __init__(
        self, env: DistEnv, flops_per_token: tuple[float, float], params: int, non_embedding_params: int
    ) -> None:
        """`flops_per_token`: (attention counted whole, the PaLM convention; attention counted causal)."""
        self.env = env
        self.flops_per_token, self.params, self.non_embedding = flops_per_token, params, non_embedding_params
        self.peak = peak_tflops(env.device)
        self._loss_sum = torch.zeros((), device=env.device)
        self._step_loss = torch.zeros((), device=env.device)
        # First step with a non-finite [loss, gradient norm] on this rank (inf: none yet).
        self._first_bad = torch.full((2,), math.inf, dtype=torch.float64, device=env.device)
        self._steps, self._tokens, self._wait = 0, 0, 0.0
        self._paused = 0.0  # seconds of the window spent outside training (evaluation, checkpoints)
        self._t0 = time.perf_counter()

    def add_micro_batch(self, loss: Tensor) -> None:
        """A micro-batch's share of its step's mean loss (device tensor: no host sync)."""
        self._step_loss += loss

    @property
    def step_loss(self) -> Tensor:
        """This rank's loss of the step running, its micro-batches so far: the run's one accumulator of it
        (the spike guard reads it before the update)."""
        return self._step_loss

    def end_step(self, step: int, grad_norm: Any, tokens: int, data_wait_s: float) -> None:
        """`tokens`: the step's global tokens; `data_wait_s`: this rank's wait for its batch."""
        norm = torch.as_tensor(grad_norm, device=self.env.device).reshape(())
        bad = torch.stack([~torch.isfinite(self._step_loss), ~torch.isfinite(norm)])
        self._first_bad = torch.where(bad & torch.isinf(self._first_bad), float(step), self._first_bad)
        self._loss_sum += self._step_loss
        self._step_loss = torch.zeros_like(self._step_loss)
        self._steps += 1
        self._tokens += tokens
        self._wait += data_wait_s

    def divergence(self) -> tuple[str, int] | None:
        """(quantity, first step) if any rank saw a non-finite loss or gradient norm. Collective."""
        first = self._first_bad.clone()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(first, op=dist.ReduceOp.MIN)
        loss_step, norm_step = first.tolist()
        if math.isinf(loss_step) and math.isinf(norm_step):
            return None
        return ("loss", int(loss_step)) if loss_step <= norm_step else ("gradient norm", int(norm_step))

    def state_dict(self) -> dict[str, Any]:
        """The logging window so far (a checkpoint part): the steps since the last record and this
        rank's sum of their losses, so that a run resumed between two logging steps writes the
        records the uninterrupted run writes. Throughput and data wait restart: they time a launch."""
        return {"steps": self._steps, "loss_sum": self._loss_sum.detach().cpu()}

    def load_rank_states(self, states: list[dict[str, Any]]) -> None:
        """Every saving rank's window, in rank order. On the same world size each rank takes its own
        sum (bit-exact); on another, each takes the ranks' mean, which `read` averages back to the
        same figure (it divides the all-reduced sum by the world size)."""
        if len(states) == self.env.world_size:
            loss_sum = states[self.env.rank]["loss_sum"]
        else:
            loss_sum = sum(s["loss_sum"].double() for s in states) / len(states)
        self._loss_sum = loss_sum.to(self._loss_sum.device, self._loss_sum.dtype).reshape(())
        self._steps = int(states[0]["steps"])

    def restart_clock(self) -> None:
        """Start the window's clock now (after set-up: a launch is timed from its first step)."""
        self._t0, self._paused = time.perf_counter(), 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave what runs inside (evaluation, a checkpoint) out of the window's time, while its
        steps and tokens stay in it: the window's tokens/s is its training steps' alone."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - start

    def read(self, tokens_seen: int) -> dict[str, Any]:
        """The window's figures since the last read; resets. Collective: every rank calls it at the
        same step (one all-reduce of the loss)."""
        loss = all_reduce_sum(self._loss_sum).item() / self.env.world_size / max(self._steps, 1)
        elapsed = max(time.perf_counter() - self._t0 - self._paused, 1e-9)
        tokens_per_s = self._tokens / elapsed
        per_device = tokens_per_s / self.env.world_size / (self.peak * 1e12) if self.peak else None
        mfu, mfu_causal = (f * per_device if per_device else None for f in self.flops_per_token)
        cuda = self.env.device.type == "cuda"
        out = {
            "train_loss": loss,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu,  # attention counted non-causal (PaLM/nanoGPT); mfu_causal: what a causal kernel runs
            "mfu_causal": mfu_causal,
            "peak_mem_gib": torch.cuda.max_memory_allocated(self.env.device) / 2**30 if cuda else None,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "data_wait_frac": min(self._wait / elapsed, 1.0),
            "chinchilla_multiple": tokens_seen / (20 * self.non_embedding),
            "params": self.params,
            "non_embedding_params": self.non_embedding,
        }
        self._loss_sum.zero_()
        self._steps, self._tokens, self._wait, self._t0, self._paused = 0, 0, 0.0, time.perf_counter(), 0.0
        return out
