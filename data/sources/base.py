"""What a data source is: the `data.source` values it answers to, the checks of its config, the
corpus it names and how its pieces' rows are read (docs/data.md). Each source is one file of
`data/sources/` and one line of the registry (`data/sources/__init__.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from data.data_config import DataConfig
from data.data_errors import DataError
from data.stream import Catalog, Piece

if TYPE_CHECKING:
    from data.documents import Documents
    from data.tokenizer import TextTokenizer


class Source:
    """A kind of corpus. A text source names its files (`catalog`) and reads the rows of its pieces
    (`read_rows`); `TextDocuments` tokenises them as they are read. A source of token ids
    (`text = False`) opens its own `Documents` instead."""

    names: tuple[str, ...] = ()  # the `data.source` values it answers to
    listed_as = ""  # how the error for an unknown source names it (default: its names)
    kinds: tuple[str, ...] = ()  # the `Piece.kind`s whose rows `read_rows` reads
    text = True  # documents are text, tokenised as they are read (False: token ids already)
    reads_hub = False  # its reads go through the Hub's retry policy (data/hub_http.py)
    options: tuple[type[Any], ...] = ()  # the options classes of its own `data.<section>`s
    # The settings that choose its documents: what a corpus with none should check.
    document_keys: tuple[str, ...] = ("data.data_files", "data.text_field")

    def claims(self, cfg: DataConfig) -> bool:
        """Whether `cfg.source` names this source."""
        return cfg.source in self.names

    def check(self, cfg: DataConfig) -> None:
        """This source's checks of the `data:` section, on construction: a one-line `DataError`."""

    def connect(self, cfg: DataConfig) -> None:
        """Set this process up to read the source (the Hub: its retries and timeouts); idempotent."""

    def catalog(self, cfg: DataConfig) -> Catalog:
        """Every piece of the corpus `cfg` names, in published order."""
        raise DataError(f"data.source={cfg.source} holds token ids: it has no text catalog")

    def read_rows(self, piece: Piece, cfg: DataConfig, start_row: int) -> Iterator[object]:
        """The rows of `piece` (of `cfg`'s corpus: its text field, this source's own options) from row
        `start_row` on: each a document's text, or None/a non-text value for a row that is skipped but
        keeps its number."""
        raise NotImplementedError(f"pieces of kind {piece.kind} have no reader")

    def open(self, cfg: DataConfig, tokenizer: TextTokenizer) -> Documents:
        """The corpus as token arrays, piece by piece."""
        from data.documents import TextDocuments  # documents names this class: imported when called

        return TextDocuments(cfg, tokenizer, self)
