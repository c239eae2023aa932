"""Looking at checkpoints from outside a run: find the newest complete one, check that one is intact
before trusting it, and read just the model (weights into a model, or a whole single-process GPT with
its config and tokenizer: `load_gpt`, for export and offline evaluation). Nothing read here can run
code: per-rank files through `weights_only=True`, DCP metadata through `dcp_safe`, safetensors."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from launch.checkpoint.checkpointer import META, checkpoint_dirs, is_complete, latest_checkpoint, read_meta
from launch.checkpoint.dcp_safe import dcp_load, load_metadata
from launch.checkpoint.manifest import verify_manifest
from launch.errors import UserError
from models.gpt import GPT, GPTConfig


def check_loadable(path: str | Path) -> str | None:
    """None if the checkpoint looks loadable; otherwise what is wrong, naming the file. Checks the
    manifest (sizes, checksums) and reads the small files the way a load will (meta.json, the
    per-rank states, DCP's metadata through the allow-listed unpickler) — never running code."""
    path = Path(path)
    problem = verify_manifest(path)
    if problem is not None:
        return problem
    current = path / META
    try:
        meta = read_meta(path)
        for r in range(int(meta["world_size"])):
            current = path / f"rank{r}.pt"
            torch.load(current, map_location="cpu", weights_only=True)
        if (path / "dcp").is_dir():
            current = path / "dcp" / ".metadata"
            with open(current, "rb") as fh:
                load_metadata(fh)
        for current in sorted(path.rglob("*.safetensors")):  # headers: a truncated file fails here
            with safe_open(str(current), framework="pt") as fh:
                fh.keys()
    except pickle.UnpicklingError:  # weights_only refused an object: never pass on torch's "load it unsafely" hint
        return f"{current} holds objects other than tensors and plain values, which this trainer never writes: refused"
    except Exception as err:  # any failure to read is the same answer: do not resume from it
        return f"{current} cannot be read ({type(err).__name__}: {_first_line(err)})"
    return None


def _first_line(err: BaseException) -> str:
    """An exception's first line, without a library's advice to retry with weights_only=False."""
    line = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return "" if "weights_only" in line else line


def find_checkpoint(path: str | Path) -> Path | None:
    """A complete checkpoint from a step directory, a checkpoints root or a run directory (the
    newest one of the latter two), or None."""
    path = Path(path)
    if is_complete(path):
        return path
    return latest_checkpoint(path) or latest_checkpoint(path / "checkpoints")


def require_checkpoint(path: str | Path) -> Path:
    """`find_checkpoint`, or a one-line UserError saying what was expected at `path`."""
    found = find_checkpoint(path)
    if found is None:
        raise UserError(
            f"no checkpoint at '{path}' (expected a complete step directory, a checkpoints "
            "root with a `latest` file, or a run directory)"
        )
    return found


def load_model_weights(path: str | Path, model: torch.nn.Module) -> dict[str, Any]:
    """Model weights only (export, evaluation) into a plain single-process model; returns meta.
    Reads the `model.safetensors` copy of a ZeRO checkpoint, else the `model.*` entries of DCP."""
    path = Path(path)
    if (path / "model.safetensors").is_file():
        model.load_state_dict(load_file(str(path / "model.safetensors")))
    else:
        sd = model.state_dict()
        dcp_load({"model": sd}, str(path / "dcp"))
        model.load_state_dict(sd)
    return read_meta(path)


def load_gpt(path: str | Path) -> tuple[dict[str, torch.Tensor], GPTConfig, str, Path]:
    """(state dict, GPTConfig, tokenizer path as recorded, the step directory) of the checkpoint at
    `path` (a step directory, a checkpoints root or a run directory), checked intact first; a
    one-line UserError for what is missing or damaged."""
    found = require_checkpoint(path)
    meta = read_meta(found)
    recorded = meta.get("model")
    if not isinstance(recorded, dict):
        raise UserError(f"checkpoint '{found}' records no model config in its meta.json")
    names = {f.name for f in dataclasses.fields(GPTConfig)}
    cfg = GPTConfig(**{k: v for k, v in recorded.items() if k in names})
    with torch.device("meta"):  # shapes only: the checkpoint supplies every value
        model = GPT(cfg)
    model.to_empty(device="cpu")
    problem = check_loadable(found)
    if problem is not None:
        raise UserError(f"checkpoint '{found}' is damaged: {problem}")
    load_model_weights(found, model)
    try:
        tokenizer = str(meta["config"]["data"]["tokenizer"])
    except (KeyError, TypeError):
        raise UserError(f"checkpoint '{found}' records no data.tokenizer in its config") from None
    return dict(model.state_dict()), cfg, tokenizer, found


def newest_intact_checkpoint(root: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint under `root` that is published (meta.json), intact and readable, or None;
    and (directory, what is wrong with it) for each checkpoint directory newer than it, newest first:
    every one of them when none is intact. Each checkpoint is checked once."""
    damaged: list[tuple[Path, str]] = []
    for path in reversed(checkpoint_dirs(root)):
        problem = check_loadable(path) if is_complete(path) else f"{path / META} is missing"
        if problem is None:
            return path, damaged
        damaged.append((path, problem))
    return None, damaged
