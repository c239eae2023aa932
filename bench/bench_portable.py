"""The checkpoint portability matrix, with the comparisons a reader should make: every backend runs
uninterrupted to step N saving at step K; each saved checkpoint is resumed under every backend (its
own included) to step N; each resumed run's losses are compared with the uninterrupted run of the
backend that *saved* it and with that of the backend that *resumed* it, beside how far those two
uninterrupted runs are apart (the backends' own rounding). Printed as the table in docs/running.md.

    python -m bench.bench_portable [--optim orscale_lm] [--save-at 10] [--steps 20] [--out TABLE.md]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from launch.checkpoint.portable import calibration_constants
from models import GPT, get_preset
from tests.helpers import backend_args, run_many, train_losses

RANKS = {"none": 1, "ddp": 2, "fsdp": 2, "zero2": 2, "hsdp": 4}  # hsdp: 2 replica groups x 2 shards


def _rel(a: dict[int, float], b: dict[int, float], steps: range) -> float:
    """The largest relative difference of two loss curves over `steps`."""
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optim", default="orscale_lm")
    ap.add_argument("--save-at", type=int, default=10, help="the step the checkpoint is saved at (K)")
    ap.add_argument("--steps", type=int, default=20, help="the last step (N, a multiple of K)")
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    args = ap.parse_args()
    k, n = args.save_at, args.steps
    if n % k or n <= k:
        ap.error("--steps must be a multiple of --save-at, and larger")
    common = [f"optim.name={args.optim}", "train.eval_every=0", f"train.ckpt_every={k}", f"train.max_steps={n}"]
    with torch.device("meta"):  # the model of tests.helpers.SMALL
        model = GPT(get_preset("tiny", n_layer=2, d_model=64, max_seq_len=64, vocab_size=4096))
    shapes = {name: p.shape for name, p in model.named_parameters()}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        def cell(backend: str, run_dir: Path, resume: Path | None = None) -> list[str]:
            extra = [f"run.resume={resume}"] if resume else []
            return [*common, f"run.dir={run_dir}", *backend_args(backend), *extra]

        # One launch per world size for the uninterrupted runs, one per destination for the resumes.
        for nproc in sorted(set(RANKS.values())):
            run_many([cell(b, root / f"straight_{b}") for b in RANKS if RANKS[b] == nproc], nproc)
        saved = {b: root / f"straight_{b}" / f"checkpoints/step_{k:08d}" for b in RANKS}
        for dst in RANKS:
            run_many([cell(dst, root / f"{src}_to_{dst}", saved[src]) for src in RANKS], RANKS[dst])
        straight = {b: train_losses(root / f"straight_{b}") for b in RANKS}
        after = range(k + 1, n + 1)
        rows = []
        for src in RANKS:
            c_src = calibration_constants(saved[src], shapes)
            for dst in RANKS:
                d = root / f"{src}_to_{dst}"
                got = train_losses(d)
                c_dst = calibration_constants(d / f"checkpoints/step_{n:08d}", shapes)
                same_c = (
                    bool(c_src) and set(c_src) == set(c_dst) and all(torch.equal(c_src[x], c_dst[x]) for x in c_src)
                )
                rows.append(
                    f"| {src} ({RANKS[src]}) | {dst} ({RANKS[dst]}) "
                    f"| {_rel(got, straight[src], range(k + 1, k + 2)):.1e} "
                    f"| {_rel(got, straight[src], after):.1e} | {_rel(got, straight[dst], after):.1e} "
                    f"| {_rel(straight[dst], straight[src], after):.1e} "
                    f"| {'bit-equal' if same_c else 'DIFFERENT'} ({len(c_src)} matrices) |"
                )
                print(rows[-1], flush=True)
    head = [
        f"| saved under (ranks) | resumed under (ranks) | step {k + 1} vs the saver's uninterrupted run "
        f"| steps {k + 1}–{n}, max vs the saver's | max vs the resumer's uninterrupted run "
        f"| the two uninterrupted runs apart (backend rounding) | calibration constants c |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    table = "\n".join(head + rows)
    print(f"\n{table}\n\nrelative differences of train_loss; {len(rows)} pairs in {time.perf_counter() - t0:.0f} s")
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
