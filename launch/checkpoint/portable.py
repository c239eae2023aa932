"""Checkpoints that move between backends (docs/running.md, "Checkpoints move between backends"): either on-disk
layout, `dcp/` (one process, DDP, FSDP2) or `zero/` + `model.safetensors` (ZeRO-1/2), read back as one *logical*
state (every parameter's weights and optimizer state as whole tensors by fully-qualified name), which each engine
cuts into its own layout. Nothing read here can run code.

Under a process group the logical state is read once, on rank 0 (`read_on_rank0`), and handed to the
other ranks one tensor at a time (torch's `broadcast_from_rank0` for the PyTorch-native engines,
`FromRank0` for ZeRO's), so no other rank reads the checkpoint or holds it whole."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from launch.checkpoint.dcp_safe import dcp_load, load_metadata
from launch.runtime.process_group import rank0_decides
from orscale.distributed.zero_checkpoint import read_logical_state
from orscale.routing import canonical_name

MODEL, STATE = "model.", "optim.state."  # DCP's flattened keys of ModelAndOptimizers' state dict
ZERO_TAG = "zero"  # the ZeRO layout: <checkpoint>/zero/rank<r>.safetensors and zero/meta.json
ZERO_META = "meta.json"
ZERO_FORMAT = "orscale-zero-2"  # 1: DeepSpeed's own files (zero_meta.json), same world size only

LogicalState = dict[str, dict[str, Any]]  # {parameter name: {state key: value}}


def checkpoint_kind(path: Path) -> str:
    """`dcp` or `zero` (what wrote the checkpoint at `path`)."""
    if (path / "dcp").is_dir():
        return "dcp"
    if (path / ZERO_TAG).is_dir() and (path / "model.safetensors").is_file():
        return "zero"
    raise ValueError(f"{path} holds neither dcp/ nor zero/ + model.safetensors: not a checkpoint of this trainer")


def check_checkpoint_layout(path: Path) -> dict[str, Any]:
    """What wrote the checkpoint at `path` ({"kind": dcp | zero, ...the ZeRO meta}), or a one-line
    ValueError for what no engine here loads (DeepSpeed's own files of an earlier version)."""
    if (path / ZERO_TAG / "zero_meta.json").is_file():
        raise ValueError(
            f"{path} holds DeepSpeed's own ZeRO files, written by an earlier version of this trainer "
            "(they load only at their world size, through pickle); resume it with that version, "
            "or start a new run.dir (its model.safetensors still exports: python -m launch.export)"
        )
    kind = checkpoint_kind(path)
    if kind == "dcp":
        return {"kind": kind}
    meta_path = path / ZERO_TAG / ZERO_META
    if not meta_path.is_file():
        raise ValueError(f"{path} has zero/ but no {ZERO_TAG}/{ZERO_META}: it was not written completely")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != ZERO_FORMAT:
        raise ValueError(f"{meta_path} is in format {meta.get('format')!r}; this trainer reads {ZERO_FORMAT}")
    return {"kind": kind, **meta}


def _dcp_metadata(path: Path) -> Metadata:
    with open(path / "dcp" / ".metadata", "rb") as fh:
        return load_metadata(fh)


def dcp_stores_whole(path: Path) -> bool:
    """Whether the DCP checkpoint at `path` holds each of the model's tensors in one piece (written by
    one process or by DDP), rather than cut into shards (FSDP2): its metadata alone, no tensor read."""
    entries = _dcp_metadata(path).state_dict_metadata.items()
    return all(
        len(md.chunks) == 1 for key, md in entries if key.startswith(MODEL) and isinstance(md, TensorStorageMetadata)
    )


def _dcp_tensors(path: Path, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """Every entry of a DCP checkpoint under `prefixes`, read whole by this process alone (tensors
    as the full logical tensor, whatever sharding wrote it; non-tensor entries as the values they
    hold). No collective: every rank that calls it reads every byte."""
    template: dict[str, Any] = {}
    for key, md in _dcp_metadata(path).state_dict_metadata.items():
        if key.startswith(prefixes):
            if isinstance(md, TensorStorageMetadata):
                template[key] = torch.zeros(md.size, dtype=md.properties.dtype, device="cpu")
            else:
                template[key] = None  # a non-tensor entry (an int step): DCP puts the value there
    dcp_load(template, str(path / "dcp"), no_dist=True)
    return template


def dcp_entries(path: Path) -> dict[str, Any]:
    """A DCP checkpoint's weights and optimizer state, whole, in one read: its flattened keys
    (`model.<name>`, `optim.state.<name>.<key>`; MODEL and STATE)."""
    return _dcp_tensors(path, (MODEL, STATE))


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The model's tensors by (canonical) name, whole, on the CPU."""
    if checkpoint_kind(path) == "dcp":
        return {k[len(MODEL) :]: v for k, v in _dcp_tensors(path, (MODEL,)).items()}
    with safe_open(str(path / "model.safetensors"), framework="pt", device="cpu") as fh:
        return {canonical_name(k): fh.get_tensor(k) for k in fh.keys()}


def read_optimizer_state(path: Path, shapes: dict[str, torch.Size]) -> LogicalState:
    """Every parameter's optimizer state, whole, by (canonical) parameter name. `shapes`: the
    parameters' shapes by canonical name (a ZeRO checkpoint stores flat pieces)."""
    if checkpoint_kind(path) == "zero":
        with safe_open(str(path / "model.safetensors"), framework="pt", device="cpu") as fh:
            saved_names = list(fh.keys())  # the parameter names this ZeRO checkpoint uses
        named = {saved: shapes[canonical_name(saved)] for saved in saved_names if canonical_name(saved) in shapes}
        return {canonical_name(k): v for k, v in read_logical_state(path / "zero", named).items()}
    out: LogicalState = {}
    for key, value in _dcp_tensors(path, (STATE,)).items():
        name, leaf = key[len(STATE) :].rsplit(".", 1)
        out.setdefault(name, {})[leaf] = value
    return out


def calibration_constants(path: Path, shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """{matrix name: c} of a checkpoint (OrScale-LM's constants; {} for other optimizers)."""
    return {name: st["c"] for name, st in read_optimizer_state(path, shapes).items() if "c" in st}


T = TypeVar("T")


def read_on_rank0(read: Callable[[], T]) -> T | None:
    """`read()` on rank 0 alone (and on a process without a group); None on the other ranks. A failed
    read is raised on every rank as the same line (`rank0_decides`), so none waits for a broadcast
    that will not come. Collective."""
    held: list[T] = []
    rank0_decides(lambda: held.append(read()))
    return held[0] if held else None


class FromRank0:
    """Entries ({name: tensor or value}) read on rank 0 alone, handed to every rank one at a time:
    `names` at once (one small broadcast), then iterating yields (name, value) in rank 0's order,
    each tensor broadcast on `device` as it comes, so a rank holds only what it keeps. Collective:
    every rank iterates to the end. Without a process group, the entries as read."""

    def __init__(self, read: Callable[[], dict[str, Any]], device: torch.device) -> None:
        self.device = device
        self._entries = read_on_rank0(read) or {}
        header: list[Any] = [[(k, _spec(v)) for k, v in self._entries.items()]]
        if _grouped():
            dist.broadcast_object_list(header, src=0)
        self._header: list[tuple[str, Any]] = header[0]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._header]

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for name, spec in self._header:
            if not isinstance(spec, _TensorSpec):
                yield name, spec  # a Python value or a 0-d tensor: it came with the names
            elif not _grouped():
                yield name, self._entries.pop(name)
            else:
                if dist.get_rank() == 0:
                    value = self._entries.pop(name).to(self.device)
                else:
                    value = torch.empty(spec.shape, dtype=spec.dtype, device=self.device)
                dist.broadcast(value, src=0)
                yield name, value


class _TensorSpec:
    """A tensor's shape and dtype: what a receiving rank allocates before the broadcast."""

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype = tuple(t.shape), t.dtype


def _spec(value: Any) -> Any:
    return _TensorSpec(value) if isinstance(value, torch.Tensor) and value.dim() > 0 else value


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
