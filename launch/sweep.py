"""Run a grid of training runs: scales x optimizers x learning rates x seeds (see launch/sweep_spec.py).

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
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from launch.report_data import read_run
from launch.sweep_spec import ROOT, Cell, SpecError, Sweep, load_sweep


def train_argv(cell: Cell, nproc: int, python: str = sys.executable) -> list[str]:
    """The exact command of a cell, run from the project root."""
    if nproc > 1 or cell.value("parallel.backend", "none") != "none":
        return [python, "-m", "launch.launcher", "--standalone", f"--nproc_per_node={nproc}",
                "train.py", "--config", cell.base, *cell.overrides]
    return [python, "train.py", "--config", cell.base, *cell.overrides]


def in_process(cell: Cell, nproc: int) -> bool:
    # One process without a process group: calling train.main saves ~2 s of interpreter and
    # torch start-up per cell, which dominates a CPU mini-sweep.
    return nproc == 1 and cell.value("parallel.backend", "none") == "none"


def cell_state(cell: Cell) -> tuple[bool, Optional[float]]:
    """(finished, final val loss) of a cell's run directory."""
    steps = cell.value("train.max_steps")
    run = read_run(cell.run_dir, expected_steps=steps if isinstance(steps, int) else None)
    return run.finished, run.final_val


def run_local(cell: Cell, nproc: int) -> int:
    """Run (or resume: train.py's run.resume=auto continues it, drops a torn metrics line, and starts
    a cell killed before its first checkpoint over) one cell; its exit status."""
    extra: list[str] = []
    argv = train_argv(cell, nproc)
    if in_process(cell, nproc):
        if str(ROOT) not in sys.path:  # train.py is a script at the root, not in a package
            sys.path.insert(0, str(ROOT))
        import train  # the project's trainer; imported once, reused for every cell

        try:
            return int(train.main(["--config", str(ROOT / cell.base), *cell.overrides, *extra]))
        except SystemExit as err:  # argparse inside train.main
            return err.code if isinstance(err.code, int) else 1
        except Exception as err:  # a crashing cell must not stop the sweep
            print(f"  {cell.id}: {type(err).__name__}: {err}", file=sys.stderr)
            return 1
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([*argv, *extra], cwd=ROOT, env=env).returncode


def slurm_script(cell: Cell, sweep: Sweep, nproc: int, log_dir: Path) -> str:
    s = sweep.slurm
    nodes = int(s.get("nodes", 1))
    head = ["#!/usr/bin/env bash", f"# sweep {sweep.path} cell {cell.id}",
            f"#SBATCH --job-name={cell.id.replace('/', '.')}", f"#SBATCH --output={log_dir}/%x-%j.out",
            f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={nproc}",
            f"#SBATCH --cpus-per-task={int(s.get('cpus_per_task', 8 * nproc))}",
            "#SBATCH --signal=TERM@120          # train.py checkpoints on SIGTERM and exits 0",
            "#SBATCH --requeue                  # a requeued job resumes from its run dir"]
    head += [f"#SBATCH --{k}={s[k]}" for k in ("time", "partition", "account") if s.get(k)]
    head += [f"#SBATCH {x}" for x in s.get("extra", [])]
    args = " ".join(shlex.quote(a) for a in ["train.py", "--config", cell.base, *cell.overrides])
    if nodes > 1:
        launch = ('head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
                  f"srun --kill-on-bad-exit=1 python -m launch.launcher --nnodes={nodes} --nproc_per_node={nproc} "
                  '--rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$head_node:29500" ' + args)
    else:
        launch = f"python -m launch.launcher --standalone --nproc_per_node={nproc} {args}"
    return "\n".join([*head, "set -euo pipefail", f"cd {shlex.quote(str(ROOT))}",
                      'export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}', launch, ""])


def submit(cells: list[Cell], sweep: Sweep, nproc: int, dry_run: bool) -> list[tuple[Cell, str, str]]:
    """Write one job script per cell under runs_dir/slurm/ and sbatch it. Returns (cell, state, note)."""
    slurm_dir = sweep.runs_dir / "slurm"
    log_dir = slurm_dir / "logs"
    sbatch = shutil.which("sbatch")
    if not dry_run:
        log_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for cell in cells:
        script = slurm_dir / (cell.id.replace("/", "__") + ".sbatch")
        text = slurm_script(cell, sweep, nproc, log_dir)
        if dry_run:
            print(f"# {script}\n{text}sbatch {shlex.quote(str(script))}\n")
            results.append((cell, "dry-run", "would submit"))
            continue
        script.write_text(text)
        if sbatch is None:
            print(f"sbatch {shlex.quote(str(script))}")
            results.append((cell, "written", str(script)))
            continue
        proc = subprocess.run([sbatch, str(script)], capture_output=True, text=True)
        out = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
        note = out[-1] if out else ""
        results.append((cell, "submitted" if proc.returncode == 0 else f"failed rc={proc.returncode}", note))
    return results


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m launch.sweep", description=__doc__.splitlines()[0])
    p.add_argument("sweep", help="sweep YAML (e.g. configs/sweeps/cpu_mini.yaml)")
    p.add_argument("--dry-run", action="store_true", help="print every command (and job script); write nothing")
    p.add_argument("--submit", action="store_true", help="one Slurm job script per cell, submitted with sbatch")
    p.add_argument("--nproc", type=int, default=None,
                   help="processes (GPUs) per node for each cell; local default 1, "
                   "Slurm default slurm.gpus_per_node or 8")
    p.add_argument("--only", default=None, help="run the cells whose id (scale/optim/lrX-seedY) matches this glob"
                   " (or contains it)")
    return p.parse_args(argv)


def select(cells: list[Cell], pattern: Optional[str]) -> list[Cell]:
    if not pattern:
        return cells
    glob = any(c in pattern for c in "*?[")
    return [c for c in cells if (fnmatch.fnmatch(c.id, pattern) if glob else pattern in c.id)]


def _fmt_loss(v: Optional[float]) -> str:
    return "-" if v is None else f"val_loss {v:.4f}"


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        sweep = load_sweep(args.sweep)
        if args.nproc is not None and args.nproc < 1:
            raise SpecError(f"--nproc must be >= 1, got {args.nproc}")
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    cells = select(sweep.cells, args.only)
    if not cells:
        print(f"error: no cell matches --only {args.only!r} (cells look like {sweep.cells[0].id})", file=sys.stderr)
        return 2
    nproc = args.nproc or (int(sweep.slurm.get("gpus_per_node", 8)) if args.submit else 1)
    states = {c.id: cell_state(c) for c in cells}
    todo = [c for c in cells if not states[c.id][0]]
    print(f"sweep {args.sweep}: {len(cells)} cells, {len(cells) - len(todo)} finished, {len(todo)} to run "
          f"-> {sweep.runs_dir}")
    summary: list[tuple[Cell, str, str]] = [(c, "skipped", _fmt_loss(states[c.id][1]) + " (finished)")
                                            for c in cells if states[c.id][0]]
    if args.submit:
        results = submit(todo, sweep, nproc, args.dry_run)
        summary += results
        if not args.dry_run and shutil.which("sbatch") is None and todo:
            _print_summary(summary, cells)
            print(f"error: sbatch not found on PATH; job scripts written under {sweep.runs_dir / 'slurm'} "
                  "(submit them with the commands above)", file=sys.stderr)
            return 1
    elif args.dry_run:
        print(f"# run from {ROOT}")
        for c in todo:
            print(shlex.join(train_argv(c, nproc)))
        summary += [(c, "dry-run", "would run") for c in todo]
    else:
        for i, c in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {c.id}: {shlex.join(train_argv(c, nproc))}", flush=True)
            t0 = time.perf_counter()
            rc = run_local(c, nproc)
            finished, val = cell_state(c)
            took = f"{time.perf_counter() - t0:.1f} s"
            if rc == 0 and finished:
                summary.append((c, "done", f"{_fmt_loss(val)} ({took})"))
            elif rc == 0:  # train.py saved and exited on SIGINT/SIGTERM: the user wants to stop
                summary.append((c, "stopped", f"checkpointed; re-run the sweep to continue ({took})"))
                print("a cell stopped on a signal: ending the sweep here", file=sys.stderr)
                summary += [(rest, "not run", "") for rest in todo[i:]]
                break
            else:
                summary.append((c, f"failed rc={rc}", f"{_fmt_loss(val)} ({took})"))
    _print_summary(summary, cells)
    return 1 if any(state.startswith(("failed", "stopped")) for _, state, _ in summary) else 0


def _print_summary(summary: list[tuple[Cell, str, str]], cells: list[Cell]) -> None:
    order = {c.id: i for i, c in enumerate(cells)}
    width = max(len(c.id) for c in cells)
    print("summary:")
    for cell, state, note in sorted(summary, key=lambda r: order[r[0].id]):
        print(f"  {cell.id:<{width}}  {state:<10}  {note}")


if __name__ == "__main__":
    sys.exit(main())
