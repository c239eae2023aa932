"""The `data:` section of a run config, checked where it is defined."""

from __future__ import annotations

from dataclasses import dataclass, field

from data.data_errors import DataError


@dataclass
class DataConfig:
    # Which source reads the corpus (data/sources/, docs/data.md): "auto" (local data_files, format
    # from each file's extension, or a data.prepare directory), "json" (JSON Lines) or "parquet" with
    # data_files, "tokens" with data_files = [a `python -m data.prepare` output directory], or a hub
    # dataset as owner/name (e.g. HuggingFaceFW/fineweb-edu: its parquet files). Relative paths
    # resolve against the working directory, then the project root.
    source: str = "auto"
    subset: str | None = None  # hub config name, e.g. sample-10BT
    revision: str | None = None  # hub branch, tag or commit (None: main); pin the commit a long run logs
    data_files: list[str] = field(default_factory=list)
    split: str = "train"
    text_field: str = "text"
    tokenizer: str = "assets/tokenizers/gpt2"
    seq_len: int = 256
    val_tokens: int = 16384  # constant validation size: identical for every run
    val_batch_size: int = 8
    encode_batch_docs: int = 64  # documents tokenised per encode_batch call
    logical_shards: int = 16  # fixed split of the stream, independent of the world size
    piece_bytes: int = 1 << 20  # JSON Lines are read in pieces of this many bytes (parquet: row groups)
    shuffle: bool = False  # per-epoch seeded piece order + a document shuffle buffer (False: published order)
    shuffle_buffer: int = 256  # documents per logical shard held for shuffling (with shuffle=true)
    seed: int = 1234  # the data order's seed (train.seed is the model's)
    prefetch_steps: int = 2  # steps read, tokenised and packed ahead in a background thread; 0: inline
    # Each hub HTTP request (resolution, footer, row group): retries of a 429/5xx/reset/stall after
    # waits of hub_retry_wait_s doubling up to hub_retry_max_wait_s (+0-50% jitter, >= Retry-After),
    # and its connect/read timeout (data/hub_http.py). The defaults ride out ~6 minutes of outage.
    hub_retries: int = 10
    hub_retry_wait_s: float = 1.0
    hub_retry_max_wait_s: float = 60.0
    hub_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        self._check_fields()
        # The registry reads files through modules that name this class: imported when it is checked.
        from data.sources import source_of

        source_of(self).check(self)

    def _check_fields(self) -> None:
        checks = (
            (self.seq_len >= 2, f"data.seq_len must be >= 2, got {self.seq_len}"),
            (
                self.val_tokens >= self.seq_len,
                f"data.val_tokens ({self.val_tokens}) must be >= data.seq_len ({self.seq_len})",
            ),
            (
                self.val_tokens % self.seq_len == 0,
                f"data.val_tokens ({self.val_tokens}) must be a multiple of data.seq_len ({self.seq_len})",
            ),
            (self.val_batch_size >= 1, f"data.val_batch_size must be >= 1, got {self.val_batch_size}"),
            (self.encode_batch_docs >= 1, f"data.encode_batch_docs must be >= 1, got {self.encode_batch_docs}"),
            (self.logical_shards >= 1, f"data.logical_shards must be >= 1, got {self.logical_shards}"),
            (self.piece_bytes >= 1024, f"data.piece_bytes must be >= 1024, got {self.piece_bytes}"),
            (self.shuffle_buffer >= 0, f"data.shuffle_buffer must be >= 0, got {self.shuffle_buffer}"),
            (self.hub_retries >= 0, f"data.hub_retries must be >= 0 (0: no retries), got {self.hub_retries}"),
            (
                0 < self.hub_retry_wait_s <= self.hub_retry_max_wait_s,
                f"data.hub_retry_wait_s ({self.hub_retry_wait_s}) must be > 0 and <= data.hub_retry_max_wait_s "
                f"({self.hub_retry_max_wait_s})",
            ),
            (self.hub_timeout_s > 0, f"data.hub_timeout_s must be > 0 seconds, got {self.hub_timeout_s}"),
            (
                self.prefetch_steps >= 0,
                f"data.prefetch_steps must be >= 0 (0: no read-ahead), got {self.prefetch_steps}",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise DataError(message)
