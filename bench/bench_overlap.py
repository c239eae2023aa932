"""Benchmark (prints, does not assert): the owner exchange pipelined or not, by bucket size, on CPU.

    python -m bench.bench_overlap [--ranks 2 4] [--rounds 7] [--steps 3] [--d-model 256] [--out FILE]

Launches itself under torchrun (gloo) once per world size. Each launch builds a GPT (the tiny
preset at --d-model, 4 layers), shards it with FSDP2 (and, on 4 ranks, as HSDP 2 x 2), and times
ShardedMuonFamily.step() alone (OrScale-LM, fp32 Newton–Schulz, synthetic gradients) for every
bucket size with overlap on and off. Rounds interleave the configurations (every configuration once
per round, in a rotated order), so a load change on the machine hits all of them alike; the figure
per configuration is the median over rounds of the per-round median step, with the range over
rounds. The speed-up column compares overlap on with overlap off at the same bucket size.
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
BUCKETS = (1 << 27, 1 << 21, 1 << 19, 1 << 17)  # whole-matrix elements (the first: one bucket)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from models import GPT, get_preset
    from orscale import MuonFamily, OptimConfig, build_optimizers, set_lr

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    layouts = {"fsdp": None}
    if world == 4:
        layouts["hsdp"] = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    configs = [(lay, b, ov) for lay in layouts for b in BUCKETS for ov in (True, False)]
    optims = {}
    for lay, mesh in layouts.items():
        for bucket in BUCKETS:
            for overlap in (True, False):
                model = GPT(get_preset("tiny", d_model=args.d_model, n_head=4, vocab_size=512), seed=0)
                for block in model.blocks:
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
                opts = build_optimizers(
                    model,
                    OptimConfig(name="orscale_lm").with_options(MuonOptions(ns_dtype="fp32")),
                    "fsdp",
                    overlap=overlap,
                    bucket_numel=bucket,
                )
                muon = next(o for o in opts if isinstance(o, MuonFamily))
                set_lr([muon], 1e-3)
                for group in muon.param_groups:
                    for p in group["params"]:
                        p.grad = torch.zeros_like(p)
                        p.grad.to_local().normal_(generator=torch.Generator().manual_seed(rank))
                muon.step()  # warm-up: calibration, the NS batching's first shapes
                optims[(lay, bucket, overlap)] = muon
    times: dict[str, list[float]] = {f"{c[0]}/{c[1]}/{c[2]}": [] for c in configs}
    n_buckets = {}
    for r in range(args.rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]  # rotated: no fixed position
        for cfg in order:
            muon = optims[cfg]
            step_times = []
            for _ in range(args.steps):
                dist.barrier()
                t0 = time.perf_counter()
                muon.step()
                step_times.append(time.perf_counter() - t0)
            # the slowest rank's time is the step's
            slowest = torch.tensor(statistics.median(step_times))
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times[f"{cfg[0]}/{cfg[1]}/{cfg[2]}"].append(float(slowest))
            n_buckets[f"{cfg[0]}/{cfg[1]}"] = muon.n_collectives
    if rank == 0:
        Path(args.json).write_text(json.dumps({"world": world, "times": times, "collectives": n_buckets}))
    dist.destroy_process_group()


def launch(nproc: int, args: argparse.Namespace, out: Path) -> dict:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={port}"]
    cmd += [__file__, "--json", str(out), "--rounds", str(args.rounds), "--steps", str(args.steps)]
    cmd += ["--d-model", str(args.d_model)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"torchrun --nproc_per_node={nproc} failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def table(results: list[dict]) -> str:
    lines = [
        "| ranks | layout | bucket (elements) | collectives | overlap off, ms | overlap on, ms | on / off "
        "| on / one bucket on |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for res in results:
        t = res["times"]
        for key in dict.fromkeys(k.rsplit("/", 1)[0] for k in t):
            lay, bucket = key.split("/")
            on, off, one = t[f"{key}/True"], t[f"{key}/False"], t[f"{lay}/{BUCKETS[0]}/True"]
            lines.append(
                f"| {res['world']} | {lay} | 2^{int(bucket).bit_length() - 1} | {res['collectives'][key]} "
                f"| {_fmt(off)} | {_fmt(on)} | {_ratio(on, off)} | {_ratio(on, one)} |"
            )
    return "\n".join(lines)


def _ratio(a: list[float], b: list[float]) -> str:
    """Median [min, max] of the per-round ratios: each round's two figures saw the same load."""
    r = [x / y for x, y in zip(a, b, strict=True)]
    return f"{statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]"


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.1f} [{min(xs) * 1e3:.1f}, {max(xs) * 1e3:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per configuration per round")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    parser.add_argument("--json", help=argparse.SUPPRESS)  # set when running under torchrun
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(args)
        return
    import tempfile

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = [launch(n, args, Path(tmp) / f"overlap_{n}.json") for n in args.ranks]
    text = table(results)
    load = os.getloadavg()
    print(
        f"{text}\n\nmedian [min, max] over {args.rounds} interleaved rounds; load average {load[0]:.1f} "
        f"on {os.cpu_count()} CPUs; {time.perf_counter() - t0:.0f} s"
    )
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
