"""What a run says while it trains, on rank 0: a progress bar on a terminal (train.progress); else
(every Slurm job, a pipe to a file, train.progress=false) one line per `train.log_every` steps, as
torchtitan prints them: step, loss, LR, gradient norm, tokens/s, MFU where known, ETA (from the end of
this launch's first step on: none on the first line)."""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

log = logging.getLogger("orscale")


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    def __init__(self, total: int, start: int, enabled: bool, bar: bool, terminal: bool | None = None) -> None:
        """`enabled`: this rank reports (rank 0); `bar`: a bar is wanted (train.progress), drawn
        when stderr is a terminal (`terminal`; None: ask it)."""
        self.total, self.start, self.step = total, start, start
        self.enabled = enabled
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        # (time, step) at the end of this launch's first step: the ETA's rate leaves that step out, as it
        # holds the start-up (compilation, the first data read), which made step 1's ETA 5x too long.
        self._since: tuple[float, int] | None = None
        self._bar: Any = None
        if enabled and bar and self.terminal:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, dynamic_ncols=True, desc="train")

    def line(self, record: dict[str, Any]) -> str:
        """The log line of a training record (metrics.jsonl's training line)."""
        eta: float | None = None
        if self._since is not None and record["step"] > self._since[1]:
            t, step = self._since
            eta = (time.perf_counter() - t) / (record["step"] - step) * (self.total - record["step"])
        mfu, causal = record.get("mfu"), record.get("mfu_causal")
        shown = lambda v: isinstance(v, (int, float)) and math.isfinite(v)
        mfu_text = ""
        if isinstance(mfu, (int, float)) and shown(mfu):
            mfu_text = f"MFU {100 * mfu:.1f}%"
            if isinstance(causal, (int, float)) and shown(causal):
                mfu_text += f" ({100 * causal:.1f}% causal)"
        parts = [
            f"step {record['step']}/{self.total}",
            f"loss {record['train_loss']:.4f}",
            f"lr {record['lr']:.2e}",
            f"grad {record['grad_norm']:.3g}",
            f"{record['tokens_per_s']:,.0f} tok/s",
            mfu_text,
            f"ETA {_duration(eta)}" if eta is not None else "",
        ]
        return " | ".join(p for p in parts if p)

    def logged(self, record: dict[str, Any]) -> None:
        """A logging step: the bar's postfix on a terminal, one log line otherwise."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{record['train_loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
        else:
            log.info("%s", self.line(record))

    def update(self, step: int) -> None:
        """`step` has ended (its evaluation included)."""
        if self._since is None:
            self._since = (time.perf_counter(), step)
        if self._bar is not None:
            self._bar.update(step - self.step)
        self.step = step

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
