"""World-size-free checkpoints of ``ZeroShardedOptimizer`` (DeepSpeed ZeRO-1/2).

DeepSpeed's own checkpoint pickles each rank's flat partition, so it only loads at the size that
wrote it (and unpickles arbitrary objects on the way). Here the state is addressed by parameter
name instead, in safetensors files (no pickle anywhere):

* **Flat (AdamW) state** lives on the ZeRO partitions: every rank writes the pieces of each
  parameter that its partition holds, as ``flat/<param>/<key>@<offset>`` (1-D, offset into the
  flattened parameter), and 0-d state (AdamW's step) as ``flat/<param>/<key>``.
* **Owner state** (Muon momentum and calibration constant, CBP / LAMB / LARS moments) lives with
  whole tensors on their owner rank: ``owner/<param>/<key>``. Python numbers (CBP's step count)
  go to the file's JSON metadata.

A load at any data-parallel size (and either stage: the state is the same) rebuilds this rank's
partition state from the pieces that overlap it, and each owner reads whole tensors of the
matrices it owns now. Weights are not here: the engine restores them from ``model.safetensors``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from orscale.distributed.zero import ROLE, ZeroShardedOptimizer
from orscale.distributed.zero_layout import MatrixLayout
from orscale.optim_common import placed_state_value

NUMBERS = "orscale_numbers"  # safetensors metadata key: JSON of the non-tensor state values


def _flat_layouts(opt: ZeroShardedOptimizer) -> list[tuple[dict[str, Any], MatrixLayout]]:
    """(param group, its layout over the ZeRO partitions) for every flat (AdamW) group."""
    return [(group, layout) for group, layout in opt.group_layouts() if group[ROLE] != "matrix"]


def _cpu(t: Tensor) -> Tensor:
    return t.detach().to("cpu", copy=True).contiguous()


def save_zero_state(opt: ZeroShardedOptimizer, path: Path) -> None:
    """Write this rank's share of the optimizer state to `path` (one safetensors file per rank)."""
    write_zero_state(stage_zero_state(opt), path)


def stage_zero_state(
    opt: ZeroShardedOptimizer, to_host: Callable[[Tensor], Tensor] = _cpu
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """This rank's share of the optimizer state as host copies, by name (`write_zero_state`'s input):
    {key: tensor} and {key: Python number}. `to_host` makes each copy (a background save pins them
    when the state is on a GPU); nothing returned shares memory with the optimizer."""
    tensors: dict[str, Tensor] = {}
    numbers: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        if isinstance(value, Tensor):
            tensors[key] = to_host(value)
        else:
            numbers[key] = value

    for group, layout in _flat_layouts(opt):
        part = group["params"][0]
        mine = [pc for ps in layout.pieces for pc in ps if pc.rank == layout.rank]
        for key, value in opt.state.get(part, {}).items():
            if isinstance(value, Tensor) and value.dim() == 1 and value.numel() == part.numel():
                for pc in mine:
                    tensors[f"flat/{layout.names[pc.k]}/{key}@{pc.mat_off}"] = to_host(
                        value.narrow(0, pc.part_off, pc.n)
                    )
            else:  # per-partition scalars (AdamW's step): the same for every parameter of the group
                for pc in mine:
                    put(f"flat/{layout.names[pc.k]}/{key}", value)
    for name, w in opt.owned_tensors():
        for key, value in opt.owner_state(w).items():
            put(f"owner/{name}/{key}", value)
    return tensors, numbers


def write_zero_state(staged: tuple[dict[str, Tensor], dict[str, Any]], path: Path) -> None:
    """Write `stage_zero_state`'s copies to `path` (safetensors; the numbers in its JSON metadata)."""
    tensors, numbers = staged
    save_tensors(tensors, path, metadata={NUMBERS: json.dumps(numbers)})


def save_tensors(tensors: dict[str, Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' `save_file`, leaving `path` with the mode the umask gives a file written plainly (as
    the rest of a checkpoint is): safetensors writes through a temporary file of mode 0600 and renames it."""
    save_file(tensors, str(path), metadata=metadata)
    path.chmod(0o666 & ~_umask())


def _umask() -> int:
    """This process's umask, read without setting it (Linux's /proc; elsewhere set and put back)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _SavedState:
    """Every rank file's keys (headers only), so a rank reads just the slices it needs."""

    def __init__(self, files: list[Path], stack: contextlib.ExitStack) -> None:
        if not files:
            raise FileNotFoundError("no rank*.safetensors optimizer state")
        self.whole: dict[str, Any] = {}  # key -> file handle
        self.pieces: dict[str, list[tuple[int, int, Any, str]]] = defaultdict(list)  # (param/key) -> pieces
        self.numbers: dict[str, Any] = {}
        for f in files:
            fh = stack.enter_context(safe_open(str(f), framework="pt"))
            self.numbers.update(json.loads((fh.metadata() or {}).get(NUMBERS, "{}")))
            for key in fh.keys():
                if "@" in key:
                    base, off = key.rsplit("@", 1)
                    n = fh.get_slice(key).get_shape()[0]
                    self.pieces[base].append((int(off), n, fh, key))
                else:
                    self.whole[key] = fh

    def has_pieces(self, key: str) -> bool:
        return key in self.pieces

    def value(self, key: str) -> Any:
        if key in self.whole:
            return self.whole[key].get_tensor(key)
        return self.numbers[key]

    def keys_under(self, prefix: str) -> list[str]:
        found = {k[len(prefix) :] for k in self.whole if k.startswith(prefix)}
        found |= {k[len(prefix) :] for k in self.numbers if k.startswith(prefix)}
        found |= {k[len(prefix) :] for k in self.pieces if k.startswith(prefix)}
        return sorted(found)

    def fill(self, base: str, out: Tensor, mat_off: int) -> None:
        """Copy elements [mat_off, mat_off + len(out)) of the flattened saved tensor into `out`."""
        n, filled = out.numel(), 0
        for off, size, fh, key in self.pieces.get(base, []):
            lo, hi = max(mat_off, off), min(mat_off + n, off + size)
            if hi > lo:
                out[lo - mat_off : hi - mat_off].copy_(fh.get_slice(key)[lo - off : hi - off])
                filled += hi - lo
        if filled != n:
            raise ValueError(f"the checkpoint holds {filled} of {n} elements of {base}")


class LogicalState:
    """Optimizer state by parameter name, whole tensors ({name: {key: value}}: what any backend's
    checkpoint reads back as, `launch.checkpoint.portable`), seen the way `load_zero_state` reads the
    rank files: per-element state of a flat (AdamW) parameter as pieces, the rest whole."""

    def __init__(self, state: dict[str, dict[str, Any]]) -> None:
        self.state = state

    def _get(self, key: str) -> Any:
        _, rest = key.split("/", 1)  # "flat/<name>/<key>" or "owner/<name>/<key>"
        name, leaf = rest.rsplit("/", 1)
        return self.state[name][leaf]

    def has_pieces(self, key: str) -> bool:
        try:
            value = self._get(key)
        except KeyError:
            return False
        return key.startswith("flat/") and isinstance(value, Tensor) and value.dim() > 0

    def value(self, key: str) -> Any:
        return self._get(key)

    def keys_under(self, prefix: str) -> list[str]:
        name = prefix.split("/", 1)[1].rstrip("/")
        return sorted(self.state.get(name, {}))

    def fill(self, base: str, out: Tensor, mat_off: int) -> None:
        flat = self._get(base).reshape(-1)
        if mat_off + out.numel() > flat.numel():
            raise ValueError(f"{base} holds {flat.numel()} elements, fewer than the {mat_off + out.numel()} asked")
        out.copy_(flat[mat_off : mat_off + out.numel()])


def read_logical_state(directory: Path, shapes: dict[str, torch.Size]) -> dict[str, dict[str, Any]]:
    """Every parameter's optimizer state from the rank files in `directory`, whole tensors in the
    parameters' shapes ({name: {key: value}}), whatever data-parallel size wrote them."""
    out: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        saved = _SavedState(sorted(directory.glob("rank*.safetensors")), stack)
        for name, shape in shapes.items():
            state: dict[str, Any] = {}
            for key in saved.keys_under(f"flat/{name}/"):
                base = f"flat/{name}/{key}"
                if saved.has_pieces(base):
                    full = torch.zeros(math.prod(shape), dtype=torch.float32, device="cpu")
                    saved.fill(base, full, 0)
                    state[key] = full.view(shape)
                else:
                    state[key] = saved.value(base)
            for key in saved.keys_under(f"owner/{name}/"):
                state[key] = saved.value(f"owner/{name}/{key}")
            if state:
                out[name] = state
    return out


def names_read_whole(opt: ZeroShardedOptimizer) -> set[str]:
    """The parameters whose whole optimizer-state tensors `load_zero_state` reads on this rank from a
    `LogicalState`: those with a piece in this rank's flat (AdamW) partitions (in a group without
    one, its first, whose zeros it then takes) and the matrices this rank owns. A rank receiving
    another backend's state may drop the others' tensors (0-d values and numbers it keeps)."""
    names: set[str] = set()
    for _, layout in _flat_layouts(opt):
        mine = {layout.names[pc.k] for ps in layout.pieces for pc in ps if pc.rank == layout.rank}
        names |= mine or set(layout.names[:1])
    return names | {name for name, _ in opt.owned_tensors()}


def load_zero_state(
    opt: ZeroShardedOptimizer, directory: Path | None = None, source: LogicalState | None = None
) -> None:
    """Rebuild this rank's optimizer state from the rank files in `directory` (whatever data-parallel
    size wrote them) or from another backend's checkpoint read as a `LogicalState`."""
    with contextlib.ExitStack() as stack:
        if source is not None:
            saved: _SavedState | LogicalState = source
        elif directory is not None:
            saved = _SavedState(sorted(directory.glob("rank*.safetensors")), stack)
        else:
            raise ValueError("load_zero_state needs the rank files' directory or a LogicalState")
        for group, layout in _flat_layouts(opt):
            part = group["params"][0]
            keys = {k for name in layout.names for k in saved.keys_under(f"flat/{name}/")}
            state: dict[str, Any] = {}
            for key in sorted(keys):
                if any(saved.has_pieces(f"flat/{name}/{key}") for name in layout.names):
                    buf = torch.zeros(part.numel(), dtype=torch.float32, device="cpu")
                    for pc in (pc for ps in layout.pieces for pc in ps if pc.rank == layout.rank):
                        saved.fill(
                            f"flat/{layout.names[pc.k]}/{key}", buf[pc.part_off : pc.part_off + pc.n], pc.mat_off
                        )
                    state[key] = buf
                else:
                    name = next(n for n in layout.names if key in saved.keys_under(f"flat/{n}/"))
                    state[key] = saved.value(f"flat/{name}/{key}")
            # torch's own placement (fused AdamW, the CUDA default, reads `step` on the device)
            opt.state[part] = {k: placed_state_value(group, part, k, v) for k, v in state.items()}
        for name, w in opt.owned_tensors():
            owner_keys = saved.keys_under(f"owner/{name}/")
            if not owner_keys:
                raise ValueError(f"the checkpoint holds no optimizer state for {name}")
            owned, group = opt.owner_state(w), opt.owner_group(w)
            for key in owner_keys:
                owned[key] = placed_state_value(group, w, key, saved.value(f"owner/{name}/{key}"))
