"""The diagnostics' device check (docs/gpu.md, "Finding what is slow"): profiler traces, memory
snapshots, the out-of-memory line and background checkpoints on one GPU, with the CUDA calls real
(the CPU tests replace them).

    PYTHONPATH=. python3 -m bench.gpu_check_diagnostics --out DIR [--scratch DIR] [--device cuda|cpu]

Phases, each a process of its own, each printing one `phase <name>: ok|FAILED ...` line and adding a
record to DIR/diagnostics.json:
  window   6 steps of the small test model on the GPU, checkpoints every 2 written in the background
           (pinned staging), a profiler window (steps 3-4) and a memory-snapshot window (steps 2-3):
           the trace holds the step's spans and CUDA kernels, the snapshot loads with its history,
           every checkpoint is complete and intact;
  resume   the same run with synchronous saves, and one resumed from the window run's step 2 (written
           in the background): their losses against the window run's (how far apart, not asserted:
           the GPU's kernels need not be deterministic);
  oom      the 125m preset with a micro-batch that does not fit in 2% of the GPU's memory: exit 2,
           one `error:` line, the snapshot of the failed step on disk, with its allocation history;
  bench    python -m bench.bench_async_save --preset 125m --nproc 1 (training blocked per save, sync
           against async, on the GPU).
With --device cpu only `window` and `resume` run (no memory snapshot): a dry run of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _train(args: list[str], scratch: Path, name: str, timeout: int = 240) -> subprocess.CompletedProcess:
    from tests.helpers import SMALL, TINY

    cmd = [sys.executable, str(ROOT / "train.py"), "--config", TINY, *SMALL, *args]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout)
    (scratch / f"{name}.log").write_text(proc.stdout + proc.stderr)
    return proc


def _losses(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return {m["step"]: m["train_loss"] for m in lines if "train_loss" in m}


def _snapshot(path: Path) -> dict[str, int]:
    with open(path, "rb") as fh:
        snap = pickle.load(fh)  # our own file, just written
    events = sum(len(t) for t in snap.get("device_traces", []))
    return {"segments": len(snap.get("segments", [])), "history_events": events}


def phase_window(scratch: Path, device: str) -> dict[str, Any]:
    from launch.checkpoint import checkpoint_dirs
    from launch.checkpoint.manifest import verify_manifest

    run = scratch / "window"
    memory = [f"train.memory_snapshot.{k}" for k in ("enabled=true", "skip_first=1", "steps=2")]
    memory = memory if device == "cuda" else []  # snapshots of steps 2-3
    proc = _train(
        [
            f"run.dir={run}",
            f"train.device={device}",
            "optim.name=orscale_lm",
            "train.max_steps=6",
            "train.ckpt_every=2",
            "train.eval_every=0",
            "run.async_save=true",
            "train.profile.enabled=true",
            "train.profile.skip_first=1",
            "train.profile.active=2",
            *memory,
        ],
        scratch,
        "window",
    )
    out: dict[str, Any] = {"exit": proc.returncode}
    trace = json.loads((run / "profile" / "step_4" / "rank0.json").read_text())["traceEvents"]
    names = {e.get("name") for e in trace}
    out["spans"] = [n for n in ("forward", "backward", "optimizer_step", "newton_schulz") if n in names]
    out["cuda_kernels"] = sum(1 for e in trace if e.get("cat") == "kernel")
    if device == "cuda":
        out["snapshot"] = _snapshot(run / "memory_snapshot" / "step_3" / "rank0.pickle")
    steps = checkpoint_dirs(run / "checkpoints")
    out["checkpoints"] = [p.name for p in steps]
    out["intact"] = all(verify_manifest(p) is None for p in steps)
    out["background_lines"] = (scratch / "window.log").read_text().count("written in the background")
    ok = (
        proc.returncode == 0
        and len(out["spans"]) == 4
        and (out["cuda_kernels"] > 0 or device != "cuda")
        and (device != "cuda" or out["snapshot"]["history_events"] > 0)
        and out["checkpoints"] == ["step_00000002", "step_00000004", "step_00000006"]
        and out["intact"]
        and out["background_lines"] == 2
    )
    return {"ok": ok, **out}


def phase_resume(scratch: Path, device: str) -> dict[str, Any]:
    common = [f"train.device={device}", "optim.name=orscale_lm", "train.max_steps=6", "train.ckpt_every=2"]
    common.append("train.eval_every=0")
    sync = _train([f"run.dir={scratch / 'sync'}", *common], scratch, "sync")
    step_2 = scratch / "window" / "checkpoints" / "step_00000002"
    resumed = _train([f"run.dir={scratch / 'resumed'}", *common, f"run.resume={step_2}"], scratch, "resumed")
    window = _losses(scratch / "window")

    def apart(other: dict[int, float]) -> float:
        return max(abs(other[s] - window[s]) / abs(window[s]) for s in other)

    out = {"sync_exit": sync.returncode, "resumed_exit": resumed.returncode}
    if sync.returncode == 0 and resumed.returncode == 0:
        out["sync_vs_async_max_rel"] = apart(_losses(scratch / "sync"))
        out["resumed_vs_async_max_rel"] = apart(_losses(scratch / "resumed"))
        out["resumed_steps"] = sorted(_losses(scratch / "resumed"))
    return {"ok": out.get("resumed_steps") == [3, 4, 5, 6], **out}


def phase_oom(scratch: Path) -> dict[str, Any]:
    run = scratch / "oom"
    program = (
        "import sys, torch; torch.cuda.set_per_process_memory_fraction(0.02); "
        "from launch.loop import main; sys.exit(main(sys.argv[1:]))"
    )
    args = [
        "--config",
        str(ROOT / "configs/tiny.yaml"),
        f"run.dir={run}",
        "model.preset=125m",
        "model.max_seq_len=256",
        "data.seq_len=256",
        "train.tokens_per_step=16384",
        "train.micro_batch_size=64",
        "data.logical_shards=4",
        "train.max_steps=2",
        "train.memory_snapshot.enabled=true",
        "train.memory_snapshot.steps=0",
        "train.progress=false",
    ]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-c", program, *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=240
    )
    (scratch / "oom.log").write_text(proc.stdout + proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    snaps = sorted(run.glob("memory_snapshot/oom_step_*/rank0.pickle"))
    out: dict[str, Any] = {"exit": proc.returncode, "error_lines": errors, "snapshots": [str(p) for p in snaps]}
    if snaps:
        out["snapshot"] = _snapshot(snaps[0])
    ok = proc.returncode == 2 and len(errors) == 1 and "ran out of GPU memory" in errors[0] and bool(snaps)
    return {"ok": ok and out["snapshot"]["history_events"] > 0, **out}


def phase_bench(scratch: Path) -> dict[str, Any]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "bench.bench_async_save", "--preset", "125m", "--nproc", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300)
    (scratch / "bench.log").write_text(proc.stdout + proc.stderr)
    return {"ok": proc.returncode == 0, "exit": proc.returncode, "table": proc.stdout.strip().splitlines()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, default=None)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--phases", default="window,resume,oom,bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="orscale-diagnostics-"))
    scratch.mkdir(parents=True, exist_ok=True)
    phases = {
        "window": lambda: phase_window(scratch, args.device),
        "resume": lambda: phase_resume(scratch, args.device),
        "oom": lambda: phase_oom(scratch),
        "bench": lambda: phase_bench(scratch),
    }
    wanted = [p for p in args.phases.split(",") if args.device == "cuda" or p in ("window", "resume")]
    results: dict[str, Any] = {"scratch": str(scratch)}
    for name in wanted:
        started = time.perf_counter()
        try:
            record = phases[name]()
        except Exception as err:  # a phase that breaks is its record; the next one still runs
            record = {"ok": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
        record["seconds"] = round(time.perf_counter() - started, 1)
        results[name] = record
        print(f"phase {name}: {'ok' if record['ok'] else 'FAILED'} {json.dumps(record)}", flush=True)
        (args.out / "diagnostics.json").write_text(json.dumps(results, indent=1))
    return 0 if all(results[n]["ok"] for n in wanted) else 1


if __name__ == "__main__":
    sys.exit(main())
