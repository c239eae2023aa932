"""Soak: kill -9 a run at random moments (saves included) and re-run the same command, again and
again; the run must end bit-equal to an uninterrupted one.

    python -m bench.bench_kill_soak [--kills 20] [--steps 40] [--nproc 1] [--backend fsdp] [--seed 0]

A small model with a checkpoint every 2 steps; each kill hits a random moment between 0.5 s and
the time a whole run takes, so some land in start-up, some mid-step, some mid-save. Prints how many
kills were survived and whether the final losses and weights equal the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.helpers import env, train_cmd, train_losses

ROOT = Path(__file__).resolve().parent.parent

OVERRIDES = ["optim.name=orscale_lm", "train.ckpt_every=2", "train.eval_every=10"]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=1200)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--backend", default=None, help="parallel.backend (default: none on 1 process, else fsdp)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    backend = [f"parallel.backend={args.backend or ('fsdp' if args.nproc > 1 else 'none')}"]
    common = [*OVERRIDES, *backend, f"train.max_steps={args.steps}"]

    # An untimed launch first: a fresh machine's first launch pays one-time costs (DeepSpeed builds its
    # CPU op, ~40 s) that would stretch the kill window far past a relaunch, so most kills would miss.
    run(train_cmd([f"run.dir={tmp / 'warmup'}", *OVERRIDES, *backend, "train.max_steps=1"], args.nproc))
    t0 = time.perf_counter()
    ref = run(train_cmd([f"run.dir={tmp / 'straight'}", *common], args.nproc))
    assert ref.returncode == 0, ref.stderr[-2000:]
    whole = time.perf_counter() - t0
    print(f"uninterrupted run: {args.steps} steps in {whole:.1f} s")

    run_dir, survived, finished_early, failed = tmp / "killed", 0, 0, False
    cmd = train_cmd([f"run.dir={run_dir}", *common], args.nproc)
    while survived < args.kills and finished_early < 5 * args.kills:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        delay = rng.uniform(0.5, whole)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun's group; its workers die with it (parent-death signal)
            proc.wait()
            survived += 1
            continue
        if proc.returncode != 0:  # a relaunch after a kill failed: that is what this soak looks for
            print(f"after {survived} kills the relaunch failed:\n{proc.stderr.read()[-2000:]}")
            failed = True
            break
        finished_early += 1  # the run reached its end before this kill: start it over and go on
        shutil.rmtree(run_dir)
    final = run(cmd)
    ok = final.returncode == 0
    equal = ok and train_losses(run_dir) == train_losses(tmp / "straight")
    print(
        f"kills survived: {survived} of {args.kills} (plus {finished_early} attempts that reached their end "
        f"before the kill and were started over); relaunch failures: {int(failed)}; final run "
        f"rc={final.returncode}; losses bit-equal to the uninterrupted run: {equal}"
    )
    if not ok:
        print(final.stderr[-3000:])
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
