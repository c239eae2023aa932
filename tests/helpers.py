"""Running train.py as a real process (one, or several under torchrun) from the tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs/tiny.yaml")
# A small, fast variant of the tiny config: 2 layers, d 64, 64-token windows, 512 tokens/step, and
# the ladder's 4k BPE instead of GPT-2's 50k vocabulary (whose head and loss would be most of each
# step's work; absolute, so that an old tree run from elsewhere finds it too).
BPE4K = str(ROOT / "assets/tokenizers/bpe4k_ladder")
SMALL = [
    f"data.tokenizer={BPE4K}",
    "model.vocab_size=4096",
    "model.n_layer=2",
    "model.d_model=64",
    "data.seq_len=64",
    "model.max_seq_len=64",
    "data.val_tokens=1024",
    "train.tokens_per_step=512",
    "train.micro_batch_size=4",
    "train.progress=false",
    "optim.warmup_steps=3",
    "train.log_every=1",
    "data.logical_shards=4",
    "optim.muon.ns_dtype=fp32",
]
# SMALL for an optimizer outside the Muon family (no note that optim.muon goes unread)
SMALL_ADAMW = [o for o in SMALL if not o.startswith("optim.muon.")]


# The CPU ladder's miniature (tests/report/test_ladder.py, test_protocols.py): the
# ladder's 4k BPE, 32-token windows, 8 steps of 128 tokens, one thread of work per run.
MINI_LADDER = {
    "data.tokenizer": "assets/tokenizers/bpe4k_ladder",
    "model.vocab_size": 4096,
    "data.seq_len": 32,
    "model.max_seq_len": 32,
    "data.val_tokens": 512,
    "data.val_batch_size": 16,
    "data.piece_bytes": 32768,
    "data.logical_shards": 2,
    "train.tokens_per_step": 128,
    "train.micro_batch_size": 4,
    "train.max_steps": 8,
    "train.log_every": 1,
    "train.eval_every": 2,
    "train.progress": False,
    "optim.warmup_steps": 2,
    "optim.muon.ns_dtype": "fp32",
    "parallel.backend": "none",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_cmd(script: Path, args: list[str], nproc: int = 1) -> list[str]:
    """`python SCRIPT ARGS`, or the same under torchrun with `nproc` CPU processes."""
    if nproc == 1:
        return [sys.executable, str(script), *args]
    # --standalone: the rendezvous store binds a port the kernel hands it; a port picked here and
    # bound by torchrun seconds later can be taken meanwhile (a gloo connection's ephemeral port).
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(script),
        *args,
    ]


def train_cmd(overrides: list[str], nproc: int = 1) -> list[str]:
    return launch_cmd(ROOT / "train.py", ["--config", TINY, *SMALL, *overrides], nproc)


def env() -> dict[str, str]:
    out = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        DS_ACCELERATOR="cpu",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(ROOT),
    )
    return out


def run_train(
    overrides: list[str], nproc: int = 1, timeout: int = 600, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`environ`: the processes' environment instead of `env()` (e.g. `tests/data/hub_repo.hub_env`)."""
    proc = subprocess.run(
        train_cmd(overrides, nproc), cwd=ROOT, env=environ or env(), capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def run_many(
    runs: list[list[str]], nproc: int = 1, timeout: int = 900, environ: dict[str, str] | None = None
) -> list[dict]:
    """Several runs (each a list of overrides, as for `run_train`) one after another in the session's
    pool of `nproc` ranks (tests/pool.py: the trainer's `train(cfg)`, no launch). With `environ` (an
    environment the processes must start with, e.g. the stand-in Hub's `HF_ENDPOINT`, read at
    import), in one real launch instead (`tests/launch/runs_worker.py`). Returns each run's result
    (rank 0's), or nothing from a real launch."""
    argvs = [["--config", TINY, *SMALL, *overrides] for overrides in runs]
    if environ is None:
        from tests.pool import rank_pool
        from tests.pool_jobs import train_runs

        return rank_pool(nproc).run(train_runs, argvs, group=nproc > 1, timeout=timeout)[0]
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "runs.json"
        spec.write_text(json.dumps(argvs))
        cmd = launch_cmd(ROOT / "tests/launch/runs_worker.py", [str(spec)], nproc)
        proc = subprocess.run(cmd, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"runs_worker.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return []


def train_in_pool(overrides: list[str], nproc: int = 1, timeout: int = 900) -> dict:
    """One run as `run_train` makes it, in the session's pool of `nproc` ranks (no launch): for runs
    whose launch is not what a test checks. Returns rank 0's `train(cfg)` result."""
    return run_many([overrides], nproc, timeout)[0]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


# What the clock and the memory measure: the keys of a metrics line that a resumed run (or a branch)
# may write otherwise than the uninterrupted run.
MEASURED = frozenset({"tokens_per_s", "mfu", "mfu_causal", "peak_mem_gib", "peak_rss_gib", "data_wait_frac"})


def measured_apart(run_dir: Path) -> list[dict]:
    """metrics.jsonl's lines without the MEASURED keys: what a resume must write again exactly."""
    return [{k: v for k, v in m.items() if k not in MEASURED} for m in metrics(run_dir)]


def train_losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["train_loss"] for m in metrics(run_dir) if "train_loss" in m}


# Layouts the multi-backend tests and benches name beside the backends themselves: HSDP is FSDP2 on
# a 2-D mesh, 2 replica groups x 2 shards on 4 ranks.
LAYOUT_ARGS = {"hsdp": ["parallel.backend=fsdp", "parallel.dp_replicate=2"]}


def backend_args(name: str) -> list[str]:
    """The overrides that run `name`: a parallel.backend, or a layout of LAYOUT_ARGS."""
    return LAYOUT_ARGS.get(name, [f"parallel.backend={name}"])
