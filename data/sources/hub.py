"""A Hugging Face Hub dataset (`data.source=<owner>/<name>`, e.g. HuggingFaceFW/fineweb-edu, with
`data.hub.subset`, `.split` and `.revision`): the parquet files of a split as `datasets`
resolves them, read by row group through `huggingface_hub`'s file system with this project's
retries (data/hub_http.py). A local directory laid out as a hub dataset reads the same way.
docs/data.md, "Streaming from the Hub"."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from data.data_config import DataConfig
from data.data_errors import DataError, first_line
from data.sources.base import Source
from data.stream import Catalog, Piece, describe_parquet, hub_failure, parquet_rows

log = logging.getLogger("orscale.data")


@dataclass
class HubOptions:
    """`data.hub`: which part of the dataset, and each HTTP request's (resolution, footer, row group)
    retries of a 429/5xx/reset/stall after waits of `retry_wait_s` doubling up to `retry_max_wait_s`
    (+0-50% jitter, >= Retry-After) and its connect/read timeout (data/hub_http.py). The defaults ride
    out ~6 minutes of outage."""

    section: ClassVar[str] = "hub"

    # the dataset's config name, e.g. sample-10BT
    subset: str | None = field(default=None, metadata={"resume": "fixed"})
    split: str = "train"
    revision: str | None = None  # branch, tag or commit (None: main); pin the commit a long run logs
    retries: int = 10
    retry_wait_s: float = 1.0
    retry_max_wait_s: float = 60.0
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        checks = (
            (self.retries >= 0, f"data.hub.retries must be >= 0 (0: no retries), got {self.retries}"),
            (
                0 < self.retry_wait_s <= self.retry_max_wait_s,
                f"data.hub.retry_wait_s ({self.retry_wait_s}) must be > 0 and <= data.hub.retry_max_wait_s "
                f"({self.retry_max_wait_s})",
            ),
            (self.timeout_s > 0, f"data.hub.timeout_s must be > 0 seconds, got {self.timeout_s}"),
        )
        for ok, message in checks:
            if not ok:
                raise DataError(message)


class Hub(Source):
    listed_as = "a Hub dataset as owner/name, e.g. HuggingFaceFW/fineweb-edu"
    kinds = ("parquet",)
    document_keys = ("data.source", "data.hub.subset", "data.hub.split", "data.text_field")
    reads_hub = True
    options = (HubOptions,)

    def claims(self, cfg: DataConfig) -> bool:
        return "/" in cfg.source  # a repository id (owner/name), or a directory laid out as one

    def connect(self, cfg: DataConfig) -> None:
        """Route this process's Hub requests through `cfg`'s retry policy and timeouts."""
        import data.hub_http as hub_http  # imports httpx2: only runs that read the Hub import it

        o = cfg.own(HubOptions)
        hub_http.install(hub_http.RetryPolicy(o.retries, o.retry_wait_s, o.retry_max_wait_s, o.timeout_s))

    def catalog(self, cfg: DataConfig) -> Catalog:
        return Catalog([describe_parquet(p) for p in self.files(cfg)], cfg.piece_bytes)

    def read_rows(self, piece: Piece, cfg: DataConfig, start_row: int) -> Iterator[object]:
        return parquet_rows(piece, cfg.text_field, start_row)

    def files(self, cfg: DataConfig) -> list[str]:
        """The parquet files of a hub dataset's split, as `datasets` resolves them (hf:// URLs)."""
        from datasets import load_dataset_builder

        self.connect(cfg)
        o = cfg.own(HubOptions)
        try:
            builder = load_dataset_builder(cfg.source, name=o.subset, revision=o.revision)
            files = [str(f) for f in builder.config.data_files[o.split]]
        except Exception as err:
            failed = hub_failure(err)
            if failed is not None:
                raise DataError(
                    f"dataset '{cfg.source}' (subset {o.subset}) could not be resolved: {failed}; the Hub is "
                    "down or rate-limiting: run the same command later (or raise data.hub.retries)"
                ) from None
            raise DataError(
                f"dataset '{cfg.source}' (subset {o.subset}) could not be opened: {first_line(err)}; "
                "offline, use data.source=json or parquet with data.data_files"
            ) from None
        if not files or not all(f.endswith(".parquet") for f in files):
            raise DataError(
                f"dataset '{cfg.source}' has data files that are not parquet ({files[:1]}); "
                "only parquet hub datasets can be read by row group"
            )
        log.info("data: %s (subset %s) resolved to %d parquet files at %s", cfg.source, o.subset, len(files), files[0])
        return files
