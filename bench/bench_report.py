"""Time `python -m report` on a synthetic sweep: 200 run directories of 20,000 steps each.

    python -m bench.bench_report [--runs 200] [--steps 20000] [--keep DIR]

Each run has config.yaml, run.log (commit + setup json) and metrics.jsonl as train.py writes them:
log_every 10 -> 2,000 training lines (with the ~60 `diag/...` keys for the Muon family, mfu,
peak memory, parameter counts) and eval_every 1,000 -> 20 evaluation lines. Prints the time the
report takes end to end (a fresh interpreter: imports, reading, statistics, plots). Target: < 10 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SCALES = {
    "125m": (12, 768, 1024, 262144),
    "399m": (12, 1536, 8192, 786432),
    "545m": (14, 1792, 4096, 1048576),
    "1.1b": (18, 2304, 4096, 1572864),
}  # L, d, context, tokens/step
OPTIMS = ["adamw", "muon_moonlight", "orscale_lm", "muon", "orscale"]
LRS = [3e-4, 6e-4, 1e-3, 2e-3, 4e-3]
CLASSES = ["attn_qkv", "attn_out", "mlp_up", "mlp_down", "all"]
FIELDS = ["r_raw", "r", "w_norm", "q_norm", "update_ratio", "c", "frac_rmin", "frac_rmax"]


def config(scale: str, optim: str, lr: float, seed: int, steps: int, run_dir: Path) -> dict:
    n_layer, d, ctx, tps = SCALES[scale]
    return {
        "run": {"dir": str(run_dir), "resume": "auto", "overwrite": False, "keep_checkpoints": 3},
        "model": {
            "preset": scale,
            "n_layer": None,
            "d_model": None,
            "n_head": None,
            "max_seq_len": None,
            "vocab_size": None,
        },
        "data": {
            "source": "HuggingFaceFW/fineweb-edu",
            "subset": "sample-10BT",
            "data_files": [],
            "split": "train",
            "text_field": "text",
            "tokenizer": "assets/tokenizers/gpt2",
            "seq_len": ctx,
            "val_tokens": 10485760,
            "val_batch_size": 16,
            "encode_batch_docs": 256,
            "logical_shards": 64,
        },
        "optim": {
            "name": optim,
            "lr": lr,
            "weight_decay": 0.1,
            "betas": [0.9, 0.95],
            "eps": 1e-8,
            "momentum": 0.95,
            "nesterov": True,
            "ns_steps": 5,
            "r_min": 0.1,
            "r_max": 5.0,
            "grad_clip": 1.0,
            "warmup_steps": 1000,
            "min_lr_ratio": 0.0,
        },
        "train": {
            "max_steps": steps,
            "tokens_per_step": tps,
            "micro_batch_size": 16,
            "seed": seed,
            "log_every": 10,
            "eval_every": 1000,
            "ckpt_every": 1000,
            "dtype": "auto",
            "device": "auto",
            "progress": True,
        },
        "parallel": {"backend": "fsdp", "meta_init": True, "activation_checkpointing": False, "compile": False},
    }


def params(scale: str) -> tuple[int, int]:
    n_layer, d, _, _ = SCALES[scale]
    nonemb = n_layer * (12 * d * d + 2 * d) + d
    return nonemb + 50304 * d, nonemb


def train_lines(scale: str, diag: bool, steps: int, rng: random.Random) -> list[str]:
    """The training lines of one (scale, optimizer family), reused by its runs: generation is not timed."""
    total, nonemb = params(scale)
    tps = SCALES[scale][3]
    out = []
    for step in itertools.chain([1], range(10, steps + 1, 10)):
        rec = {
            "step": step,
            "tokens": step * tps,
            "train_loss": 3.0 + 8.0 / math.sqrt(step) + rng.gauss(0, 0.01),
            "lr": 1e-3,
            "grad_norm": 0.3 + rng.random() * 0.1,
            "tokens_per_s": 4.0e5 + rng.gauss(0, 1e4),
            "mfu": 0.42 + rng.gauss(0, 0.01),
            "peak_mem_gib": 61.3,
            "data_wait_frac": 0.002,
            "chinchilla_multiple": step * tps / (20 * total),
            "params": total,
            "non_embedding_params": nonemb,
        }
        if diag:
            for cls in CLASSES:
                for f in FIELDS:
                    rec[f"diag/{cls}/{f}"] = rng.random()
            for cls in CLASSES:
                rec[f"diag/{cls}/cum_frac_rmin"] = rng.random() * 0.01
                rec[f"diag/{cls}/cum_frac_rmax"] = rng.random() * 0.05
        out.append(json.dumps(rec) + "\n")
    return out


def generate(root: Path, n_runs: int, steps: int) -> int:
    rng = random.Random(0)
    cells = list(itertools.product(SCALES, OPTIMS, LRS, [0, 1]))[:n_runs]
    blocks = {}
    nbytes = 0
    for scale, optim, lr, seed in cells:
        diag = optim != "adamw"
        if (scale, diag) not in blocks:
            blocks[(scale, diag)] = train_lines(scale, diag, steps, rng)
        run = root / scale / optim / f"lr{lr:g}-seed{seed}"
        run.mkdir(parents=True)
        cfg = config(scale, optim, lr, seed, steps, run)
        (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        total, nonemb = params(scale)
        n_layer, d, ctx, _ = SCALES[scale]  # the presets' heads equal their layers
        model = {"n_layer": n_layer, "d_model": d, "n_head": n_layer, "max_seq_len": ctx, "vocab_size": 50304}
        setup = {"params": total, "non_embedding_params": nonemb, "model": model, "world_size": 8}
        (run / "run.log").write_text(
            f"2026-01-01 00:00:00,000 INFO run dir {run}, git commit 0123456789abcdef0123456789abcdef01234567\n"
            f"2026-01-01 00:00:00,001 INFO setup: {json.dumps(setup)}\n"
        )
        tps = SCALES[scale][3]
        # L(N) = 1.8 + 60 N^-0.2 (AdamW), Muon-family runs a few percent lower, a bowl in log LR, seed noise.
        base = (
            (1.8 + 60 * params(scale)[1] ** -0.2) * (1.0 if optim == "adamw" else 0.97)
            + 0.05 * math.log(lr / 1e-3) ** 2
            + rng.gauss(0, 0.005)
        )
        parts = []
        for line in blocks[(scale, diag)]:
            parts.append(line)
            step = int(line[9 : line.index(",")])
            if step % 1000 == 0:
                loss = base + 3.0 / math.sqrt(step) - 3.0 / math.sqrt(steps)  # = base at the end
                parts.append(
                    json.dumps({"step": step, "tokens": step * tps, "val_loss": loss, "val_tokens": 10485760}) + "\n"
                )
        text = "".join(parts)
        (run / "metrics.jsonl").write_text(text)
        nbytes += len(text)
    return nbytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--keep", type=Path, default=None, help="generate here and keep it (default: a temp dir)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_report_")) if args.keep is None else args.keep
    try:
        t0 = time.perf_counter()
        nbytes = generate(tmp / "runs", args.runs, args.steps)
        print(
            f"generated {args.runs} runs x {args.steps} steps ({nbytes / 2**30:.2f} GiB of metrics.jsonl) "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for attempt in range(2):  # the first run also warms the page cache and .pyc files
            t0 = time.perf_counter()
            cmd = [sys.executable, "-m", "report", str(tmp / "runs"), "--out", str(tmp / "report")]
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            took = time.perf_counter() - t0
            if proc.returncode != 0:
                sys.exit(f"report failed:\n{proc.stderr[-3000:]}")
            print(
                f"run {attempt + 1}: python -m report on {args.runs} runs: {took:.2f} s (target < 10 s); "
                f"{proc.stdout.strip()}"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
