"""A Hugging Face Hub dataset (`data.source=<owner>/<name>`, e.g. HuggingFaceFW/fineweb-edu, with
`data.subset`, `data.split` and `data.revision`): the parquet files of a split as `datasets`
resolves them, read by row group through `huggingface_hub`'s file system with this project's
retries (data/hub_http.py). A local directory laid out as a hub dataset reads the same way.
docs/data.md, "Streaming from the Hub"."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from data.data_config import DataConfig
from data.data_errors import DataError, first_line
from data.sources.base import Source
from data.stream import Catalog, Piece, describe_file, hub_failure, parquet_rows

log = logging.getLogger("orscale.data")


class Hub(Source):
    listed_as = "a Hub dataset as owner/name, e.g. HuggingFaceFW/fineweb-edu"
    kinds = ("parquet",)
    document_keys = ("data.source", "data.subset", "data.split", "data.text_field")
    reads_hub = True

    def claims(self, cfg: DataConfig) -> bool:
        return "/" in cfg.source  # a repository id (owner/name), or a directory laid out as one

    def connect(self, cfg: DataConfig) -> None:
        """Route this process's Hub requests through `cfg`'s retry policy and timeouts."""
        from data import hub_http  # imports httpx2: only runs that read the Hub import it

        hub_http.install(
            hub_http.RetryPolicy(cfg.hub_retries, cfg.hub_retry_wait_s, cfg.hub_retry_max_wait_s, cfg.hub_timeout_s)
        )

    def catalog(self, cfg: DataConfig) -> Catalog:
        return Catalog([describe_file(p, "parquet", cfg.piece_bytes) for p in self.files(cfg)], cfg.piece_bytes)

    def read_rows(self, piece: Piece, text_field: str, start_row: int) -> Iterator[object]:
        return parquet_rows(piece, text_field, start_row)

    def files(self, cfg: DataConfig) -> list[str]:
        """The parquet files of a hub dataset's split, as `datasets` resolves them (hf:// URLs)."""
        from datasets import load_dataset_builder

        self.connect(cfg)
        try:
            builder = load_dataset_builder(cfg.source, name=cfg.subset, revision=cfg.revision)
            files = [str(f) for f in builder.config.data_files[cfg.split]]
        except Exception as err:
            failed = hub_failure(err)
            if failed is not None:
                raise DataError(
                    f"dataset '{cfg.source}' (subset {cfg.subset}) could not be resolved: {failed}; the Hub is "
                    "down or rate-limiting: run the same command later (or raise data.hub_retries)"
                ) from None
            raise DataError(
                f"dataset '{cfg.source}' (subset {cfg.subset}) could not be opened: {first_line(err)}; "
                "offline, use data.source=json or parquet with data.data_files"
            ) from None
        if not files or not all(f.endswith(".parquet") for f in files):
            raise DataError(
                f"dataset '{cfg.source}' has data files that are not parquet ({files[:1]}); "
                "only parquet hub datasets can be read by row group"
            )
        log.info(
            "data: %s (subset %s) resolved to %d parquet files at %s", cfg.source, cfg.subset, len(files), files[0]
        )
        return files
