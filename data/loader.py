"""Training windows for one rank, a step at a time, read ahead in a background thread; the fixed
validation set.

The training stream is `data.logical_shards` = S shards (`data/shard_stream.py`), a number fixed by
the config and independent of the world size: training piece p (counted from the piece where the
validation set ends) belongs to shard p mod S. Rank r owns the shards s with s mod W == r and opens
only their pieces. Every step takes the same N/S windows from every shard (N windows per step), in
the order (i, s) for i < N/S and s ascending, so the *global* set of windows of step k is the same
on 1, 2 or 4 ranks and after a resume on another world size; a rank holds the windows of its own
shards, in that order.

Reading, tokenising and packing run `data.prefetch_steps` steps ahead in a thread (the tokenizer
and parquet reader release the GIL). Each produced step carries a snapshot of the shard states
after it; the state a checkpoint saves is the snapshot of the last step the trainer *consumed*,
so prefetching never changes what a resume sees.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import numpy as np
import torch

from data.data_config import DataConfig
from data.data_errors import DataError
from data.documents import Documents
from data.notices import Passes
from data.shard_stream import ShardStream
from data.sources.registry import source_of

log = logging.getLogger("orscale.data")


def key_values(described: dict[str, Any]) -> str:
    """`key=value, ...`: a corpus's description as a message line shows it."""
    return ", ".join(f"{key}={value}" for key, value in described.items())


def build_val_set(cfg: DataConfig, docs: Documents) -> tuple[torch.Tensor, tuple[int, int]]:
    """The first documents of the corpus, packed into exactly val_tokens / seq_len windows.

    Returns (windows [n, seq_len + 1], (piece, row) where training starts). The validation
    documents are never trained on, and the set is identical in every run and at every world size.
    """
    n_windows, T = cfg.val_tokens // cfg.seq_len, cfg.seq_len
    need = n_windows * T + 1
    pieces, have = [], 0
    for piece in range(len(docs)):
        rows = docs.read(piece)
        for row, doc in enumerate(rows):
            if doc is None:
                continue
            pieces.append(doc)
            have += len(doc)
            if have >= need:
                # Training starts at the next row, or at the next piece if this one is exhausted.
                boundary = (piece, row + 1) if next(rows, None) is not None else (piece + 1, 0)
                stream = np.concatenate(pieces)[:need].astype(np.int64)
                idx = np.arange(n_windows)[:, None] * T + np.arange(T + 1)[None, :]
                return torch.from_numpy(stream[idx]), boundary
    if have == 0:
        keys = source_of(cfg).document_keys
        check = " and ".join([", ".join(keys[:-1]), keys[-1]] if len(keys) > 1 else keys)
        described = key_values(docs.describe())
        raise DataError(f"the corpus has no documents ({described}); check {check}")
    raise DataError(
        f"the corpus holds only {have} tokens, fewer than data.val_tokens={cfg.val_tokens} "
        "plus training data; lower data.val_tokens or add data"
    )


class PackedLoader:
    """This rank's windows of each training step, [N/W, T+1] int64, with an exact, elastic state."""

    def __init__(
        self,
        cfg: DataConfig,
        docs: Documents,
        first: tuple[int, int],
        windows_per_step: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        S = cfg.logical_shards
        if S % world_size:
            raise DataError(
                f"data.logical_shards ({S}) must be a multiple of the world size ({world_size}) "
                "so every rank owns the same number of stream shards"
            )
        if windows_per_step % S:
            raise DataError(
                f"a step of {windows_per_step} windows (train.tokens_per_step / data.seq_len) must be a "
                f"multiple of data.logical_shards ({S}), so every step draws the same windows at any "
                "world size; change one of them"
            )
        train_pieces = list(range(first[0], len(docs)))
        if len(train_pieces) < S:
            raise DataError(
                f"the training part of the corpus has {len(train_pieces)} pieces, fewer than "
                f"data.logical_shards={S}; lower it, lower data.piece_bytes or add data"
            )
        self.cfg, self.docs, self.rank, self.world_size = cfg, docs, rank, world_size
        self.width, self.per_shard = cfg.seq_len + 1, windows_per_step // S
        self.owned = [s for s in range(S) if s % world_size == rank]
        passes = Passes(log)
        self.shards = {
            s: ShardStream(
                s,
                [p for p in train_pieces if (p - first[0]) % S == s],
                docs,
                first,
                cfg.shuffle,
                cfg.shuffle_buffer,
                cfg.seed,
                passes,
            )
            for s in self.owned
        }
        self._consumed = self._snapshot()  # the state of what the trainer has taken so far
        self._queue: queue.Queue = queue.Queue(maxsize=max(cfg.prefetch_steps, 1))
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.wait_s = 0.0  # time next_step() spent waiting for the reader since `take_wait_s()`
        # What stopped the reader thread (a read that failed after its retries), as soon as it
        # happens: the trainer may still hold steps read before it, and stops every rank on one.
        self.failure: BaseException | None = None
        self._retries_taken = 0

    # ---------------------------------------------------------------- producing steps
    def _produce(self) -> np.ndarray:
        rows = [self.shards[s].next_window(self.width) for _ in range(self.per_shard) for s in self.owned]
        return np.stack(rows).astype(np.int64)

    def _snapshot(self) -> dict[int, dict[str, Any]]:
        return {s: shard.snapshot() for s, shard in self.shards.items()}

    def _worker(self) -> None:
        try:
            while not self._stop.is_set():
                item = (self._produce(), self._snapshot())
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as err:  # handed to the trainer, which raises it
            self._failed(err)
            self._queue.put(err)

    def _failed(self, err: BaseException) -> None:
        self.failure = err
        if self.rank != 0 and isinstance(err, DataError):  # rank 0's line is the trainer's `error:` line
            log.error("error: %s", err)

    def next_step(self) -> torch.Tensor:
        """This rank's windows of the next step, [N/W, T+1]."""
        t0 = time.perf_counter()
        if self.cfg.prefetch_steps == 0:
            try:
                windows, snap = self._produce(), self._snapshot()
            except BaseException as err:
                self._failed(err)
                raise
        else:
            if self._thread is None:
                self._queue = queue.Queue(maxsize=self.cfg.prefetch_steps)
                self._stop.clear()
                self._thread = threading.Thread(target=self._worker, name=f"data-rank{self.rank}", daemon=True)
                self._thread.start()
            item = self._queue.get()
            if isinstance(item, BaseException):
                self.close()
                raise item
            windows, snap = item
        self.wait_s += time.perf_counter() - t0
        self._consumed = snap
        return torch.from_numpy(windows)

    def take_wait_s(self) -> float:
        """Seconds the trainer waited for data since the last call (what read-ahead did not hide)."""
        wait, self.wait_s = self.wait_s, 0.0
        return wait

    def take_read_retries(self) -> int:
        """Hub requests this process retried since the last call (`data/hub_http.py`; 0 off the Hub)."""
        if not source_of(self.cfg).reads_hub:
            return 0
        from data.hub_http import retry_count

        total = retry_count()
        new, self._retries_taken = total - self._retries_taken, total
        return new

    def close(self) -> None:
        """Stop the reader thread and drop what it read ahead: the shards go back to the state of
        what the trainer consumed, so a later `next_step` continues exactly."""
        if self._thread is not None:
            self._stop.set()
            deadline = time.monotonic() + 30
            while self._thread.is_alive() and time.monotonic() < deadline:
                try:  # what it read ahead is dropped anyway: take it, so a full queue frees its put at once
                    self._queue.get_nowait()
                except queue.Empty:
                    pass
                self._thread.join(timeout=0.01)
            self._thread = None
            for s, snap in self._consumed.items():
                self.shards[s].load(snap)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Per-shard state after the last consumed step, keyed by logical shard id, and the number of
        pieces it addresses (a resume over a corpus that changed since is refused)."""
        return {
            "shards": {s: ShardStream.to_saved(snap) for s, snap in self._consumed.items()},
            "pieces": len(self.docs),
        }

    def load_rank_states(self, states: list[dict]) -> None:
        """Restore from the `state_dict()`s of every rank of a saved run, in rank order, whatever its
        world size: the logical shards are merged and this rank keeps its own."""
        shards: dict = {}
        for state in states:
            shards.update(state["shards"])
        saved_pieces = states[0].get("pieces", len(self.docs))  # checkpoints before it was saved: unchecked
        if saved_pieces != len(self.docs):
            described = key_values(self.docs.describe())
            raise DataError(
                f"the checkpoint's data stream addressed {saved_pieces} pieces but the corpus now has "
                f"{len(self.docs)} ({described}): the data changed since (a new revision on the "
                "Hub?); resume with the data it was saved over (data.hub.revision=<the commit its run.log names>)"
            )
        missing = [s for s in self.owned if s not in shards]
        if missing:
            raise DataError(f"loader state lacks logical shards {missing}; was data.logical_shards changed?")
        self.close()
        for s in self.owned:
            self.shards[s].load(shards[s])
        self._consumed = self._snapshot()
