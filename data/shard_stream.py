"""One logical shard of the training stream: its pieces, epoch after epoch, packed into windows.

A shard owns every S-th training piece. It visits them in published order (`data.shuffle=false`)
or in a permutation seeded by (data.seed, shard, epoch); documents optionally pass through a
bounded shuffle buffer (its contents and RNG are state); then they are concatenated (each ends in
EOS) and cut into windows of T+1 tokens with stride T, so every token is a target exactly once and
nothing is dropped at document boundaries.

The state is small and exact: (epoch, position in the epoch's piece order, row within the piece),
the tokens read but not yet emitted, and the shuffle buffer. Restoring it seeks straight to the
piece and row (`Documents.read(piece, row)`), so a resume never re-reads what came before. Epoch e
is the shard's pass e + 1 over its documents: the log counts passes from 1 (`data.notices.Passes`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from data.data_errors import DataError
from data.documents import Documents
from data.notices import Passes

log = logging.getLogger("orscale.data")

_END: Any = object()  # end of a piece's rows (a row itself may be None: skipped)


class ShardStream:
    def __init__(
        self,
        shard: int,
        pieces: list[int],
        docs: Documents,
        first: tuple[int, int],
        shuffle: bool,
        buffer_size: int,
        seed: int,
        passes: Passes | None = None,
    ) -> None:
        self.shard, self.pieces, self.docs = shard, pieces, docs
        self.passes = passes or Passes(log)  # shared by a loader's shards: one line per pass any of them begins
        self.first_piece, self.first_row = first  # the validation set ends at (piece, row)
        self.shuffle, self.buffer_size, self.seed = shuffle, buffer_size if shuffle else 0, seed
        # ---- state
        self.epoch, self.cursor, self.row = 0, 0, -1  # row -1: the piece's first training row
        self.tokens = np.zeros(0, dtype=np.int32)
        self.pool: list[np.ndarray] = []
        self.rng = np.random.default_rng([seed, shard])
        # ---- derived (rebuilt on load)
        self._order: list[int] | None = None
        self._reader: Iterator[np.ndarray | None] | None = None
        self._docs_this_epoch = 0
        self._whole_epoch = True  # this process reads the current epoch from its start
        self.rows_taken = 0  # instrumentation: rows this process took from its pieces
        self.passes.restore(shard, self.epoch + 1)

    def order(self, epoch: int) -> list[int]:
        """The pieces in the order epoch `epoch` reads them."""
        if not self.shuffle:
            return self.pieces
        perm = np.random.default_rng([self.seed, self.shard, epoch, 1]).permutation(len(self.pieces))
        return [self.pieces[i] for i in perm]

    def _read_doc(self) -> np.ndarray:
        """The next document in reading order (skipped rows pass silently)."""
        while True:
            if self._reader is None:
                if self._order is None:
                    self._order = self.order(self.epoch)
                if self.cursor >= len(self._order):
                    if self._docs_this_epoch == 0 and self._whole_epoch:
                        raise DataError(
                            f"logical shard {self.shard} has no documents in its pieces "
                            f"{self.pieces[:4]}...; lower data.logical_shards or add data"
                        )
                    self.epoch, self.cursor, self.row = self.epoch + 1, 0, -1
                    self._order, self._docs_this_epoch, self._whole_epoch = None, 0, True
                    self.passes.begin(self.shard, self.epoch + 1)
                    continue
                piece = self._order[self.cursor]
                if self.row < 0:
                    self.row = self.first_row if piece == self.first_piece else 0
                self._reader = self.docs.read(piece, self.row)
            doc = next(self._reader, _END)
            if doc is _END:
                self._reader, self.cursor, self.row = None, self.cursor + 1, -1
                continue
            self.row += 1
            self.rows_taken += 1
            if doc is not None:
                self._docs_this_epoch += 1
                return doc.astype(np.int32, copy=False)

    def _next_doc(self) -> np.ndarray:
        if self.buffer_size == 0:
            return self._read_doc()
        while len(self.pool) < self.buffer_size:
            self.pool.append(self._read_doc())
        i = int(self.rng.integers(len(self.pool)))
        doc = self.pool[i]
        self.pool[i] = self.pool[-1]
        self.pool.pop()
        return doc

    def next_window(self, width: int) -> np.ndarray:
        """The next window of `width` = T+1 tokens; its last token starts the shard's next window."""
        if len(self.tokens) < width:
            parts, have = [self.tokens], len(self.tokens)
            while have < width:
                doc = self._next_doc()
                parts.append(doc)
                have += len(doc)
            self.tokens = np.concatenate(parts)
        window = self.tokens[:width]
        self.tokens = self.tokens[width - 1 :]
        return window

    # ---------------------------------------------------------------- state
    def snapshot(self) -> dict[str, Any]:
        """The state as plain values (arrays are never modified in place, so sharing them is safe)."""
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "row": self.row,
            "tokens": self.tokens.copy(),
            "pool": list(self.pool),
            "rng": self.rng.bit_generator.state,
        }

    @staticmethod
    def to_saved(snap: dict[str, Any]) -> dict[str, Any]:
        """A snapshot as a checkpoint holds it (tensors; loads with weights_only=True)."""
        return {
            **snap,
            "tokens": torch.from_numpy(snap["tokens"].astype(np.int32)),
            "pool": [torch.from_numpy(d) for d in snap["pool"]],
        }

    def load(self, saved: dict[str, Any]) -> None:
        self.epoch, self.cursor, self.row = int(saved["epoch"]), int(saved["cursor"]), int(saved["row"])
        self.tokens = np.asarray(saved["tokens"], dtype=np.int32).copy()
        self.pool = [np.asarray(d, dtype=np.int32).copy() for d in saved["pool"]]
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = saved["rng"]
        self._order, self._reader, self._docs_this_epoch = None, None, 0
        self._whole_epoch = self.cursor == 0 and self.row < 0
        self.passes.restore(self.shard, self.epoch + 1)
