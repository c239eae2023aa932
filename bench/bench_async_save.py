"""Benchmark (prints, does not assert): checkpoints written synchronously against `run.async_save=true`,
on CPU: the time training is blocked per save, the background write's duration, the time of the
steps that train while a write is in flight, and the host memory the staging costs.

    python -m bench.bench_async_save [--preset tiny|125m] [--nproc 1|2] [--steps 6] [--every 2]

Each mode is one real run (`python` for one process, `torchrun --standalone` for 2 ranks, FSDP2) of
configs/tiny.yaml with the model preset given, `--steps` steps of 4 windows of 128 tokens,
checkpoints every `--every` steps (the last step's save is synchronous in both modes and not
counted). Every rank records, in-process, when each step ended, how long each save
(`Checkpointing.write`) held the loop, when each background write ran
(launch.checkpoint.async_writer.BackgroundWrite) and its resident memory every 10 ms. Reported per
interval save: blocked sync / blocked async / background write (slowest rank); the steps trained
while a write was in flight, async against the same steps of the sync run (slowest rank; the save's
own time taken out); the peak RSS from the first save until the last step's save, against the peak of
the steps before the first save (largest rank).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Recorder:
    """Timestamps and memory of one rank's run, gathered by wrapping the trainer's own methods."""

    def __init__(self) -> None:
        self.step_end: dict[int, float] = {}
        self.saves: list[dict[str, float]] = []
        self.writes: list[dict[str, float]] = []
        self.samples: list[tuple[float, int]] = []  # (time, RSS)
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._done.wait(0.01):
            self.samples.append((time.perf_counter(), _rss()))

    def install(self) -> None:
        from launch.checkpoint.async_writer import BackgroundWrite
        from launch.features.checkpointing import Checkpointing
        from launch.run.traces import StepTracing

        rec, step_of_tracing, save, run_write = self, StepTracing.step, Checkpointing.write, BackgroundWrite._run

        def traced_step(tracing: Any, step: int) -> None:
            rec.step_end[step] = time.perf_counter()
            step_of_tracing(tracing, step)

        def timed_save(feature: Any, trainer: Any, wait: bool = False) -> Any:
            started = time.perf_counter()
            out = save(feature, trainer, wait)
            rec.saves.append({"step": trainer.state.step, "start": started, "end": time.perf_counter()})
            return out

        def timed_write(write: Any, work: Any) -> None:
            started = time.perf_counter()
            run_write(write, work)
            rec.writes.append({"step": write.step, "start": started, "end": time.perf_counter()})

        StepTracing.step, Checkpointing.write, BackgroundWrite._run = traced_step, timed_save, timed_write  # type: ignore[method-assign]

    def result(self) -> dict[str, Any]:
        self._done.set()
        self._sampler.join()
        return {
            "step_end": self.step_end,
            "saves": self.saves,
            "writes": self.writes,
            "samples": self.samples,
        }


def worker(args: argparse.Namespace) -> None:
    """One rank of one run: train, then write what was recorded to <out>/rank<R>.json."""
    import torch

    from launch.loop import train
    from launch.plan import load_plan
    from launch.runtime.console import setup_logging
    from launch.runtime.process_group import shutdown

    rank = int(os.environ.get("RANK", "0"))
    setup_logging(rank)
    rec = _Recorder()
    rec.install()
    overrides = [
        f"model.preset={args.preset}",
        "model.max_seq_len=128",
        "data.seq_len=128",
        "data.val_tokens=1024",
        "data.logical_shards=4",
        "train.tokens_per_step=512",
        f"train.micro_batch_size={4 // args.nproc}",
        f"train.max_steps={args.steps}",
        f"train.ckpt_every={args.every}",
        "train.eval_every=0",
        "train.log_every=1",
        "train.progress=false",
        "optim.warmup_steps=1",
        f"run.dir={args.out / 'run'}",
        f"run.async_save={args.mode == 'async'}",
        f"parallel.backend={'fsdp' if args.nproc > 1 else 'none'}",
    ]
    if not torch.cuda.is_available():
        overrides.append("optim.muon.ns_dtype=fp32")  # bf16 GEMMs are ~40x slower on a CPU without native ones
    train(load_plan(str(ROOT / "configs/tiny.yaml"), overrides))
    shutdown()
    (args.out / f"rank{rank}.json").write_text(json.dumps(rec.result()))


def _run(args: argparse.Namespace, mode: str, out: Path) -> list[dict[str, Any]]:
    worker_args = ["--worker", "--mode", mode, "--out", str(out), "--preset", args.preset]
    # --world, not --nproc: torchrun's parser would take `--nproc` for its own --nproc-per-node
    worker_args += ["--world", str(args.nproc), "--steps", str(args.steps), "--every", str(args.every)]
    if args.nproc == 1:
        cmd = [sys.executable, "-m", "bench.bench_async_save", *worker_args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}"]
        cmd += ["-m", "bench.bench_async_save", *worker_args]
    environ = {**os.environ, "OMP_NUM_THREADS": str(2 // args.nproc), "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run(cmd, cwd=ROOT, env=environ, check=True, stdout=subprocess.DEVNULL)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.nproc)]


def _step_times(rank: dict[str, Any]) -> dict[int, float]:
    """Each step's time, from the end of the step before, less any save the loop made in between."""
    ends = {int(k): v for k, v in rank["step_end"].items()}
    out = {}
    for step in sorted(ends)[1:]:
        held = sum(s["end"] - s["start"] for s in rank["saves"] if ends[step - 1] <= s["start"] < ends[step])
        out[step] = ends[step] - ends[step - 1] - held
    return out


def _in_flight(rank: dict[str, Any]) -> list[int]:
    """Steps that trained, at least partly, while a background write ran."""
    ends = {int(k): v for k, v in rank["step_end"].items()}
    return [
        step
        for step in sorted(ends)[1:]
        if any(w["start"] < ends[step] and w["end"] > ends[step - 1] for w in rank["writes"])
    ]


def report(args: argparse.Namespace, sync: list[dict[str, Any]], async_: list[dict[str, Any]], size: int) -> None:
    world = f"{args.nproc} ranks (FSDP2)" if args.nproc > 1 else "1 process"
    print(f"\n{args.preset}, {world}: checkpoint {size / GIB:.2f} GiB on disk; {args.steps} steps, every {args.every}")
    print("| save at step | blocked, sync | blocked, async | background write |")
    print("| --- | --- | --- | --- |")
    interval = [s["step"] for s in sync[0]["saves"] if s["step"] < args.steps]
    for i, step in enumerate(interval):
        blocked_sync = max(r["saves"][i]["end"] - r["saves"][i]["start"] for r in sync)
        blocked_async = max(r["saves"][i]["end"] - r["saves"][i]["start"] for r in async_)
        write = max((w["end"] - w["start"] for r in async_ for w in r["writes"] if w["step"] == step), default=0.0)
        print(f"| {step} | {blocked_sync:.2f} s | {blocked_async:.2f} s | {write:.2f} s |")
    overlapped = sorted(set().union(*(_in_flight(r) for r in async_)))
    if overlapped:
        t_sync = [max(_step_times(r)[s] for r in sync) for s in overlapped]
        t_async = [max(_step_times(r)[s] for r in async_) for s in overlapped]
        rows = ", ".join(f"{s}: {a:.2f} s vs {b:.2f} s" for s, a, b in zip(overlapped, t_async, t_sync, strict=True))
        slower = 100 * (sum(t_async) / sum(t_sync) - 1)
        print(f"steps trained during a background write (async vs sync run): {rows} ({slower:+.0f}% in all)")
    for name, ranks in (("sync", sync), ("async", async_)):
        base, peak = zip(*(_saving_memory(r) for r in ranks), strict=True)
        print(
            f"RSS while the interval checkpoints were saved, {name}: peak {max(peak) / GIB:.2f} GiB per rank, "
            f"{max(p - b for p, b in zip(peak, base, strict=True)) / GIB:+.2f} GiB over the peak of the steps before it"
        )


def _saving_memory(rank: dict[str, Any]) -> tuple[int, int]:
    """(peak RSS of the steps before the first save: training's own, peak RSS from the first save
    until the last step's save began: training's and the interval saves')."""
    first, last = rank["saves"][0]["start"], rank["saves"][-1]["start"]
    before = [rss for t, rss in rank["samples"] if t < first]
    during = [rss for t, rss in rank["samples"] if first <= t < last]
    return max(before, default=0), max(during, default=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--nproc", type=int, default=1, choices=(1, 2))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="sync", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.nproc = args.world
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        results, size = {}, 0
        for mode in ("sync", "async"):
            out = Path(tmp) / mode
            out.mkdir()
            results[mode] = _run(args, mode, out)
            first = out / "run" / "checkpoints" / f"step_{args.every:08d}"
            size = sum(f.stat().st_size for f in first.rglob("*") if f.is_file())
        report(args, results["sync"], results["async"], size)


if __name__ == "__main__":
    main()
