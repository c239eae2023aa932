"""Pre-tokenise a corpus into token shards (`data/token_shards.py`), once for every run that uses it.

    python -m data.prepare --config configs/tiny.yaml --out data_cache/tiny [data.key=value ...] [--workers 4]
    python train.py --config configs/tiny.yaml data.source=tokens data.data_files=[data_cache/tiny]

Reads the `data:` section of a run config (source, files, tokenizer, text field, piece size),
tokenises every source file in parallel processes (one token file each), and writes the manifest
last. Resumable: a file whose shard is complete is skipped, so an interrupted run is re-run as is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from data.data_config import DataConfig
from data.data_errors import DataError
from data.documents import TextDocuments
from data.sources.hub import HubOptions
from data.sources.registry import build_catalog, read_data_section, source_of
from data.sources.tokens import holds_shards
from data.stream import Catalog, CorpusFile
from data.token_shards import SHARDS_FORMAT, SHARDS_MANIFEST, shard_names, token_dtype
from data.tokenizer import load_tokenizer


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def prepare_file(cfg_fields: dict[str, Any], k: int, corpus_file: CorpusFile, out: str) -> dict[str, Any]:
    """Tokenise source file `k` into NNNNN.tokens + NNNNN.offsets.npy; the entry JSON comes last."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one process per file already
    cfg, out_dir = DataConfig(**cfg_fields), Path(out)
    tokenizer = load_tokenizer(cfg.tokenizer)
    docs = TextDocuments(cfg, tokenizer, source_of(cfg), Catalog([corpus_file], cfg.piece_bytes))
    dtype = token_dtype(tokenizer.vocab_size)
    tokens_name, offsets_name = shard_names(k)
    offsets, pieces = [0], []
    tmp = out_dir / (tokens_name + ".tmp")
    with open(tmp, "wb") as fh:
        for j in range(len(docs)):
            rows = 0
            for doc in docs.read(j):
                rows += 1
                if doc is not None:
                    fh.write(doc.astype(dtype).tobytes())
                offsets.append(offsets[-1] + (len(doc) if doc is not None else 0))
            pieces.append(rows)
    os.replace(tmp, out_dir / tokens_name)
    with open(out_dir / (offsets_name + ".tmp"), "wb") as fh:
        np.save(fh, np.asarray(offsets, dtype=np.int64))
    os.replace(out_dir / (offsets_name + ".tmp"), out_dir / offsets_name)
    entry = {
        "source": corpus_file.path,
        "tokens": tokens_name,
        "offsets": offsets_name,
        "pieces": pieces,
        "documents": len(offsets) - 1,
        "tokens_count": offsets[-1],
    }
    _write_atomic(out_dir / f"{k:05d}.json", json.dumps(entry).encode())
    return entry


def _done_entry(out: Path, k: int, corpus_file: CorpusFile) -> dict[str, Any] | None:
    path = out / f"{k:05d}.json"
    if not path.is_file():
        return None
    entry = json.loads(path.read_text())
    complete = all((out / entry[key]).is_file() for key in ("tokens", "offsets"))
    return entry if complete and entry["source"] == corpus_file.path else None


def prepare(cfg: DataConfig, out: Path, workers: int = 1, progress: bool = True) -> dict[str, Any]:
    """Write (or finish writing) the token shards of `cfg`'s corpus into `out`; returns the manifest."""
    if not source_of(cfg).text or holds_shards(cfg):
        raise DataError("data.source=tokens is already tokenised; give the config of the text corpus")
    tokenizer = load_tokenizer(cfg.tokenizer)
    catalog = build_catalog(cfg)
    hub = cfg.own(HubOptions)
    source = {
        "source": cfg.source,
        "subset": hub.subset,
        "split": hub.split,
        "text_field": cfg.text_field,
        "piece_bytes": cfg.piece_bytes,
        "files": [f.path for f in catalog.files],
    }
    tok = {**tokenizer.describe(), "fingerprint": tokenizer.fingerprint()}
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / "prepare.json"  # what this directory is being filled with: refuse to mix
    if stamp.is_file() and json.loads(stamp.read_text()) != {"source": source, "tokenizer": tok}:
        raise DataError(f"'{out}' holds token shards of another corpus, tokenizer or piece size; use a new --out")
    _write_atomic(stamp, json.dumps({"source": source, "tokenizer": tok}).encode())
    entries: dict[int, dict[str, Any]] = {}
    todo = []
    for k, f in enumerate(catalog.files):
        done = _done_entry(out, k, f)
        if done is not None:
            entries[k] = done
        else:
            todo.append(k)
    from tqdm import tqdm

    bar = tqdm(total=len(catalog.files), initial=len(entries), desc="tokenise", unit="file", disable=not progress)
    fields = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    if workers <= 1:
        for k in todo:
            entries[k] = prepare_file(fields, k, catalog.files[k], str(out))
            bar.update(1)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(prepare_file, fields, k, catalog.files[k], str(out)): k for k in todo}
            for future in as_completed(futures):
                entries[futures[future]] = future.result()
                bar.update(1)
    bar.close()
    files = [entries[k] for k in range(len(catalog.files))]
    manifest = {
        "format": SHARDS_FORMAT,
        "tokenizer": tok,
        "source": source,
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "files": files,
        "documents": sum(e["documents"] for e in files),
        "tokens": sum(e["tokens_count"] for e in files),
    }
    _write_atomic(out / SHARDS_MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest


def _data_config(path: str | None, overrides: list[str]) -> DataConfig:
    """The `data:` section of a run config file, with `data.key=value` overrides."""
    section: dict[str, Any] = {}
    if path is not None:
        if not Path(path).is_file():
            raise DataError(f"config file '{path}' not found")
        section = dict((yaml.safe_load(Path(path).read_text()) or {}).get("data") or {})
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.startswith("data."):
            raise DataError(f"override '{item}' must look like data.key=value")
        *parents, leaf = key[len("data.") :].split(".")
        node = section
        for part in parents:  # data.hub.subset=... sets the hub source's sub-section
            node[part] = dict(node.get(part) or {})
            node = node[part]
        node[leaf] = yaml.safe_load(raw) if raw else ""
    return read_data_section(section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a run config whose data: section names the corpus")
    parser.add_argument("--out", required=True, help="output directory (created; resumable)")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("overrides", nargs="*", help="data.key=value")
    args = parser.parse_args(argv)
    try:
        manifest = prepare(
            _data_config(args.config, args.overrides), Path(args.out), args.workers, progress=not args.no_progress
        )
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"wrote {manifest['documents']} documents, {manifest['tokens']} tokens "
        f"({manifest['dtype']}) in {len(manifest['files'])} shards to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
