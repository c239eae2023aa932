"""The `data:` section of a run config: the keys every source shares, checked on construction, and the
sources' own sections (`data.<section>`, each the options dataclass its source owns: data/sources/)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from data.data_errors import DataError


class Section(Protocol):
    """An options class of a component's own sub-section, named by `section`."""

    section: ClassVar[str]


T = TypeVar("T", bound=Section)


@dataclass
class DataConfig:
    # Which source reads the corpus (data/sources/, docs/data.md): "auto" (local data_files, format
    # from each file's extension, or a data.prepare directory), "json" (JSON Lines) or "parquet" with
    # data_files, "text" (.txt files), "tokens" with data_files = [a `python -m data.prepare` output
    # directory], or a hub dataset as owner/name (e.g. HuggingFaceFW/fineweb-edu: its parquet files,
    # settings in data.hub). Relative paths resolve against the working directory, then the project root.
    source: str = field(default="auto", metadata={"resume": "fixed"})
    data_files: list[str] = field(default_factory=list, metadata={"resume": "fixed"})
    text_field: str = field(default="text", metadata={"resume": "fixed"})
    tokenizer: str = "assets/tokenizers/gpt2"
    seq_len: int = field(default=256, metadata={"resume": "fixed"})
    # constant validation size: identical for every run
    val_tokens: int = field(default=16384, metadata={"resume": "fixed"})
    val_batch_size: int = field(default=8, metadata={"resume": "routine"})
    # documents tokenised per encode_batch call
    encode_batch_docs: int = field(default=64, metadata={"resume": "routine"})
    # fixed split of the stream, independent of the world size
    logical_shards: int = field(default=16, metadata={"resume": "fixed"})
    # JSON Lines are read in pieces of this many bytes (parquet: row groups)
    piece_bytes: int = field(default=1 << 20, metadata={"resume": "fixed"})
    # per-epoch seeded piece order + a document shuffle buffer (False: published order)
    shuffle: bool = field(default=False, metadata={"resume": "fixed"})
    # documents per logical shard held for shuffling (with shuffle=true)
    shuffle_buffer: int = field(default=256, metadata={"resume": "fixed"})
    seed: int = field(default=1234, metadata={"resume": "fixed"})  # the data order's seed (train.seed is the model's)
    # steps read, tokenised and packed ahead in a background thread; 0: inline
    prefetch_steps: int = field(default=2, metadata={"resume": "routine"})
    sections: dict[str, Any] = field(default_factory=dict)  # the sources' own, by section name

    def __post_init__(self) -> None:
        self._check_fields()

    def own(self, options: type[T]) -> T:
        """Section `options` (an options class with its `section` name) of this config: its defaults
        when the config has none."""
        found = self.sections.get(options.section)
        return found if isinstance(found, options) else options()

    def with_options(self, *options: Any) -> DataConfig:
        """This config with `options` (options instances) as their sections."""
        return dataclasses.replace(self, sections={**self.sections, **{o.section: o for o in options}})

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
            (
                self.prefetch_steps >= 0,
                f"data.prefetch_steps must be >= 0 (0: no read-ahead), got {self.prefetch_steps}",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise DataError(message)
