"""The project's one Slurm recipe, as a renderer: the job script of a sweep cell and the checked-in
`launch/scripts/slurm.sbatch` (for a run submitted by hand) both come from `render`, so they cannot
drift apart (`python -m launch.sweep.slurm` rewrites the checked-in file; a test compares them).

A job activates the Python environment it was written from (a venv's `bin/activate`, else that
prefix's `bin` first on PATH), goes to the project root, and starts one `launch.launcher` (torchrun
with a clean SIGTERM path) per node: `--standalone` on one node; on several, srun runs
`launch/scripts/slurm_node.sh` on each node (workers: that node's GPUs, threads: its CPUs / workers),
with the job's CPUs passed on to srun and a c10d rendezvous on the first node at a port of the job's own.
Values containing `$` are shell expressions, written as they are (the generic recipe's).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from data.paths import PROJECT_ROOT as ROOT

RECIPE = ROOT / "launch" / "scripts" / "slurm.sbatch"
NODE_SCRIPT = "launch/scripts/slurm_node.sh"  # from the project root
# The rendezvous port: one per job (two jobs may share a first node), in 29500-31499, below Linux's
# ephemeral ports (32768 on), which the kernel hands out to outgoing connections.
RDZV_PORT = "${ORSCALE_RDZV_PORT:-$((29500 + SLURM_JOB_ID % 2000))}"


@dataclass
class Job:
    job_name: str
    nodes: str  # "1", "4", or a shell expression such as "$SLURM_JOB_NUM_NODES"
    gpus_per_node: int  # the #SBATCH request; on one node also the launcher's processes
    cpus_per_task: int
    command: list[str]  # train.py's arguments: --config CONFIG [overrides]
    venv: str = ""  # the environment to activate; "": $ORSCALE_VENV, else <root>/.venv (the generic recipe)
    root: str = str(ROOT)
    output: str | None = None  # the log file pattern
    sbatch: list[str] = field(default_factory=list)  # extra #SBATCH options ("--time=1:00:00", ...)
    comment: str = ""


def _word(s: str) -> str:
    return f'"{s}"' if "$" in s and not s.startswith('"') else s if "$" in s else shlex.quote(s)


def _activate(venv: str) -> list[str]:
    if not venv:
        return [
            "venv=${ORSCALE_VENV:-$root/.venv}",
            'if [ -f "$venv/bin/activate" ]; then . "$venv/bin/activate"; '
            'elif [ -x "$venv/bin/python" ]; then export PATH="$venv/bin:$PATH"; fi',
        ]
    if (Path(venv) / "bin" / "activate").is_file():
        return [f". {shlex.quote(venv)}/bin/activate   # the environment this job was written from"]
    return [f'export PATH={shlex.quote(venv)}/bin:"$PATH"   # the environment this job was written from']


def render(job: Job) -> str:
    """The job script."""
    head = [
        "#!/usr/bin/env bash",
        *(f"# {line}" if line else "#" for line in job.comment.splitlines()),
        f"#SBATCH --job-name={job.job_name}",
    ]
    head += [f"#SBATCH --output={job.output}"] if job.output else []
    head += [] if "$" in job.nodes else [f"#SBATCH --nodes={job.nodes}"]
    head += [
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={job.gpus_per_node}",
        f"#SBATCH --cpus-per-task={job.cpus_per_task}",
        "#SBATCH --signal=TERM@120          # train.py checkpoints on SIGTERM and exits 0",
        "#SBATCH --requeue                  # a requeued job resumes from its run dir (run.resume=auto)",
    ]
    head += [f"#SBATCH {x}" for x in job.sbatch]
    body = ["set -euo pipefail"]
    if not job.venv:
        body += [f"root={job.root}"]
    body += _activate(job.venv)
    body += ['cd "$root"' if not job.venv else f"cd {_word(job.root)}"]
    args = " ".join(_word(a) for a in job.command)
    if job.nodes == "1":
        threads = max(1, job.cpus_per_task // job.gpus_per_node)
        body += [
            f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{threads}}}   # the job's CPUs / its processes",
            f"python -m launch.launcher --standalone --nproc_per_node={job.gpus_per_node} train.py {args}",
        ]
    else:
        body += [
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"port={RDZV_PORT}   # one per job: two jobs may share a first node",
            "# srun does not take sbatch's --cpus-per-task (Slurm >= 22.05): without it each node's launcher",
            "# and workers would share one CPU.",
            'srun --kill-on-bad-exit=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:?the job has no --cpus-per-task}" '
            f"bash {NODE_SCRIPT} --nnodes={_word(job.nodes)} "
            '--rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$head_node:$port" '
            f"train.py {args}",
        ]
    return "\n".join([*head, *body, ""])


def generic_script() -> str:
    """The checked-in recipe: `sbatch [--nodes=N] launch/scripts/slurm.sbatch CONFIG [key=value ...]`."""
    job = Job(
        job_name="orscale",
        nodes="$SLURM_JOB_NUM_NODES",
        gpus_per_node=8,
        cpus_per_task=64,
        command=["--config", "$config", "$@"],
        venv="",
        root="${ORSCALE_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}",
        comment="The project's one Slurm recipe, rendered by launch/sweep/slurm.py (edit that, then run\n"
        "`python -m launch.sweep.slurm`); `python -m launch.sweep --submit` writes each cell's job\n"
        "from the same renderer. One launcher per node (launch/scripts/slurm_node.sh: a worker per GPU\n"
        "Slurm gave the node), rendezvous on the first node at port 29500 + job id % 2000.\n"
        "  sbatch --nodes=4 launch/scripts/slurm.sbatch configs/1.1b.yaml optim.name=orscale_lm\n"
        "  sbatch --nodes=2 --gpus-per-node=4 --cpus-per-task=32 launch/scripts/slurm.sbatch CONFIG\n"
        "Environment: $ORSCALE_VENV (a venv or conda prefix), else <root>/.venv, else PATH's python;\n"
        "$ORSCALE_RDZV_PORT (the rendezvous port), $ORSCALE_NPROC (workers per node), $OMP_NUM_THREADS.",
    )
    return render(job).replace(
        "set -euo pipefail\n",
        "set -euo pipefail\nconfig=${1:?usage: sbatch launch/scripts/slurm.sbatch CONFIG [key=value ...]}; shift\n",
        1,
    )


if __name__ == "__main__":
    RECIPE.write_text(generic_script())
    print(f"wrote {RECIPE}")
