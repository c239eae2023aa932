"""Benchmark (prints, does not assert): peak memory and time of one training step's loss, the old
materialised-logits cross-entropy against the fused chunked one (`models/fused_loss.py`).

    python -m bench.bench_loss_memory [--batch 4] [--seq 1024] [--rounds 1] [--threads 2]

Each variant runs ONE forward+backward of the 125m preset (fp32, CPU) in a fresh subprocess, so
its peak RSS (`ru_maxrss`) is its own. "old" reproduces the code GPT.forward had before: logits
[B, T, V] from the tied head, `.float()`, `F.cross_entropy`; "new" is `GPT.forward(idx, targets)`.
Also printed: the RSS just before the step (model, its init temporaries freed), so peak − before is
what the step itself added (activations, logits or chunks, gradients). With --rounds > 1 the
variants alternate (old, new, old, ...) so both see the same load on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("old", "new")


ROOT = Path(__file__).resolve().parents[1]


def rss_now_mib() -> float:
    """Current resident set size (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def child(variant: str, batch: int, seq: int, threads: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    from models import GPT, get_preset

    torch.set_num_threads(threads)
    model = GPT(get_preset("125m"), seed=0)
    gen = torch.Generator().manual_seed(0)
    V = model.cfg.vocab_size
    idx = torch.randint(0, V, (batch, seq), generator=gen)
    targets = torch.randint(0, V, (batch, seq), generator=gen)
    before = rss_now_mib()
    start = time.perf_counter()
    if variant == "old":
        logits = model(idx)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
    else:
        loss = model(idx, targets)
    loss.backward()
    step_s = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"loss": loss.item(), "step_s": step_s, "rss_before_mib": before, "peak_rss_mib": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.batch, args.seq, args.threads)))
        return

    print(
        f"125m preset, fp32, CPU, batch {args.batch} x context {args.seq}, {args.threads} threads, "
        "one forward+backward per fresh process"
    )
    print(f"{'variant':8} {'loss':>9} {'step s':>8} {'RSS before MiB':>15} {'peak RSS MiB':>13} {'step added MiB':>15}")
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            cmd = [
                sys.executable,
                "-m",
                "bench.bench_loss_memory",
                "--child",
                variant,
                "--batch",
                str(args.batch),
                "--seq",
                str(args.seq),
                "--threads",
                str(args.threads),
            ]
            proc = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
            out = json.loads(proc.stdout.splitlines()[-1])
            results[variant].append(out)
            print(
                f"{variant:8} {out['loss']:9.5f} {out['step_s']:8.2f} {out['rss_before_mib']:15.0f} "
                f"{out['peak_rss_mib']:13.0f} {out['peak_rss_mib'] - out['rss_before_mib']:15.0f}",
                flush=True,
            )
    old, new = results["old"], results["new"]
    peak_old = min(o["peak_rss_mib"] for o in old)
    peak_new = min(o["peak_rss_mib"] for o in new)
    add_old = min(o["peak_rss_mib"] - o["rss_before_mib"] for o in old)
    add_new = min(o["peak_rss_mib"] - o["rss_before_mib"] for o in new)
    t_old, t_new = min(o["step_s"] for o in old), min(o["step_s"] for o in new)
    print(
        f"peak RSS old/new: {peak_old:.0f} / {peak_new:.0f} MiB (-{peak_old - peak_new:.0f} MiB); "
        f"added by the step: {add_old:.0f} / {add_new:.0f} MiB; best step time old/new: {t_old:.2f} / {t_new:.2f} s "
        f"(ratio {t_old / t_new:.2f})"
    )


if __name__ == "__main__":
    main()
