"""Running one cell of a sweep: its command, locally (in this process when it can) or as a Slurm
job script around the project's one recipe, `launch/scripts/slurm.sbatch`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from launch.sweep.slurm import Job, render
from launch.sweep.spec import ROOT, Cell, Sweep
from records.read import read_run


def train_argv(cell: Cell, nproc: int) -> list[str]:
    """The exact command of a cell, run from the project root."""
    args = ["train.py", "--config", cell.base, *cell.overrides]
    if not in_process(cell, nproc):
        return [sys.executable, "-m", "launch.launcher", "--standalone", f"--nproc_per_node={nproc}", *args]
    return [sys.executable, *args]


def in_process(cell: Cell, nproc: int) -> bool:
    # One process without a process group: calling train.main saves ~2 s of interpreter and
    # torch start-up per cell, which dominates a CPU mini-sweep.
    return nproc == 1 and cell.value("parallel.backend", "none") == "none"


def _child_env() -> dict[str, str]:
    """This environment with the project root first on PYTHONPATH (a cell runs from the root)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def cell_state(cell: Cell) -> tuple[bool, float | None]:
    """(finished, final val loss) of a cell's run directory."""
    steps = cell.value("train.max_steps")
    run = read_run(cell.run_dir, expected_steps=steps if isinstance(steps, int) else None)
    return run.finished, run.final_val


def run_local(cell: Cell, nproc: int) -> int:
    """Run (or resume: train.py's run.resume=auto continues it, drops a torn metrics line, and starts
    a cell killed before its first checkpoint over) one cell; its exit status."""
    argv = train_argv(cell, nproc)
    if in_process(cell, nproc):
        from launch.loop import main as train_main  # imported once, reused for every cell

        # run.log records sys.argv as the run's command: the cell's own (`python train.py ...` as
        # `sys.argv` has it), which re-runs it from the project root; the sweep's argv would not.
        sweep_argv, sys.argv = sys.argv, argv[1:]
        try:
            return int(train_main(["--config", str(ROOT / cell.base), *cell.overrides]))
        except SystemExit as err:  # argparse inside train.main
            return err.code if isinstance(err.code, int) else 1
        except Exception as err:  # a crashing cell must not stop the sweep
            print(f"  {cell.id}: {type(err).__name__}: {err}", file=sys.stderr)
            return 1
        finally:
            sys.argv = sweep_argv
    return subprocess.run(argv, cwd=ROOT, env=_child_env()).returncode


def start_cell(cell: Cell, nproc: int, threads: int) -> subprocess.Popen:
    """Start a cell as a process of its own (the sweep's --jobs), its output to <run dir>/sweep.out."""
    env = _child_env()
    env.setdefault("OMP_NUM_THREADS", str(threads))
    cell.run_dir.mkdir(parents=True, exist_ok=True)
    log = open(cell.run_dir / "sweep.out", "ab")  # the child keeps its own copy of the descriptor
    try:
        return subprocess.Popen(train_argv(cell, nproc), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def slurm_script(cell: Cell, sweep: Sweep, nproc: int, log_dir: Path) -> str:
    """The job script of one cell: its #SBATCH options, the environment this sweep runs in, and the
    project's one recipe (`launch/sweep/slurm.py`)."""
    s = sweep.slurm
    job = Job(
        job_name=cell.id.replace("/", "."),
        nodes=str(int(s.get("nodes", 1))),
        gpus_per_node=nproc,
        nproc=str(nproc),
        cpus_per_task=int(s.get("cpus_per_task", 8 * nproc)),
        command=["--config", cell.base, *cell.overrides],
        venv=sys.prefix,
        output=f"{log_dir}/%x-%j.out",
        sbatch=[f"--{k}={s[k]}" for k in ("time", "partition", "account") if s.get(k)] + list(s.get("extra", [])),
        comment=f"sweep {sweep.path} cell {cell.id} (written by python -m launch.sweep --submit)",
    )
    return render(job)


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
