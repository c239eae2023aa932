"""The one seam between the trainer and CUDA's allocator history (`train.memory_snapshot`): every call
the trainer makes to `torch.cuda.memory` goes through these functions, so a test on a machine
without a GPU replaces this module's functions and runs the rest of the path for real."""

from __future__ import annotations

from pathlib import Path

import torch


def available(device: torch.device) -> bool:
    """Whether `device` has an allocator whose history can be recorded (a CUDA device)."""
    return device.type == "cuda" and torch.cuda.is_available()


def start_recording(max_entries: int) -> None:
    """Record every allocation and free from now on, with its Python and C++ stack (the newest
    `max_entries` events are kept)."""
    torch.cuda.memory._record_memory_history(enabled="all", max_entries=max_entries)


def stop_recording() -> None:
    torch.cuda.memory._record_memory_history(enabled=None)


def dump(path: Path) -> None:
    """The allocator's state and recorded history as a pickle that https://pytorch.org/memory_viz
    opens (dragged onto the page; nothing is uploaded)."""
    torch.cuda.memory._dump_snapshot(str(path))
