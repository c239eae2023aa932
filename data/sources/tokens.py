"""Token shards written by `python -m data.prepare` (`data.source=tokens`, `data.data_files=[DIR]`;
also `auto` given one directory that holds a shard manifest): token ids read through `numpy.memmap`
(data/token_shards.py), in the pieces and rows of the text corpus they came from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from data.data_config import DataConfig
from data.data_errors import DataError
from data.paths import resolve_path
from data.sources.base import Source
from data.token_shards import SHARDS_MANIFEST, TokenDocuments

if TYPE_CHECKING:
    from data.tokenizer import TextTokenizer


def holds_shards(cfg: DataConfig) -> bool:
    """Whether `data.data_files` names a directory that holds a token-shard manifest first."""
    return bool(cfg.data_files) and (resolve_path(cfg.data_files[0]) / SHARDS_MANIFEST).is_file()


class TokenShards(Source):
    names = ("tokens",)
    text = False
    document_keys = ("data.data_files",)

    def claims(self, cfg: DataConfig) -> bool:
        return cfg.source == "tokens" or (cfg.source == "auto" and len(cfg.data_files) == 1 and holds_shards(cfg))

    def check(self, cfg: DataConfig) -> None:
        if len(cfg.data_files) != 1:
            raise DataError("data.source=tokens needs data.data_files = [the directory python -m data.prepare wrote]")

    def open(self, cfg: DataConfig, tokenizer: TextTokenizer) -> TokenDocuments:
        return TokenDocuments.open(cfg, tokenizer)
