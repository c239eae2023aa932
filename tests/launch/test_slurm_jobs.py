"""The Slurm job scripts (launch/scripts/slurm.sbatch, launch/scripts/slurm_node.sh, and a multi-node
sweep cell's job from `python -m launch.sweep --submit`) run under stand-ins for Slurm's commands:
`scontrol`, an `srun` that runs the per-node command once for each of two nodes with the SLURM_*
variables a step's task gets, and a `python` that records the launcher's (torchrun's) arguments and
thread count on each node. Only the scripts' plumbing runs: no Python process is started."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from launch.sweep import sweep_cli as sweep
from launch.sweep.slurm import generic_script
from tests.helpers import ROOT
from tests.launch.test_multinode import _rendezvous

# srun's stand-in: its arguments recorded, then the command once per node, with what Slurm gives a
# step's task: its node, its CPUs (the step's --cpus-per-task: 1 without it, since Slurm 22.05 no
# longer hands sbatch's on to srun) and, where the job has GPUs ($STANDIN_GPUS), SLURM_GPUS_ON_NODE.
SRUN = """#!/bin/bash
printf '%s\\n' "$@" > "$STANDIN_LOG/srun.$SLURM_JOB_ID"
cpus=1
while [ $# -gt 0 ]; do
  case $1 in --cpus-per-task=*) cpus=${1#*=} ;; -*) ;; *) break ;; esac
  shift
done
id=0
for node in node-a node-b; do
  env SLURM_NODEID=$id SLURM_PROCID=$id SLURMD_NODENAME=$node SLURM_CPUS_PER_TASK=$cpus \\
    ${STANDIN_GPUS:+SLURM_GPUS_ON_NODE=$STANDIN_GPUS} "$@" || exit
  id=$((id + 1))
done
"""
SCONTROL = '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "node-a\\nnode-b\\n"\n'
# The launcher's stand-in on each node: `python -m launch.launcher ARGS` records ARGS and its threads.
PYTHON = """#!/bin/sh
printf '%s\\n' "$@" > "$STANDIN_LOG/launch.$SLURM_JOB_ID.$SLURMD_NODENAME"
echo "$OMP_NUM_THREADS" > "$STANDIN_LOG/threads.$SLURM_JOB_ID.$SLURMD_NODENAME"
"""
BASH = shutil.which("bash") or "/bin/bash"
TOOLS = ("bash", "env", "head", "grep", "nproc", "hostname")  # what the scripts use besides builtins


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _bin(tmp_path: Path, **stubs: str) -> Path:
    """A PATH of its own: the stand-ins and the few real tools the scripts use (no real python,
    srun or nvidia-smi can be found through it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in TOOLS:
        real = shutil.which(tool)
        assert real is not None, tool
        (bin_dir / tool).symlink_to(real)
    for name, text in {"srun": SRUN, "scontrol": SCONTROL, "python": PYTHON, **stubs}.items():
        _write(bin_dir / name, text)
    return bin_dir


def _run_job(script: Path, tmp_path: Path, job_id: int, **extra: str) -> subprocess.CompletedProcess:
    """`script` as Slurm's batch step of job `job_id` on two nodes would run it, with `_bin`'s PATH."""
    job_env = {
        "PATH": str(tmp_path / "bin"),
        "STANDIN_LOG": str(tmp_path),
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_NUM_NODES": "2",
        "ORSCALE_ROOT": str(ROOT),
        "ORSCALE_VENV": str(tmp_path / "no-venv"),
        **extra,
    }
    return subprocess.run(
        [BASH, str(script), "configs/tiny.yaml", "optim.name=orscale_lm"],
        env=job_env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _srun_options(tmp_path: Path, job_id: int) -> list[str]:
    """srun's own options in job `job_id` (its arguments before the command)."""
    args = (tmp_path / f"srun.{job_id}").read_text().splitlines()
    return args[: next(i for i, a in enumerate(args) if not a.startswith("-"))]


def _launches(tmp_path: Path, job_id: int) -> dict[str, list[str]]:
    """Each node's launcher arguments for job `job_id`, and its OMP_NUM_THREADS (as "threads=N")."""
    out = {}
    for node in ("node-a", "node-b"):
        argv = (tmp_path / f"launch.{job_id}.{node}").read_text().splitlines()
        out[node] = [*argv, "threads=" + (tmp_path / f"threads.{job_id}.{node}").read_text().strip()]
    return out


def test_the_slurm_script_starts_a_launcher_per_node_with_its_gpus_its_cpus_and_a_port_of_the_job(tmp_path):
    """`sbatch --nodes=2 --gpus-per-node=4 launch/scripts/slurm.sbatch ...` (Slurm sets no GPUS_PER_NODE):
    srun gets the job's --cpus-per-task; each node's launcher starts 4 workers (the node's GPUs, not
    the #SBATCH line's 8) with 64 / 4 threads each, the c10d rendezvous at the first node; two jobs
    get two ports, and ORSCALE_RDZV_PORT sets it."""
    _bin(tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text(generic_script())
    assert generic_script() == (ROOT / "launch/scripts/slurm.sbatch").read_text()
    job = {"SLURM_CPUS_PER_TASK": "64", "SLURM_GPUS_PER_NODE": "4", "STANDIN_GPUS": "4"}
    ports = []
    for job_id in (4242, 4243):
        done = _run_job(script, tmp_path, job_id, **job)
        assert done.returncode == 0, done.stderr
        assert _srun_options(tmp_path, job_id) == ["--kill-on-bad-exit=1", "--cpus-per-task=64"]
        launches = _launches(tmp_path, job_id)
        assert launches["node-a"] == launches["node-b"]  # the same launcher on each node
        argv = launches["node-a"]
        assert argv[:2] == ["-m", "launch.launcher"]
        assert argv[argv.index("train.py") :] == [
            "train.py",
            "--config",
            "configs/tiny.yaml",
            "optim.name=orscale_lm",
            "threads=16",
        ]
        launcher = set(argv[2 : argv.index("train.py")])
        endpoint = next(a for a in launcher if a.startswith("--rdzv_endpoint="))
        assert launcher - {endpoint} == {
            "--nproc_per_node=4",
            "--nnodes=2",
            "--rdzv_id=" + str(job_id),
            "--rdzv_backend=c10d",
        }
        assert endpoint.startswith("--rdzv_endpoint=node-a:")
        # torchrun's multi-node arguments of the real two-node test, but for where the nodes are
        assert {a.split("=")[0] for a in launcher} == {a.split("=")[0] for a in _rendezvous(1, 2)} - {"--local_addr"}
        ports.append(int(endpoint.rsplit(":", 1)[1]))
    assert ports[0] != ports[1] and all(29500 <= p < 32768 for p in ports), ports
    assert _run_job(script, tmp_path, 4244, **job, ORSCALE_RDZV_PORT="31234").returncode == 0
    assert "--rdzv_endpoint=node-a:31234" in _launches(tmp_path, 4244)["node-b"]
    assert "#SBATCH --ntasks-per-node=1" in script.read_text()  # srun: one launcher per node


def _node(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """launch/scripts/slurm_node.sh on one node with `env`: its result and the launcher's arguments
    (None when it started none)."""
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    node_env = {
        "PATH": str(tmp_path / "bin"),
        "STANDIN_LOG": str(log),
        "SLURM_JOB_ID": "7",
        "SLURMD_NODENAME": "node-a",
        "SLURM_CPUS_PER_TASK": "32",
        **env,
    }
    done = subprocess.run(
        [BASH, str(ROOT / "launch/scripts/slurm_node.sh"), "--nnodes=2", "train.py"],
        env=node_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    started = log / "launch.7.node-a"
    argv = started.read_text().splitlines() if started.exists() else None
    if started.exists():
        started.unlink()
    return done, argv


@pytest.mark.parametrize(
    ("env", "workers"),
    [
        ({"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "gpu:8"}, 4),  # the node's, before the request
        ({"SLURM_GPUS_PER_NODE": "a100:4"}, 4),
        ({"SLURM_GPUS_PER_NODE": "gpu:a100:2,v100:2"}, 4),
        ({"SLURM_GPUS_PER_NODE": "6"}, 6),
        ({"STANDIN_SMI": "2"}, 2),  # no Slurm GPU variable: what nvidia-smi lists
        ({"ORSCALE_NPROC": "3", "SLURM_GPUS_ON_NODE": "8"}, 3),
    ],
)
def test_a_nodes_workers_are_its_gpus_as_slurm_or_the_node_says(tmp_path, env, workers):
    smi = '#!/bin/sh\ni=0\nwhile [ $i -lt "$STANDIN_SMI" ]; do echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; '
    smi += 'echo "  MIG 1g.10gb Device 0: (UUID: MIG-$i)"; i=$((i + 1)); done\n'
    _bin(tmp_path, **({"nvidia-smi": smi} if "STANDIN_SMI" in env else {}))
    done, argv = _node(tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert argv == ["-m", "launch.launcher", f"--nproc_per_node={workers}", "--nnodes=2", "train.py"]
    assert (tmp_path / "log/threads.7.node-a").read_text().strip() == str(32 // workers)


@pytest.mark.parametrize(
    ("env", "seen"),
    [({}, "none"), ({"SLURM_GPUS_ON_NODE": "0"}, "0"), ({"SLURM_GPUS_PER_NODE": "gpu:four"}, "gpu:four")],
)
def test_a_node_whose_gpus_are_not_known_starts_nothing_and_says_how_to_ask_for_them(tmp_path, env, seen):
    _bin(tmp_path)
    done, argv = _node(tmp_path, **env)
    assert done.returncode == 2 and argv is None
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: node-a: no GPU count"), done.stderr
    assert seen in lines[0] and "--gpus-per-node=N" in lines[0] and "ORSCALE_NPROC" in lines[0]


def test_a_multi_node_sweep_cells_job_runs_the_same_per_node_launch(tmp_path, monkeypatch):
    """`python -m launch.sweep --submit` with slurm.nodes=2 writes a job that passes the job's CPUs to
    srun, starts the launcher on each node with the node's GPUs, in the sweep's environment (its
    `bin` first on PATH), at a port of the job's own."""
    spec = {
        "base": "configs/tiny.yaml",
        "runs_dir": str(tmp_path / "runs"),
        "scales": ["tiny"],
        "optimizers": ["adamw"],
        "lrs": [1e-3],
        "seeds": [0],
        "slurm": {"nodes": 2, "gpus_per_node": 4},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    bin_dir = _bin(tmp_path, sbatch="#!/bin/sh\necho 'Submitted batch job 99'\n")
    venv = tmp_path / "venv"  # the sweep's environment: its python is the stand-in
    (venv / "bin").mkdir(parents=True)
    _write(venv / "bin/python", PYTHON)
    (bin_dir / "python").unlink()
    monkeypatch.setattr("sys.prefix", str(venv))
    monkeypatch.setenv("PATH", str(bin_dir))
    assert sweep.main([str(tmp_path / "s.yaml"), "--submit"]) == 0
    [script] = (tmp_path / "runs/slurm").glob("*.sbatch")
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=4" in text and "#SBATCH --cpus-per-task=32" in text
    done = _run_job(script, tmp_path, 5151, SLURM_CPUS_PER_TASK="32", STANDIN_GPUS="4")
    assert done.returncode == 0, done.stderr
    assert _srun_options(tmp_path, 5151) == ["--kill-on-bad-exit=1", "--cpus-per-task=32"]
    for argv in _launches(tmp_path, 5151).values():
        assert "--nproc_per_node=4" in argv and "--nnodes=2" in argv and argv[-1] == "threads=8"
        assert f"--rdzv_endpoint=node-a:{29500 + 5151 % 2000}" in argv
        assert argv[argv.index("train.py") : argv.index("train.py") + 3] == [
            "train.py",
            "--config",
            "configs/tiny.yaml",
        ]
