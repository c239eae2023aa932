"""Running one cell of a sweep: its command, locally (in this process when it can) or as a Slurm
job script around the project's one recipe, `launch/scripts/slurm.sbatch`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from launch.backends.registry import BACKENDS
from launch.sweep.slurm import Job, render
from launch.sweep.spec import ROOT, Cell, SpecError, Sweep
from records.read import read_run


def train_argv(cell: Cell, nproc: int) -> list[str]:
    """The exact command of a cell, run from the project root."""
    args = ["train.py", "--config", cell.base, *cell.overrides]
    if not in_process(cell, nproc):
        return [sys.executable, "-m", "launch.launcher", "--standalone", f"--nproc_per_node={nproc}", *args]
    return [sys.executable, *args]


def in_process(cell: Cell, nproc: int) -> bool:
    # One process without a process group (the backend's own answer; unset: none): calling
    # train.main saves ~2 s of interpreter and torch start-up per cell, which dominates a CPU mini-sweep.
    name = cell.value("parallel.backend")
    return nproc == 1 and (name is None or (name in BACKENDS and not BACKENDS[name].process_group))


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
    env = _child_env()  # torchrun would give each rank one thread: each its share of the cores
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(1, nproc)))
    return subprocess.run(argv, cwd=ROOT, env=env).returncode


def threads_per_rank(cells_at_once: int, nproc: int) -> int:
    """OMP threads for each rank of a cell when `cells_at_once` cells of `nproc` ranks share this
    machine's cores: every rank gets an equal share (at least one)."""
    return max(1, (os.cpu_count() or 1) // (cells_at_once * nproc))


def start_cell(cell: Cell, nproc: int, threads: int, gpus: list[str] | None = None) -> subprocess.Popen:
    """Start a cell as a process of its own (the sweep's --jobs), its output to <run dir>/sweep.out.
    `threads`: each rank's OMP_NUM_THREADS (`threads_per_rank`; a value already set is kept).
    `gpus`: the GPUs it may use (CUDA_VISIBLE_DEVICES; `GpuSlots`), None to leave that as it is."""
    env = _child_env()
    env.setdefault("OMP_NUM_THREADS", str(threads))
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    cell.run_dir.mkdir(parents=True, exist_ok=True)
    log = open(cell.run_dir / "sweep.out", "ab")  # the child keeps its own copy of the descriptor
    try:
        return subprocess.Popen(train_argv(cell, nproc), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices, or UUIDs), so that
    a subset of them is a valid CUDA_VISIBLE_DEVICES for a child: that variable's entries when it is
    set, else 0..N-1; as many as torch counts (none without CUDA)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [d.strip() for d in listed.split(",")] if listed is not None else [str(i) for i in range(count)]
    return names[:count]


def uses_gpus(cell: Cell) -> bool:
    """Whether a cell trains on GPUs when some are visible (train.device auto or cuda)."""
    return cell.value("train.device", "auto") != "cpu"


class GpuSlots:
    """The node's visible GPUs shared by the cells a sweep runs at once (--jobs): each GPU cell holds
    `nproc` of them, disjoint from every other running cell's, given to it as CUDA_VISIBLE_DEVICES
    (torchrun's ranks then use cuda:0..nproc-1 of that set), and returned when it ends."""

    def __init__(self, gpus: list[str], nproc: int) -> None:
        self.gpus, self.nproc = list(gpus), nproc
        self._free = list(gpus)
        self._held: dict[str, list[str]] = {}

    @property
    def cells_at_once(self) -> int:
        return len(self.gpus) // self.nproc

    def take(self, cell_id: str) -> list[str] | None:
        """`nproc` free GPUs for the cell, or None when fewer are free (wait for a cell to end)."""
        if len(self._free) < self.nproc:
            return None
        self._held[cell_id], self._free = self._free[: self.nproc], self._free[self.nproc :]
        return self._held[cell_id]

    def give_back(self, cell_id: str) -> None:
        held = self._held.pop(cell_id, [])
        self._free = [g for g in self.gpus if g in self._free or g in held]  # in the node's order


def gpu_slots(cells: list[Cell], jobs: int, nproc: int) -> tuple[GpuSlots | None, str | None]:
    """The GPU slots of a sweep running `jobs` cells at once, and a note to print when fewer run at
    once than asked: None (no note, nothing set) when no GPU is visible, no cell trains on a GPU, or
    one cell runs at a time. A SpecError when a cell needs more GPUs than the node has (one cell at a
    time too: its ranks past the node's GPUs would fail at start-up)."""
    if not any(uses_gpus(c) for c in cells) or not (gpus := visible_gpus()):
        return None, None
    if nproc > len(gpus):
        raise SpecError(
            f"--nproc {nproc} needs {nproc} GPUs per cell but {len(gpus)} are visible "
            f"({'CUDA_VISIBLE_DEVICES=' + ','.join(gpus) if 'CUDA_VISIBLE_DEVICES' in os.environ else 'this node'}); "
            f"lower --nproc to at most {len(gpus)}"
        )
    if jobs == 1:
        return None, None
    slots = GpuSlots(gpus, nproc)
    note = None
    if jobs * nproc > len(gpus):
        note = (
            f"--jobs {jobs} x --nproc {nproc} needs {jobs * nproc} GPUs but {len(gpus)} are visible: "
            f"at most {slots.cells_at_once} GPU cells run at once"
        )
    return slots, note


def slurm_script(cell: Cell, sweep: Sweep, nproc: int, log_dir: Path) -> str:
    """The job script of one cell: its #SBATCH options, the environment this sweep runs in, and the
    project's one recipe (`launch/sweep/slurm.py`)."""
    s = sweep.slurm
    job = Job(
        job_name=cell.id.replace("/", "."),
        nodes=str(int(s.get("nodes", 1))),
        gpus_per_node=nproc,
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
