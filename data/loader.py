"""Packing the token stream into fixed-length training windows, with a resumable, elastic state.

The stream is split into `logical_shards` by document position (doc k of the training part goes
to shard k mod S), a number fixed by the config and independent of the world size. Rank r owns
the shards s with s mod W == r and packs each shard on its own: documents + EOS are concatenated,
cut into windows of T+1 tokens with stride T, so every token is a target exactly once and nothing
is dropped at document boundaries. The state records, per shard, where its next document is and
the tokens already read but not yet emitted: a run saved on N ranks resumes on M ranks with no
document repeated or skipped.
"""

from __future__ import annotations

import logging
from typing import Iterator, Optional

import numpy as np
import torch

from data.data_config import DataConfig
from data.errors import DataError, first_line
from data.stream import iter_documents
from data.tokenizer import TextTokenizer

log = logging.getLogger("orscale.data")


def encode_documents(tokenizer: TextTokenizer, texts: list[str]) -> list[np.ndarray]:
    """Each text's ids followed by EOS. A batch the tokenizer rejects (e.g. lone surrogates) is
    retried one document at a time, skipping only the bad ones with a warning."""
    try:
        batches = tokenizer.encode_batch(texts)
    except Exception:
        batches = []
        for text in texts:
            try:
                batches.append(tokenizer.encode_batch([text])[0])
            except Exception as err:
                log.warning("data: skipping a document the tokenizer rejects (%s)", first_line(err))
                batches.append(None)
    eos = tokenizer.eos_id
    return [np.asarray(ids + [eos], dtype=np.int64) if ids is not None else None for ids in batches]


def build_val_set(cfg: DataConfig, tokenizer: TextTokenizer) -> tuple[torch.Tensor, int]:
    """The first documents of the stream, packed into exactly val_tokens / seq_len windows.

    Returns (windows [n, seq_len + 1], number of documents used). Training starts after them, so
    the validation documents are never trained on, and the set is identical in every run.
    """
    n_windows, T = cfg.val_tokens // cfg.seq_len, cfg.seq_len
    need = n_windows * T + 1
    pieces, have, used = [], 0, 0
    docs = iter_documents(cfg)
    while have < need:
        chunk = [next(docs, None) for _ in range(cfg.encode_batch_docs)]
        chunk = [d for d in chunk if d is not None]
        if not chunk:
            raise DataError(
                f"the corpus holds only {have} tokens, fewer than data.val_tokens={cfg.val_tokens} "
                "plus training data; lower data.val_tokens or add data"
            )
        for (index, _), ids in zip(chunk, encode_documents(tokenizer, [t for _, t in chunk])):
            if ids is None or have >= need:
                continue
            pieces.append(ids)
            have += len(ids)
            used = index + 1
    stream = np.concatenate(pieces)[:need]
    idx = np.arange(n_windows)[:, None] * T + np.arange(T + 1)[None, :]
    return torch.from_numpy(stream[idx]), used


class PackedLoader:
    """Micro-batches [B, T+1] for one rank, drawn round-robin from the rank's logical shards."""

    def __init__(self, cfg: DataConfig, tokenizer: TextTokenizer, first_doc: int,
                 rank: int = 0, world_size: int = 1) -> None:
        self.cfg, self.tokenizer, self.first_doc = cfg, tokenizer, first_doc
        self.rank, self.world_size = rank, world_size
        self.owned = [s for s in range(cfg.logical_shards) if s % world_size == rank]
        if not self.owned:
            raise DataError(
                f"data.logical_shards={cfg.logical_shards} is smaller than the world size {world_size}; "
                "raise data.logical_shards to a multiple of the number of ranks"
            )
        # Per shard: (epoch, stream index) of its next unread document, and unread tokens.
        self.next_pos: dict[int, tuple[int, int]] = {s: (0, first_doc) for s in self.owned}
        self.buffers: dict[int, np.ndarray] = {s: np.zeros(0, dtype=np.int64) for s in self.owned}
        self.turn = 0  # round-robin pointer over self.owned
        self._docs: Optional[Iterator[tuple[int, int, int, str]]] = None

    def _shard_of(self, index: int) -> int:
        return (index - self.first_doc) % self.cfg.logical_shards

    def _owned_documents(self) -> Iterator[tuple[int, int, int, str]]:
        """(shard, epoch, index, text) for unread documents of owned shards, epoch after epoch."""
        epoch, start = min(self.next_pos.values())
        while True:
            seen = 0
            for index, text in iter_documents(self.cfg, start):
                seen += 1
                shard = self._shard_of(index)
                if shard in self.next_pos and (epoch, index) >= self.next_pos[shard]:
                    yield shard, epoch, index, text
            if seen < self.cfg.logical_shards and epoch == 0 and start == self.first_doc:
                raise DataError(
                    f"the training part of the corpus has {seen} documents, fewer than "
                    f"data.logical_shards={self.cfg.logical_shards}; lower it or add data"
                )
            epoch, start = epoch + 1, self.first_doc
            log.warning("data: training stream wrapped around; epoch %d begins", epoch)

    def _fill(self) -> None:
        """Read and tokenise the next chunk of the rank's documents into their shard buffers."""
        if self._docs is None:
            self._docs = self._owned_documents()
        chunk = [next(self._docs) for _ in range(self.cfg.encode_batch_docs)]
        encoded = encode_documents(self.tokenizer, [text for *_, text in chunk])
        pieces: dict[int, list[np.ndarray]] = {}
        for (shard, epoch, index, _), ids in zip(chunk, encoded):
            if ids is not None:
                pieces.setdefault(shard, [self.buffers[shard]]).append(ids)
            self.next_pos[shard] = (epoch, index + 1)
        for shard, parts in pieces.items():  # one copy per shard and chunk, not per document
            self.buffers[shard] = np.concatenate(parts)

    def next_batch(self, batch_size: int) -> torch.Tensor:
        width = self.cfg.seq_len + 1
        rows = []
        for _ in range(batch_size):
            shard = self.owned[self.turn % len(self.owned)]
            self.turn += 1
            while len(self.buffers[shard]) < width:
                self._fill()
            rows.append(self.buffers[shard][:width])
            # Keep the window's last token: it is the first input of the shard's next window.
            self.buffers[shard] = self.buffers[shard][width - 1:]
        return torch.from_numpy(np.stack(rows))

    def state_dict(self) -> dict:
        """Per-shard positions and pending tokens, keyed by logical shard id."""
        return {
            "turn": self.turn,
            "shards": {s: {"epoch": e, "next": i, "buffer": torch.from_numpy(self.buffers[s].copy())}
                       for s, (e, i) in self.next_pos.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Accepts the merged shard states of any world size; keeps the shards this rank owns."""
        shards = state["shards"]
        missing = [s for s in self.owned if s not in shards]
        if missing:
            raise DataError(f"loader state lacks logical shards {missing}; was data.logical_shards changed?")
        for s in self.owned:
            self.next_pos[s] = (int(shards[s]["epoch"]), int(shards[s]["next"]))
            self.buffers[s] = shards[s]["buffer"].numpy().astype(np.int64)
        self.turn = int(state.get("turn", 0))
        self._docs = None

    def load_rank_states(self, states: list[dict]) -> None:
        """Restore from the `state_dict()`s of every rank of a saved run, in rank order, whatever its
        world size: the logical shards are merged and this rank keeps its own. At the same world
        size the round-robin pointer continues; on a new shard layout it restarts (no document is
        lost: positions are per shard)."""
        shards: dict = {}
        for state in states:
            shards.update(state["shards"])
        turn = states[self.rank]["turn"] if len(states) == self.world_size else 0
        self.load_state_dict({"shards": shards, "turn": turn})
