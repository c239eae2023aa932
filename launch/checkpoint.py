"""Checkpoints with `torch.distributed.checkpoint` (DCP): sharded, atomic, bounded, elastic.

Layout of `checkpoints/step_NNNNNNNN/`:
  dcp/           model + every optimizer (momentum, AdamW moments, fp32 calibration constants),
                 written by all ranks through DCP, so it loads at any world size;
  rank{r}.pt     rank r's data-loader state (its logical shards) and RNG states;
  zero/ + model.safetensors   instead of dcp/ for DeepSpeed ZeRO runs (same world size only);
  meta.json      step, tokens, world size, resolved config, git commit (written last).
Everything is written under `.tmp_step_N/` and renamed when complete, so a crash mid-save never
leaves a broken checkpoint; `latest` names the newest complete one. Loading uses DCP and
`torch.load(weights_only=True)`: nothing in a checkpoint can execute code.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from launch.distributed import DistEnv, barrier

log = logging.getLogger("orscale")

# DCP warns on every single-process save/load that it assumes no process group: that is intended.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

META = "meta.json"


def _complete(path: Path) -> bool:
    saved = (path / "dcp" / ".metadata").is_file() or (path / "zero" / "zero_meta.json").is_file()
    return (path / META).is_file() and saved


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def latest_checkpoint(root: str | Path) -> Optional[Path]:
    """The newest complete checkpoint under `root` (the `latest` pointer, else a scan), or None."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if _complete(candidate):
            return candidate
    done = sorted(p for p in root.glob("step_*") if _complete(p))
    return done[-1] if done else None


def rng_state() -> dict[str, Any]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save_checkpoint(root: str | Path, step: int, model: torch.nn.Module, optimizers: list,
                    loader_state: dict, meta: dict[str, Any], env: DistEnv, keep: int = 3,
                    zero: Any = None) -> Path:
    """Collective: every rank calls it. Returns the final directory. With a DeepSpeed `zero`
    engine, its own checkpoint format replaces dcp/ (under zero/; same world size only)."""
    root = Path(root)
    final = step_dir(root, step)
    tmp = root / f".tmp_{final.name}"
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # debris of an earlier crash mid-save
        tmp.mkdir(parents=True)
    barrier()
    if zero is not None:
        zero.save(str(tmp / "zero"), {})
        if env.is_main:  # ZeRO-1/2 keep whole weights on every rank: a safe copy for export/eval
            # Clones: ZeRO's params are views into its flat buffers, which safetensors refuses.
            weights = {k: v.detach().clone().contiguous() for k, v in zero.model.state_dict().items()}
            save_file(weights, str(tmp / "model.safetensors"))
    else:
        model_sd, optim_sd = get_state_dict(model, optimizers)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "dcp"))
    torch.save({"loader": loader_state, "rng": rng_state()}, tmp / f"rank{env.rank}.pt")
    barrier()
    if env.is_main:
        meta = {**meta, "step": step, "world_size": env.world_size}
        _write_durable(tmp / META, json.dumps(meta, indent=1))
        if final.exists():  # the same step saved again (e.g. SIGTERM right after a save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_durable(root / ".latest.tmp", final.name + "\n")
        os.replace(root / ".latest.tmp", root / "latest")
        done = sorted(p for p in root.glob("step_*") if _complete(p))
        for old in done[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def _write_durable(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def read_meta(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / META).read_text())


def load_checkpoint(path: str | Path, model: torch.nn.Module, optimizers: list, env: DistEnv,
                    zero: Any = None) -> dict[str, Any]:
    """Restore model and optimizers in place (any world size; ZeRO: the same). Returns meta plus
    `loader` (the merged shard states of every saving rank) and `rng` (this rank's, if the world
    size is the same)."""
    path = Path(path)
    if zero is not None:
        zero.load(str(path / "zero"))
    else:
        model_sd, optim_sd = get_state_dict(model, optimizers)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path / "dcp"))
        set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])
    meta = read_meta(path)
    merged: dict[str, Any] = {"shards": {}, "turn": 0}
    for r in range(meta["world_size"]):
        part = torch.load(path / f"rank{r}.pt", map_location="cpu", weights_only=True)
        merged["shards"].update(part["loader"]["shards"])
        if r == env.rank:
            merged["turn"] = part["loader"]["turn"]
            meta["rng"] = part["rng"]
    if meta["world_size"] != env.world_size:
        merged["turn"] = 0  # a new shard layout: the round-robin restarts, no document is lost
        meta.pop("rng", None)
    meta["loader"] = merged
    return meta


def load_model_weights(path: str | Path, model: torch.nn.Module) -> dict[str, Any]:
    """Model weights only (e.g. for export), into a plain single-process model. Returns meta."""
    path = Path(path)
    if (path / "model.safetensors").is_file():  # a ZeRO checkpoint
        model.load_state_dict(load_file(str(path / "model.safetensors")))
        return read_meta(path)
    sd = model.state_dict()
    dcp.load({"model": sd}, checkpoint_id=str(path / "dcp"))
    model.load_state_dict(sd)
    return read_meta(path)
