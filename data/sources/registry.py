"""The data sources' table (`SOURCES`), which maps `data.source` to one of them (docs/data.md, "Data
sources"), and what is read through it: a corpus's pieces, a piece's texts, its documents."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from data.data_config import DataConfig
from data.data_errors import DataError
from data.documents import Documents
from data.notices import Notices
from data.sources.base import Source
from data.sources.hub import Hub
from data.sources.local import LocalFiles
from data.sources.text_files import TextFiles
from data.sources.tokens import TokenShards
from data.stream import Catalog, Piece, kept_texts

if TYPE_CHECKING:
    from data.tokenizer import TextTokenizer

log = logging.getLogger("orscale.data")

# In the order they are asked: the token shards claim `auto` over a shard directory before the local
# files do, and the Hub, which claims any owner/name, comes last.
SOURCES: tuple[Source, ...] = (
    TokenShards(),
    LocalFiles(),
    TextFiles(),
    Hub(),
)
_READERS = {kind: source for source in SOURCES for kind in source.kinds}


def source_of(cfg: DataConfig) -> Source:
    """The source `cfg.source` names, after its checks of `cfg`; a one-line error naming the known
    ones for any other value."""
    for source in SOURCES:
        if source.claims(cfg):
            source.check(cfg)
            return source
    known = [source.listed_as or ", ".join(source.names) for source in SOURCES]
    raise DataError(
        f"data.source={cfg.source!r} is not a known data source ({', '.join(known[:-1])}, or {known[-1]}); "
        "set data.source to one of them"
    )


def source_options() -> list[type[Any]]:
    """The options class of every `data.<section>` a source owns, each once."""
    return list(dict.fromkeys(o for source in SOURCES for o in source.options))


def read_data_section(section: Mapping[str, Any]) -> DataConfig:
    """The `data:` section of a config file (its sources' sub-sections too: `hub: {subset: ...}`) as a
    DataConfig, for the data tools that read one without the launch; one line for a key it lacks."""
    options = {o.section: o for o in source_options()}
    names = sorted(f.name for f in dataclasses.fields(DataConfig) if f.init and f.name != "sections")
    kwargs: dict[str, Any] = {}
    parts = []
    for key, value in section.items():
        if key in options:
            own = options[key]
            keys = sorted(f.name for f in dataclasses.fields(own))
            if not isinstance(value, Mapping) or set(value) - set(keys):
                raise DataError(f"data.{key} takes a mapping of {', '.join(keys)}; got {value!r}")
            parts.append(own(**value))
        elif key in names:
            kwargs[key] = value
        else:
            owner = next((o for o in options.values() if key in {f.name for f in dataclasses.fields(o)}), None)
            where = f"data.{owner.section}.{key}" if owner else f"one of {', '.join([*names, *options])}"
            raise DataError(f"the data section has no key {key!r}; write {where}")
    return DataConfig(**kwargs).with_options(*parts)


def open_documents(cfg: DataConfig, tokenizer: TextTokenizer) -> Documents:
    """The documents of `cfg.source` as its source opens them: pre-tokenised shards, or a text corpus
    tokenised as it is read."""
    return source_of(cfg).open(cfg, tokenizer)


def build_catalog(cfg: DataConfig) -> Catalog:
    """The pieces of `cfg`'s text corpus, in published order."""
    return source_of(cfg).catalog(cfg)


def read_texts(
    piece: Piece, cfg: DataConfig, start_row: int = 0, notices: Notices | None = None
) -> Iterator[str | None]:
    """The documents of `piece` (of `cfg`'s corpus) from row `start_row` on, one per row: the text, or
    None for a row that is empty or not text (skipped with a warning, said once per `notices` and then
    counted, but it keeps its row number)."""
    rows = _READERS[piece.kind].read_rows(piece, cfg, start_row)
    return kept_texts(rows, piece, start_row, notices or Notices(log))


def iter_documents(cfg: DataConfig, catalog: Catalog | None = None) -> Iterator[tuple[int, str]]:
    """(index, text) for every document of the corpus in published order; skipped rows keep their
    index. For inspection and tests: training reads pieces through the loader."""
    catalog = catalog or build_catalog(cfg)
    index, notices = 0, Notices(log)
    for i in range(len(catalog)):
        for text in read_texts(catalog[i], cfg, notices=notices):
            if text is not None:
                yield index, text
            index += 1
