"""Documents as token arrays, piece by piece, from either kind of source (`data/sources/`):

* `TextDocuments`: a text corpus (its source's pieces, `data/stream.py`), tokenised as it is read;
* `TokenDocuments` (`data/token_shards.py`): shards written by `python -m data.prepare`, read
  through `numpy.memmap`.
Both give the same pieces with the same rows, each row a token array ending in EOS or None for a
skipped row, so the loader packs identical windows from either.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np

from data.data_config import DataConfig
from data.data_errors import first_line
from data.notices import Notices
from data.stream import Catalog, kept_texts
from data.tokenizer import TextTokenizer

if TYPE_CHECKING:
    from data.sources.base import Source

log = logging.getLogger("orscale.data")


class Documents(Protocol):
    def __len__(self) -> int: ...  # pieces

    def read(self, piece: int, start_row: int = 0) -> Iterator[np.ndarray | None]: ...

    def describe(self) -> dict: ...


def encode_documents(tokenizer: TextTokenizer, texts: list[str]) -> list[np.ndarray | None]:
    """Each text's ids followed by EOS. A batch the tokenizer rejects (e.g. lone surrogates) is
    retried one document at a time, skipping only the bad ones with a warning."""
    batches: list[list[int] | None]
    try:
        batches = list(tokenizer.encode_batch(texts))
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


class TextDocuments:
    """Pieces of a text corpus (read by `source`), tokenised in chunks of `data.encode_batch_docs`
    documents."""

    def __init__(
        self, cfg: DataConfig, tokenizer: TextTokenizer, source: Source, catalog: Catalog | None = None
    ) -> None:
        self.cfg, self.tokenizer, self.source = cfg, tokenizer, source
        source.connect(cfg)  # also in a data.prepare worker, which is given its catalog
        self.catalog = catalog or source.catalog(cfg)
        self.pieces_opened = self.rows_read = 0  # instrumentation: read amplification (benchmarks, tests)
        self.notices = Notices(log)  # skipped rows: said once per run, then counted

    def __len__(self) -> int:
        return len(self.catalog)

    def read(self, piece: int, start_row: int = 0) -> Iterator[np.ndarray | None]:
        self.pieces_opened += 1
        at = self.catalog[piece]
        texts = kept_texts(self.source.read_rows(at, self.cfg, start_row), at, start_row, self.notices)
        while True:
            chunk = [t for _, t in zip(range(self.cfg.encode_batch_docs), texts, strict=False)]
            if not chunk:
                return
            self.rows_read += len(chunk)
            real = [t for t in chunk if t is not None]
            encoded = iter(encode_documents(self.tokenizer, real) if real else [])
            for text in chunk:
                yield None if text is None else next(encoded)

    def describe(self) -> dict:
        return {"source": self.cfg.source, **self.catalog.describe()}
