"""Checkpoints made of parts that save and load themselves (torchtitan's way): atomic, bounded,
elastic. The checkpointer never looks inside a part; it only orders the writes, publishes the
result atomically and finds complete checkpoints again.

Two kinds of part:
  * a *sharded* part writes its own files into the step directory, collectively on every rank —
    the engine (model + optimizers: `dcp/` through `torch.distributed.checkpoint`, or, for ZeRO,
    `zero/rank{r}.safetensors` of optimizer state by parameter name plus `model.safetensors`);
  * a *per-rank* part gives a small `state_dict()` (loader position, step and RNG); every rank's
    states go into `rank{r}.pt`, and on load the part receives the states of *every* saving rank
    (`load_rank_states`), so it can merge them when the world size changed.

Layout of `checkpoints/step_NNNNNNNN/`: the sharded parts' files, `rank{r}.pt`, `manifest.json`
(every file's size and checksum) and `meta.json` (step, tokens, world size, resolved config, git
commit; written last). Everything is written under
`.tmp_step_N/` and renamed when complete, so a crash mid-save never leaves a broken checkpoint;
`latest` names the newest complete one. Nothing read from a checkpoint can run code: per-rank files
load with `torch.load(weights_only=True)`, DCP through `launch.checkpoint.dcp_safe` (an allow-listed unpickler
for its metadata), ZeRO's state through safetensors.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from launch.checkpoint.manifest import write_manifest
from launch.runtime.process_group import DistEnv, barrier

META = "meta.json"
# 3: the loader addresses documents by (piece, row) (issue 9); 1 (no "format" key): by document
# index, one rank{r}.pt of {"loader", "rng"}. Older checkpoints export but do not resume.
FORMAT = 3


class ShardedPart(Protocol):
    def save(self, directory: Path) -> None: ...  # collective: every rank calls it

    def load(self, directory: Path) -> None: ...  # collective


class RankPart(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_rank_states(self, states: list[dict[str, Any]]) -> None: ...  # every saving rank's, in rank order


def is_complete(path: str | Path) -> bool:
    """A published checkpoint: meta.json is written last, just before the atomic rename."""
    return (Path(path) / META).is_file()


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under a checkpoints root (the `latest` pointer, else a scan)."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if is_complete(candidate):
            return candidate
    done = sorted(p for p in root.glob("step_*") if is_complete(p))
    return done[-1] if done else None


def read_meta(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / META).read_text())


def _write_durable(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


class Checkpointer:
    """Saves, loads and publishes checkpoints of `sharded` and `per_rank` parts under `root`.
    Every method is collective (call it on every rank); only rank 0 publishes."""

    def __init__(
        self,
        root: str | Path,
        env: DistEnv,
        sharded: Sequence[ShardedPart],
        per_rank: dict[str, RankPart],
        keep: int = 3,
    ) -> None:
        self.root, self.env, self.keep = Path(root), env, keep
        self.sharded, self.per_rank = list(sharded), dict(per_rank)

    def save(self, step: int, meta: dict[str, Any]) -> Path:
        """Write every part under `.tmp_step_N/`, then meta.json, rename, point `latest` at it and
        delete all but the newest `keep` complete checkpoints. Returns the final directory."""
        final = step_dir(self.root, step)
        tmp = self.root / f".tmp_{final.name}"
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # debris of an earlier crash mid-save
            tmp.mkdir(parents=True)
        barrier()
        for part in self.sharded:
            part.save(tmp)
        torch.save({name: part.state_dict() for name, part in self.per_rank.items()}, tmp / f"rank{self.env.rank}.pt")
        barrier()
        if self.env.is_main:
            write_manifest(tmp, exclude=(META,))  # sizes and checksums: a resume can tell damage
            _write_durable(
                tmp / META,
                json.dumps({**meta, "step": step, "world_size": self.env.world_size, "format": FORMAT}, indent=1),
            )
            if final.exists():  # the same step saved again (e.g. SIGTERM right after a save)
                shutil.rmtree(final)
            os.replace(tmp, final)
            _write_durable(self.root / ".latest.tmp", final.name + "\n")
            os.replace(self.root / ".latest.tmp", self.root / "latest")
            done = sorted(p for p in self.root.glob("step_*") if is_complete(p))
            for old in done[: -self.keep] if self.keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
        barrier()
        return final

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore every part from the checkpoint at `path` (saved at any world size the parts
        accept); returns its meta."""
        path = Path(path)
        meta = read_meta(path)
        for part in self.sharded:
            part.load(path)
        states = [
            torch.load(path / f"rank{r}.pt", map_location="cpu", weights_only=True) for r in range(meta["world_size"])
        ]
        for name, rank_part in self.per_rank.items():
            rank_part.load_rank_states([state[name] for state in states])
        return meta
