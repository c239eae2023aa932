"""The document stream: `datasets.load_dataset(..., streaming=True)` over the hub or local files.

One code path for both: `source` is a hub dataset (HuggingFaceFW/fineweb-edu + subset
sample-10BT) or a builder name ("json", "parquet") with `data_files`. Documents are addressed by
their index in the stream, which is what the loader state records.
"""

from __future__ import annotations

import logging
from typing import Iterator

from data.data_config import DataConfig
from data.errors import DataError, first_line
from data.paths import resolve_path

log = logging.getLogger("orscale.data")

LOCAL_BUILDERS = ("json", "parquet", "csv", "text", "arrow")


def _local_files(cfg: DataConfig) -> list[str]:
    if not cfg.data_files:
        raise DataError(f"data.source={cfg.source} needs data.data_files (a list of local files)")
    files = []
    for spec in cfg.data_files:
        path = resolve_path(spec)
        matches = sorted(path.parent.glob(path.name)) if any(ch in path.name for ch in "*?[") else [path]
        for match in matches:
            if not match.is_file():
                raise DataError(f"data file '{spec}' not found (check data.data_files)")
            files.append(str(match))
        if not matches:
            raise DataError(f"data file pattern '{spec}' matched no files (check data.data_files)")
    return files


def _text_only(dataset, cfg: DataConfig, where: str):
    try:
        return dataset.select_columns([cfg.text_field])
    except ValueError:
        raise DataError(
            f"{where} has no field '{cfg.text_field}' (fields: {', '.join(dataset.column_names or [])}); "
            "set data.text_field"
        ) from None


def open_dataset(cfg: DataConfig):
    """A streaming `datasets.IterableDataset` of documents (not yet tokenised), text column only.

    Local files are opened one by one and concatenated, so files whose other columns differ
    (FineWeb and FineWeb-Edu rows, say) can be mixed.
    """
    from datasets import concatenate_datasets, load_dataset

    if cfg.source in LOCAL_BUILDERS:
        parts = []
        for path in _local_files(cfg):
            try:
                part = load_dataset(cfg.source, data_files=[path], split=cfg.split, streaming=True)
            except Exception as err:
                raise DataError(f"data file '{path}' could not be opened: {first_line(err)}") from None
            parts.append(_text_only(part, cfg, f"data file '{path}'"))
        return parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    try:
        dataset = load_dataset(cfg.source, name=cfg.subset, split=cfg.split, streaming=True)
    except Exception as err:
        raise DataError(
            f"dataset '{cfg.source}' (subset {cfg.subset}) could not be opened: {first_line(err)}; "
            "offline, use data.source=json with data.data_files"
        ) from None
    return _text_only(dataset, cfg, f"dataset '{cfg.source}'")


def iter_documents(cfg: DataConfig, start: int = 0) -> Iterator[tuple[int, str]]:
    """Yield (index, text) for every document from `start` on, in stream order, once.

    Bad single documents (empty, or text that is not a string) are skipped with a warning; indices
    count them all, so positions never shift. A file that cannot be decoded (invalid UTF-8 or JSON) is
    a DataError naming it: datasets reads files whole, so one bad byte cannot be skipped alone.
    """
    dataset = open_dataset(cfg)
    if start:
        dataset = dataset.skip(start)
    index = start
    batches = dataset.iter(batch_size=cfg.encode_batch_docs)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (UnicodeDecodeError, ValueError, OSError) as err:
            raise DataError(
                f"data source '{cfg.source}' {cfg.data_files or ''} could not be decoded near document {index}: "
                f"{first_line(err)} (fix or remove that document)"
            ) from None
        for text in batch[cfg.text_field]:
            if isinstance(text, str) and text.strip():
                yield index, text
            else:
                log.warning("data: skipping empty or non-text document %d", index)
            index += 1
