"""The data path at scale, measured on a local "hub-like" parquet corpus (16 files x several row
groups of the bundled text, repeated) and its pre-tokenised shards.

    python -m bench.bench_data [--files 16] [--docs-per-file 900] [--row-group 64]

Prints, and asserts nothing:
  * read amplification: rows each rank reads ÷ rows its shards train on, at 1, 2 and 4 ranks
    (target <= 1.1; before pieces, every rank read the whole stream: W);
  * resume cost: time to the first step after resuming in the last file ÷ in the first (<= 1.5);
  * loader throughput per rank, one reader thread, streaming (parquet → tokenise → pack) and from
    token shards (memmap → pack), against the ~0.5M tokens/s a 125M model takes per H100;
  * raw `encode_batch` tokens/s on the same text: the ceiling of the streaming path.
Ranks are simulated in one process (a loader per rank): what is measured is what each would read.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from data import DataConfig, PackedLoader, build_val_set, load_tokenizer, open_documents
from data.prepare import prepare

ROOT = Path(__file__).resolve().parent.parent

CORPUS = ["assets/corpus/fineweb_edu_sample10BT_first150.jsonl", "assets/corpus/fineweb_sample10BT_first300.jsonl"]
H100_125M_TOKENS_S = 0.5e6


def make_corpus(out: Path, files: int, docs_per_file: int, row_group: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [json.loads(line)["text"] for f in CORPUS for line in (ROOT / f).read_text().splitlines()]
    paths = []
    for k in range(files):
        rows = [texts[(k * docs_per_file + i) % len(texts)] for i in range(docs_per_file)]
        path = out / f"train-{k:05d}.parquet"
        pq.write_table(
            pa.table({"text": rows, "id": [f"{k}-{i}" for i in range(docs_per_file)]}), path, row_group_size=row_group
        )
        paths.append(str(path))
    return paths


def amplification(cfg: DataConfig, tok, steps: int, windows: int) -> None:
    """Rows parsed and tokenised by each rank's reader ÷ rows its shards took (read-ahead off, so
    what is read ahead for later steps does not count as waste)."""
    cfg = DataConfig(**{**cfg.__dict__, "prefetch_steps": 0})
    for world in (1, 2, 4):
        ratios = []
        for rank in range(world):
            docs = open_documents(cfg, tok)
            _, first = build_val_set(cfg, docs)
            val_rows = docs.rows_read
            loader = PackedLoader(cfg, docs, first, windows, rank=rank, world_size=world)
            for _ in range(steps):
                loader.next_step()
            taken = sum(shard.rows_taken for shard in loader.shards.values())
            ratios.append((docs.rows_read - val_rows) / taken)
        print(
            f"read amplification, {world} rank(s): "
            + ", ".join(f"{r:.3f}" for r in ratios)
            + f"  (+ the validation set's {val_rows} rows, read once per rank; what is read and not"
            " yet taken is at most the piece each shard stands in)"
        )


def resume_cost(cfg: DataConfig, tok, windows: int, repeat: int = 3) -> None:
    docs = open_documents(cfg, tok)
    _, first = build_val_set(cfg, docs)
    times = {}
    for where in ("first", "last"):
        best = float("inf")
        for _ in range(repeat):
            loader = PackedLoader(cfg, docs, first, windows)
            state = loader.state_dict()
            for s, saved in state["shards"].items():  # every shard at the start of its first or last piece
                saved["cursor"] = 0 if where == "first" else len(loader.shards[s].pieces) - 1
            t0 = time.perf_counter()
            fresh = PackedLoader(cfg, docs, first, windows)
            fresh.load_rank_states([state])
            fresh.next_step()
            best = min(best, time.perf_counter() - t0)
            fresh.close()
        times[where] = best
    print(
        f"resume: first step {times['first'] * 1e3:.0f} ms at the first file, {times['last'] * 1e3:.0f} ms "
        f"at the last; ratio {times['last'] / times['first']:.2f} (target <= 1.5)"
    )


def throughput(cfg: DataConfig, tok, windows: int, steps: int, label: str) -> float:
    docs = open_documents(cfg, tok)
    _, first = build_val_set(cfg, docs)
    loader = PackedLoader(cfg, docs, first, windows)
    loader.next_step()  # thread start, first pieces
    t0 = time.perf_counter()
    for _ in range(steps):
        loader.next_step()
    elapsed = time.perf_counter() - t0
    loader.close()
    tps = steps * windows * cfg.seq_len / elapsed
    print(f"{label:<34} {tps:>12,.0f} tokens/s  ({tps / H100_125M_TOKENS_S:.1f}x a 125M model on one H100)")
    return tps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--docs-per-file", type=int, default=900)
    parser.add_argument("--row-group", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--amplification-steps", type=int, default=1000)
    args = parser.parse_args()
    torch_threads = os.environ.get("OMP_NUM_THREADS")
    tmp = Path(tempfile.mkdtemp())
    files = make_corpus(tmp, args.files, args.docs_per_file, args.row_group)
    cfg = DataConfig(
        source="parquet",
        data_files=files,
        seq_len=args.seq_len,
        val_tokens=16 * args.seq_len,
        logical_shards=16,
        encode_batch_docs=256,
        tokenizer="assets/tokenizers/gpt2",
    )
    tok = load_tokenizer(cfg.tokenizer)
    docs = open_documents(cfg, tok)
    print(
        f"corpus: {args.files} parquet files x {args.docs_per_file} rows, row groups of {args.row_group}: "
        f"{len(docs)} pieces; OMP_NUM_THREADS={torch_threads}, {os.cpu_count()} cores"
    )

    amplification(cfg, tok, steps=args.amplification_steps, windows=16)
    resume_cost(cfg, tok, windows=16)

    texts = [t for t in (json.loads(line)["text"] for f in CORPUS for line in (ROOT / f).read_text().splitlines())]
    t0 = time.perf_counter()
    raw = sum(len(ids) for i in range(0, len(texts) * 4, 256) for ids in tok.encode_batch((texts * 4)[i : i + 256]))
    print(f"{'raw encode_batch (the ceiling)':<34} {raw / (time.perf_counter() - t0):>12,.0f} tokens/s")
    throughput(cfg, tok, windows=16, steps=60, label="streaming parquet (1 reader thread)")
    prepare(cfg, tmp / "tokens", workers=2, progress=False)
    tcfg = DataConfig(**{**cfg.__dict__, "source": "tokens", "data_files": [str(tmp / "tokens")]})
    throughput(tcfg, tok, windows=64, steps=200, label="token shards (memmap, 1 reader)")
    shuffled = DataConfig(**{**tcfg.__dict__, "shuffle": True, "shuffle_buffer": 256})
    throughput(shuffled, tok, windows=64, steps=200, label="token shards, shuffled")


if __name__ == "__main__":
    main()
