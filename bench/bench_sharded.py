"""Benchmark (prints, does not assert): the sharded Muon family on the tiny GPT, 1 vs 2 ranks.

    python -m bench.bench_sharded [--steps 3] [--preset tiny]

Launches itself under torchrun (gloo, CPU) with 1 and then 2 processes. Each run builds
``models.get_preset(preset)``, shards it (FSDP2 ``fully_shard`` per block then the root, as
launch/parallelize.py does; or DDP), builds the optimizers with ``build_optimizers(..., backend,
mode)`` (orscale_lm) and takes a few real forward/backward + optimizer steps. It reports, for the
last step:

1. Newton–Schulz calls per rank on 2 ranks ÷ on 1 (target ≈ 0.5 in owner mode; replicate = 1);
2. bytes sent per step by the Muon optimizer's collectives ÷ matrix-parameter bytes (fp32):
   per rank and summed over ranks (target ≤ 2). all_to_all counts the bytes leaving the rank;
   all_gather and all_reduce count a ring algorithm's share (orscale/distributed/owners.py);
3. the Muon step's wall time (median; 2 shared CPU cores, so only a rough figure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from orscale.muon_spec import MuonOptions

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = [
    ("fsdp", "owner", "bf16"),
    ("fsdp", "owner", "fp32"),
    ("fsdp", "replicate", "bf16"),
    ("ddp", "owner", "bf16"),
    ("ddp", "replicate", "bf16"),
]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from models.gpt import GPT
    from models.presets import get_preset
    from orscale import MuonFamily, OptimConfig, build_optimizers, set_lr

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for backend, mode, ns_dtype in CONFIGS:
        torch.manual_seed(0)
        model = GPT(get_preset(args.preset))
        if backend == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            module = model
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP

            module = DDP(model)
        opts = build_optimizers(
            module,
            OptimConfig(name="orscale_lm").with_options(MuonOptions(ns_dtype=ns_dtype)),
            backend=backend,
            mode=mode,
        )
        muon = next(o for o in opts if isinstance(o, MuonFamily))
        matrix_bytes = sum(p.numel() * 4 for g in muon.param_groups for p in g["params"])
        n_matrices = sum(len(g["params"]) for g in muon.param_groups)
        times = []
        gen = torch.Generator().manual_seed(rank)
        for _ in range(args.steps):
            idx = torch.randint(0, model.cfg.vocab_size, (2, 64), generator=gen)
            logits = module(idx)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), torch.roll(idx, -1, 1).flatten())
            loss.backward()
            set_lr(opts, 1e-3)
            dist.barrier()
            t0 = time.perf_counter()
            muon.step()
            times.append(time.perf_counter() - t0)
            for o in opts:
                if o is not muon:
                    o.step()
                o.zero_grad(set_to_none=True)
        stats = [None] * world
        dist.all_gather_object(
            stats,
            dict(
                ns_calls=muon.ns_calls,
                bytes_sent=muon.bytes_sent,
                collectives=muon.n_collectives,
                step_s=statistics.median(times),
            ),
        )
        out.append(
            dict(
                backend=backend,
                mode=mode,
                ns_dtype=ns_dtype,
                world=world,
                n_matrices=n_matrices,
                matrix_bytes=matrix_bytes,
                ranks=stats,
            )
        )
    if rank == 0:
        Path(args.json).write_text(json.dumps(out))
    dist.destroy_process_group()


def launch(nproc: int, args: argparse.Namespace, tmp: Path) -> list[dict]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp / f"bench_sharded_{nproc}.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={port}",
        __file__,
        "--json",
        str(out),
        "--steps",
        str(args.steps),
        "--preset",
        args.preset,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"torchrun --nproc_per_node={nproc} failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def report(one: list[dict], two: list[dict]) -> None:
    print(
        f"tiny GPT: {one[0]['n_matrices']} matrices, {one[0]['matrix_bytes'] / 2**20:.2f} MiB of fp32 matrix parameters"
    )
    head = (
        "backend/mode/ns",
        "NS 1r",
        "NS 2r (per rank)",
        "NS ratio",
        "bytes/rank ÷ mat",
        "bytes all ranks ÷ mat",
        "colls",
        "step 1r",
        "step 2r",
    )
    print(" | ".join(head))
    for a, b in zip(one, two, strict=True):
        ns1 = a["ranks"][0]["ns_calls"]
        ns2 = [r["ns_calls"] for r in b["ranks"]]
        sent = [r["bytes_sent"] for r in b["ranks"]]
        print(
            " | ".join(
                [
                    f"{b['backend']}/{b['mode']}/{b['ns_dtype']}",
                    str(ns1),
                    str(ns2),
                    f"{max(ns2) / ns1:.2f} (mean {statistics.mean(ns2) / ns1:.2f})",
                    f"{max(sent) / b['matrix_bytes']:.3f}",
                    f"{sum(sent) / b['matrix_bytes']:.3f}",
                    str(b["ranks"][0]["collectives"]),
                    f"{a['ranks'][0]['step_s'] * 1e3:.0f} ms",
                    f"{max(r['step_s'] for r in b['ranks']) * 1e3:.0f} ms",
                ]
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--json", help=argparse.SUPPRESS)  # set when running under torchrun
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(args)
        return
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        one = launch(1, args, Path(tmp))
        two = launch(2, args, Path(tmp))
    report(one, two)


if __name__ == "__main__":
    main()
