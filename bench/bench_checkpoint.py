"""Checkpoint size and save/load time on this machine (one process, CPU), tiny and 125M presets.

    python -m bench.bench_checkpoint [--presets tiny 125m] [--optim orscale_lm]

The optimizer state is made real by one step on random tokens, so momentum, AdamW moments and the
calibration constants are all in the checkpoint. Prints only.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from launch.checkpoint import Checkpointer
from launch.checkpoint.dcp_state import ModelAndOptimizers
from launch.run.train_state import TrainState
from launch.runtime.process_group import DistEnv
from models import GPT, get_preset
from orscale import OptimConfig, build_optimizers
from orscale.muon_spec import MuonOptions


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", nargs="+", default=["tiny", "125m"])
    parser.add_argument("--optim", default="orscale_lm")
    args = parser.parse_args()
    env = DistEnv(0, 1, 0, torch.device("cpu"), "none")
    for preset in args.presets:
        cfg = get_preset(preset, max_seq_len=64)
        model = GPT(cfg)
        optimizers = build_optimizers(model, OptimConfig(name=args.optim).with_options(MuonOptions(ns_steps=1)))
        idx = torch.randint(0, 50257, (1, 65))
        model(idx[:, :-1], idx[:, 1:]).backward()
        for opt in optimizers:
            opt.step()
        root = Path(tempfile.mkdtemp())
        t0 = time.perf_counter()
        parts = {"train_state": TrainState(0, 1)}
        path = Checkpointer(root, env, [ModelAndOptimizers(model, optimizers)], parts).save(1, {})
        save_s = time.perf_counter() - t0
        fresh = GPT(cfg)
        fresh_opts = build_optimizers(fresh, OptimConfig(name=args.optim).with_options(MuonOptions(ns_steps=1)))
        t0 = time.perf_counter()
        Checkpointer(root, env, [ModelAndOptimizers(fresh, fresh_opts)], parts).load(path)
        load_s = time.perf_counter() - t0
        print(
            f"{preset:>5} {args.optim}: {model.num_params() / 1e6:.1f}M params, checkpoint "
            f"{size_of(path) / 2**20:.1f} MiB, save {save_s:.2f} s, load {load_s:.2f} s"
        )
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
