"""Checkpoints made of parts that save and load themselves (torchtitan's way): atomic, bounded,
elastic. The checkpointer never looks inside a part; it only orders the writes, publishes the
result atomically and finds complete checkpoints again (the layout: ARCHITECTURE.md, "One
checkpoint"; background saves: `launch.checkpoint.async_writer`).

A *sharded* part (the engine) writes its own files into the step directory, collectively on every
rank; a *per-rank* part gives a small `state_dict()` (loader position, step and RNG) and on load
receives the states of *every* saving rank (`load_rank_states`), so it can merge them when the
world size changed. Nothing read from a checkpoint can run code: per-rank files load with
`torch.load(weights_only=True)`, DCP through `dcp_safe`, ZeRO's state through safetensors.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.api import CheckpointException

from launch.checkpoint.async_writer import BackgroundWrite, pause_for_tests, writer_group
from launch.checkpoint.disk import describe_failure, dir_bytes, free_bytes, mount_point, size_text
from launch.checkpoint.manifest import verify_manifest, write_manifest
from launch.errors import UserError
from launch.runtime.process_group import DistEnv, all_gather_objects, barrier

log = logging.getLogger("orscale")

META = "meta.json"
_STEP = re.compile(r"step_\d{8}")
# 3: the loader addresses documents by (piece, row) (docs/data.md); 1 (no "format" key): by document
# index, one rank{r}.pt of {"loader", "rng"}. Older checkpoints export but do not resume.
FORMAT = 3


class SaveError(UserError):
    """A checkpoint could not be written (full disk, quota, permission, read-only file system)."""


class ShardedPart(Protocol):
    def save(self, directory: Path) -> None: ...  # collective: every rank calls it

    # Collective: copy the state to host memory now; the returned function writes that copy into
    # `directory` (on a background thread, with `group` for any collective it needs).
    def stage(self, directory: Path, group: Any) -> Callable[[], None]: ...

    def load(self, directory: Path) -> None: ...  # collective


class RankPart(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_rank_states(self, states: list[dict[str, Any]]) -> None: ...  # every saving rank's, in rank order


def is_complete(path: str | Path) -> bool:
    """A published checkpoint: meta.json is written last, just before the atomic rename."""
    return (Path(path) / META).is_file()


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def checkpoint_dirs(root: str | Path) -> list[Path]:
    """Every `step_NNNNNNNN` directory under a checkpoints root, oldest first, complete or not
    (moved-aside ones, `step_N.damaged-...`, are not checkpoints any more)."""
    root = Path(root)
    return sorted(p for p in root.glob("step_*") if _STEP.fullmatch(p.name) and p.is_dir()) if root.is_dir() else []


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under a checkpoints root (the `latest` pointer, else a scan)."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if is_complete(candidate):
            return candidate
    done = [p for p in checkpoint_dirs(root) if is_complete(p)]
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
        optional: Collection[str] = (),
    ) -> None:
        """`optional`: per-rank parts that a checkpoint of this format may lack (added after such
        checkpoints were written); loading one of those leaves the part as it was built."""
        self.root, self.env, self.keep = Path(root), env, keep
        self.sharded, self.per_rank = list(sharded), dict(per_rank)
        self.optional = frozenset(optional)
        self.group: Any | None = None  # the background write's process group (async_writer.writer_group)
        self._pending: BackgroundWrite | None = None

    def enable_background(self) -> None:
        """Allow `save(..., background=True)`. Collective: makes the writer's process group."""
        self.group = writer_group(self.env.world_size)

    def save(self, step: int, meta: dict[str, Any], background: bool = False) -> Path:
        """Write every part under `.tmp_step_N/`, then meta.json, rename, point `latest` at it and
        delete all but the newest `keep` complete checkpoints at or below this step. Returns the
        final directory. A write that fails (full disk, quota, permission, read-only file system)
        on any rank raises SaveError on every rank with one line; the temporary directory is
        removed and every earlier checkpoint is left as it was.

        `background` (after `enable_background`): only the staging (a host copy of every part, and
        the small per-rank files) happens here; a thread writes the copy and then publishes exactly
        as above, so the checkpoint appears complete or not at all. `wait()` returns it, or raises
        that write's SaveError. A write still in flight is waited for first: at most one at a time."""
        self.wait()
        final = step_dir(self.root, step)
        tmp = self.root / f".tmp_{final.name}"
        latest = latest_checkpoint(self.root) if self.root.is_dir() else None
        # Every rank sizes it: whichever rank's write fails says what the checkpoint needs.
        need = dir_bytes(latest) if latest is not None else 0
        if self.env.is_main and need and free_bytes(self.root) < need * 1.05:
            log.warning(
                "checkpoint step %d may not fit: the previous one took %s and %s is free on %s",
                step,
                size_text(need),
                size_text(free_bytes(self.root)),
                mount_point(self.root),
            )

        def stage(work: Callable[[], None], group: Any = None) -> None:
            error: BaseException | None = None
            try:
                work()
            except (OSError, RuntimeError, CheckpointException) as err:  # DCP's is a BaseException
                error = err
            self._agree(error, step, need, latest, tmp, group)

        def prepare() -> None:
            if self.env.is_main:
                shutil.rmtree(tmp, ignore_errors=True)  # debris of an earlier crash mid-save
                tmp.mkdir(parents=True)

        def write_rank_states() -> None:
            states = {name: part.state_dict() for name, part in self.per_rank.items()}
            torch.save(states, tmp / f"rank{self.env.rank}.pt")

        def write_parts() -> None:
            for part in self.sharded:
                part.save(tmp)
            write_rank_states()

        writers: list[Callable[[], None]] = []

        def stage_parts() -> None:
            writers.extend(part.stage(tmp, self.group) for part in self.sharded)
            write_rank_states()  # a few KiB (loader position, step, RNG): written now, at its step

        def write_staged() -> None:
            for write in writers:
                write()
            pause_for_tests(step)

        def publish() -> None:
            if self.env.is_main:
                write_manifest(tmp, exclude=(META,))  # sizes and checksums: a resume can tell damage
                body = {**meta, "step": step, "world_size": self.env.world_size, "format": FORMAT}
                _write_durable(tmp / META, json.dumps(body, indent=1))
                self._make_room(final)
                os.replace(tmp, final)
                _write_durable(self.root / ".latest.tmp", final.name + "\n")
                os.replace(self.root / ".latest.tmp", self.root / "latest")
                self._prune(step)

        stage(prepare)
        if not background:
            stage(write_parts)
            stage(publish)
            barrier()
            return final
        if self.group is None and self.env.distributed:
            raise RuntimeError("Checkpointer.save(background=True) needs enable_background() first")
        stage(stage_parts)

        def finish() -> Path:  # on the writer's thread; its collectives on the writer's group
            stage(write_staged, self.group)
            stage(publish, self.group)
            barrier(self.group)
            log.info("checkpoint: %s (written in the background, %.1f s)", final, time.perf_counter() - started)
            return final

        started = time.perf_counter()
        self._pending = BackgroundWrite(step, finish)
        return final

    def wait(self) -> Path | None:
        """The background write in flight, once published (None when there is none); raises its
        SaveError. Every rank gets the same outcome: the ranks agreed on it on the writer's thread."""
        pending, self._pending = self._pending, None
        return pending.wait() if pending is not None else None

    def close(self) -> None:
        """Wait for a write in flight (a run that stops on an error still publishes the checkpoint
        it staged, if it can); its failure is logged, not raised over the error that ends the run."""
        try:
            self.wait()
        except (SaveError, RuntimeError, CheckpointException) as err:
            log.error("the checkpoint written in the background failed: %s", str(err).splitlines()[0])

    def _agree(
        self, error: BaseException | None, step: int, need: int, latest: Path | None, tmp: Path, group: Any = None
    ) -> None:
        """Collective: every rank learns whether any rank failed; on failure rank 0 removes the
        temporary directory and every rank raises SaveError with the same line (an error that is
        not a file-system failure is re-raised as it is where it happened)."""
        line, written = None, 0
        if error is not None:
            # Sized only on a failure, on the failing rank: walking `tmp` on every stage raced with
            # rank 0's publish, which renames it away while another rank is still reading it.
            written = dir_bytes(tmp)
            line = describe_failure(error, self.root, need, written, latest)
            if line is None:
                line = f"rank {self.env.rank} failed: {type(error).__name__}: {str(error).splitlines()[0]}"
        lines = all_gather_objects(line, group)
        failed = next((x for x in lines if x is not None), None)
        if failed is None:
            return
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if error is not None and describe_failure(error, self.root, need, written, latest) is None:
            raise error
        raise SaveError(f"checkpoint step {step} not written: {failed}")

    def _make_room(self, final: Path) -> None:
        """`final` may exist: the same step saved again (SIGTERM right after a save) is replaced; a
        damaged one (a resume from an earlier checkpoint) is moved aside, never deleted."""
        if not final.exists():
            return
        if is_complete(final) and verify_manifest(final) is None:  # intact: its files match its manifest
            shutil.rmtree(final)
            return
        aside = final.with_name(f"{final.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(final, aside)
        log.warning("checkpoint %s was damaged: moved aside to %s (not deleted)", final.name, aside.name)

    def _prune(self, step: int) -> None:
        """Keep the newest `keep` complete checkpoints at or below `step`; never touch a newer one (a
        damaged checkpoint a resume skipped stays where it is, for whoever wants to recover it)."""
        if self.keep <= 0:
            return
        last = step_dir(self.root, step).name
        done = [p for p in checkpoint_dirs(self.root) if is_complete(p) and p.name <= last]
        for old in done[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

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
            if name in self.optional and any(name not in state for state in states):
                continue
            rank_part.load_rank_states([state[name] for state in states])
        return meta
