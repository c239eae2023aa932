"""Run a grid of training runs: scales x optimizers x learning rates x seeds (see launch/sweep/spec.py).

    python -m launch.sweep configs/sweeps/cpu_mini.yaml                  # local, one cell after another
    python -m launch.sweep configs/sweeps/paper.yaml --submit            # one Slurm job per cell
    python -m launch.sweep SWEEP.yaml --dry-run [--submit] [--nproc N] [--only 'l1d64/*']

Finished cells (a final evaluation at train.max_steps in metrics.jsonl) are skipped; unfinished ones
are re-run with the same command, and train.py's run.resume=auto continues them from their newest
checkpoint. A failing cell does not stop the others. Exit status: 0 when no cell failed, 1 when
some did, 2 for a bad sweep file or arguments.
"""

from __future__ import annotations

import argparse
import fnmatch
import shlex
import shutil
import subprocess
import sys
import time

from launch.sweep.jobs import (
    GpuSlots,
    cell_state,
    gpu_slots,
    run_local,
    start_cell,
    submit,
    threads_per_rank,
    train_argv,
    uses_gpus,
)
from launch.sweep.plan import Plan, plan, write_plan
from launch.sweep.spec import ROOT, Cell, SpecError, Sweep, load_sweep


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch.sweep", description=(__doc__ or "").splitlines()[0])
    p.add_argument("sweep", help="sweep YAML (e.g. configs/sweeps/cpu_mini.yaml)")
    p.add_argument("--dry-run", action="store_true", help="print every command (and job script); write nothing")
    p.add_argument("--submit", action="store_true", help="one Slurm job script per cell, submitted with sbatch")
    p.add_argument(
        "--nproc", type=int, help="processes (GPUs) per node per cell; local default 1, Slurm: slurm.gpus_per_node or 8"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="local cells run at once, each as its own process, its ranks with cpu_count/(jobs x nproc) threads "
        "each (default 1: one "
        "after another, in this process where it can); on a GPU node each holds --nproc GPUs of its own "
        "(CUDA_VISIBLE_DEVICES), and fewer run at once when the GPUs run out",
    )
    p.add_argument("--only", help="run the cells whose id (scale/optim/lrX-seedY) matches this glob (or contains it)")
    return p.parse_args(argv)


def select(cells: list[Cell], pattern: str | None) -> list[Cell]:
    if not pattern:
        return cells
    glob = any(c in pattern for c in "*?[")
    return [c for c in cells if (fnmatch.fnmatch(c.id, pattern) if glob else pattern in c.id)]


def _fmt_loss(v: float | None) -> str:
    return "-" if v is None else f"val_loss {v:.4f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sweep = load_sweep(args.sweep)
        if args.nproc is not None and args.nproc < 1:
            raise SpecError(f"--nproc must be >= 1, got {args.nproc}")
        if args.jobs < 1:
            raise SpecError(f"--jobs must be >= 1, got {args.jobs}")
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    nproc = args.nproc or (int(sweep.slurm.get("gpus_per_node", 8)) if args.submit else 1)
    current = plan(sweep, cell_state)
    cells = select(current.cells, args.only)
    if not cells:
        example = current.cells[0].id if current.cells else "scale/optim/lrX-seedY"
        print(f"error: no cell matches --only {args.only!r} (cells look like {example})", file=sys.stderr)
        return 2
    states = {c.id: cell_state(c) for c in cells}
    todo = [c for c in cells if not states[c.id][0]]
    print(
        f"sweep {args.sweep}: {len(cells)} cells, {len(cells) - len(todo)} finished, {len(todo)} to run "
        f"-> {sweep.runs_dir}"
    )
    summary: list[tuple[Cell, str, str]] = [
        (c, "skipped", _fmt_loss(states[c.id][1]) + " (finished)") for c in cells if states[c.id][0]
    ]
    if args.submit or args.dry_run:
        if args.submit:
            summary += submit(todo, sweep, nproc, args.dry_run)
        else:
            print(f"# run from {ROOT}")
            for c in todo:
                print(shlex.join(train_argv(c, nproc)))
            summary += [(c, "dry-run", "would run") for c in todo]
        if not args.dry_run:
            write_plan(sweep, current)
        _print_waiting(current)
        _print_summary(summary, cells)
        if args.submit and not args.dry_run and shutil.which("sbatch") is None and todo:
            print(
                f"error: sbatch not found on PATH; job scripts written under {sweep.runs_dir / 'slurm'} "
                "(submit them with the commands above)",
                file=sys.stderr,
            )
            return 1
        return 0
    try:
        slots, note = gpu_slots(cells, args.jobs, nproc)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if note:
        print(f"note: {note}")
    stopped = _run_all(sweep, args, nproc, summary, slots)
    _print_waiting(plan(sweep, cell_state))
    _print_summary(summary, select(plan(sweep, cell_state).cells, args.only))
    return 1 if stopped or any(state.startswith(("failed", "stopped")) for _, state, _ in summary) else 0


def _run_all(
    sweep: Sweep, args: argparse.Namespace, nproc: int, summary: list[tuple[Cell, str, str]], slots: GpuSlots | None
) -> bool:
    """Run cells until the plan has none left to run (an LR search adds cells as its runs finish);
    each cell is tried once per invocation. `slots`: the node's GPUs shared by the cells running at
    once (launch.sweep.jobs.gpu_slots). Returns True when a cell stopped on a signal."""
    tried: set[str] = {c.id for c, _, _ in summary}
    running: dict[str, tuple[Cell, subprocess.Popen, float]] = {}
    n = 0
    while True:
        current = plan(sweep, cell_state)
        write_plan(sweep, current)
        todo = [c for c in select(current.cells, args.only) if c.id not in tried and not cell_state(c)[0]]
        if not todo and not running:
            return False
        while todo and len(running) < args.jobs:
            gpus = None
            if slots is not None and uses_gpus(todo[0]):
                if (gpus := slots.take(todo[0].id)) is None:
                    break  # every GPU is held by running cells: start it when one ends
            c = todo.pop(0)
            tried.add(c.id)
            n += 1
            on = f"CUDA_VISIBLE_DEVICES={','.join(gpus)} " if gpus is not None else ""
            print(f"[{n}] {c.id}: {on}{shlex.join(train_argv(c, nproc))}", flush=True)
            if args.jobs == 1:
                t0 = time.perf_counter()
                if _record(summary, c, run_local(c, nproc), time.perf_counter() - t0):
                    return True
            else:
                at_once = min(args.jobs, slots.cells_at_once) if slots is not None else args.jobs
                threads = threads_per_rank(at_once, nproc)
                running[c.id] = (c, start_cell(c, nproc, threads=threads, gpus=gpus), time.perf_counter())
        if running:
            done = _wait_any(running)
            c, proc, t0 = running.pop(done)
            if slots is not None:
                slots.give_back(c.id)
            if _record(summary, c, proc.returncode, time.perf_counter() - t0):
                for other, p, _ in running.values():  # a signal: let the others checkpoint too
                    p.wait()
                    summary.append((other, "stopped", "checkpointed; re-run the sweep to continue"))
                return True


def _wait_any(running: dict[str, tuple[Cell, subprocess.Popen, float]]) -> str:
    while True:
        for cid, (_, proc, _) in running.items():
            if proc.poll() is not None:
                return cid
        time.sleep(0.5)


def _record(summary: list[tuple[Cell, str, str]], c: Cell, rc: int, seconds: float) -> bool:
    """Add a finished attempt to the summary; True when the cell stopped on a signal (end the sweep)."""
    finished, val = cell_state(c)
    took = f"{seconds:.1f} s"
    if rc == 0 and finished:
        summary.append((c, "done", f"{_fmt_loss(val)} ({took})"))
    elif rc == 0:  # train.py saved and exited on SIGINT/SIGTERM: the user wants to stop
        summary.append((c, "stopped", f"checkpointed; re-run the sweep to continue ({took})"))
        print("a cell stopped on a signal: ending the sweep here", file=sys.stderr)
        return True
    else:
        summary.append((c, f"failed rc={rc}", f"{_fmt_loss(val)} ({took})"))
    return False


def _print_waiting(current: Plan) -> None:
    for line in current.waiting:
        print(f"  waiting: {line}")


def _print_summary(summary: list[tuple[Cell, str, str]], cells: list[Cell]) -> None:
    order = {c.id: i for i, c in enumerate(cells)}
    width = max(len(c.id) for c in cells)
    print("summary:")
    for cell, state, note in sorted(summary, key=lambda r: order[r[0].id]):
        print(f"  {cell.id:<{width}}  {state:<10}  {note}")
