"""Single-process checkpoints: written to a temporary directory, renamed when complete.

A crash mid-save leaves the previous checkpoint intact; `latest` names the newest complete one.
Everything stored is tensors and plain containers, so loading works with `weights_only=True`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def save_checkpoint(root: str | Path, step: int, state: dict[str, Any], keep: int = 3) -> Path:
    """Write `state` as checkpoints/step_N/state.pt atomically, update `latest`, prune to `keep`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = _step_dir(root, step)
    tmp = root / f".tmp_{final.name}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    with open(tmp / "state.pt", "rb+") as fh:
        os.fsync(fh.fileno())
    if final.exists():  # re-saving the same step (e.g. end of a resumed run): replace whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name + "\n")
    os.replace(latest_tmp, root / "latest")
    complete = sorted(p for p in root.glob("step_*") if (p / "state.pt").is_file())
    for old in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: str | Path) -> Optional[Path]:
    """The newest complete checkpoint under `root`, or None."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if (candidate / "state.pt").is_file():
            return candidate
    complete = sorted(p for p in root.glob("step_*") if (p / "state.pt").is_file())
    return complete[-1] if complete else None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    return torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=True)
