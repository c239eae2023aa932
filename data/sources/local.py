"""Local JSON Lines and parquet files (`data.source=auto|json|parquet`, `data.data_files=[...]`):
files named one by one or by a glob, relative to the working directory or the project root; `auto`
goes by each file's extension (docs/data.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from data.data_config import DataConfig
from data.data_errors import DataError
from data.paths import resolve_path
from data.sources.base import Source
from data.stream import (
    COMPRESSED,
    Catalog,
    CorpusFile,
    Piece,
    compression,
    describe_file,
    describe_parquet,
    json_rows,
    parquet_rows,
)

EXTENSIONS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".ndjson": "json"}


def local_files(cfg: DataConfig) -> list[str]:
    """The files `data.data_files` names (globs expanded, in order); a one-line error for a missing
    file, a pattern that matches none, or a directory."""
    if not cfg.data_files:
        raise DataError(f"data.source={cfg.source} needs data.data_files (a list of local files)")
    files = []
    for spec in cfg.data_files:
        path = resolve_path(spec)
        matches = sorted(path.parent.glob(path.name)) if any(ch in path.name for ch in "*?[") else [path]
        if not matches:
            raise DataError(f"data file pattern '{spec}' matched no files (check data.data_files)")
        for match in matches:
            if match.is_dir():
                raise DataError(_directory_given(spec, match))
            if not match.is_file():
                raise DataError(f"data file '{spec}' not found (check data.data_files)")
            files.append(str(match))
    return files


def _directory_given(spec: str, path: Path) -> str:
    """The one line for a directory in `data.data_files` (files are named, a directory is not read):
    what it holds, and the pattern that names its files when it holds any."""
    kinds = sorted({s for f in path.iterdir() for s in EXTENSIONS if f.is_file() and _data_name(f.name).endswith(s)})
    if not kinds:
        return (
            f"data file '{spec}' is a directory with no data files in it ({', '.join(EXTENSIONS)}, or "
            f"those compressed: {', '.join(COMPRESSED)}); check data.data_files"
        )
    return f"data file '{spec}' is a directory: name its files, e.g. data.data_files=['{spec.rstrip('/')}/*{kinds[0]}']"


def _data_name(name: str) -> str:
    """A file name without its compression suffix."""
    packed = compression(name)
    return name[: -len(packed)] if packed else name


def file_format(path: str, source: str) -> str:
    """`json` or `parquet` for a local file: `data.source` when set, else from the extension; a
    file whose extension says otherwise than `data.source` is a one-line error."""
    packed = compression(path)
    guessed = next((kind for s, kind in EXTENSIONS.items() if _data_name(path).endswith(s)), None)
    if packed and (guessed == "parquet" or source == "parquet"):
        raise DataError(
            f"data file '{path}' is a compressed parquet file: parquet compresses its own pages; decompress the file"
        )
    if source == "auto":
        if guessed is None:
            raise DataError(
                f"cannot tell the format of data file '{path}' from its name; set data.source=json "
                "(JSON Lines) or data.source=parquet"
            )
        return guessed
    if guessed is not None and guessed != source:
        raise DataError(
            f"data file '{path}' looks like {guessed} but data.source={source}; set "
            f"data.source={guessed} (or auto, to go by the file names)"
        )
    return source


class LocalFiles(Source):
    names = ("auto", "json", "parquet")
    kinds = ("json", "parquet")

    def catalog(self, cfg: DataConfig) -> Catalog:
        return Catalog([self._describe(p, cfg) for p in local_files(cfg)], cfg.piece_bytes)

    def _describe(self, path: str, cfg: DataConfig) -> CorpusFile:
        kind = file_format(path, cfg.source)
        return describe_parquet(path) if kind == "parquet" else describe_file(path, kind, cfg.piece_bytes)

    def read_rows(self, piece: Piece, cfg: DataConfig, start_row: int) -> Iterator[object]:
        read = parquet_rows if piece.kind == "parquet" else json_rows
        return read(piece, cfg.text_field, start_row)
