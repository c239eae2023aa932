"""The checkpoint portability matrix, with its figures: save under each backend at step 2, resume under
every other to step 4, and compare with an uninterrupted one-process run (what
tests/launch/test_portable_checkpoints.py asserts, printed as the table in docs/running.md).

    python -m bench.bench_portable [--optim orscale_lm] [--out TABLE.md]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from launch.checkpoint.portable import calibration_constants
from models import GPT, get_preset
from tests.helpers import run_many, train_losses

RANKS = {"none": 1, "ddp": 2, "fsdp": 2, "zero2": 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optim", default="orscale_lm")
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    args = ap.parse_args()
    common = [f"optim.name={args.optim}", "train.eval_every=0", "train.ckpt_every=2"]
    with torch.device("meta"):  # the model of tests.helpers.SMALL
        model = GPT(get_preset("tiny", n_layer=2, d_model=64, max_seq_len=64, vocab_size=4096))
    shapes = {n: p.shape for n, p in model.named_parameters()}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        def cell(backend: str, run_dir: Path, steps: int) -> list[str]:
            return [*common, f"train.max_steps={steps}", f"run.dir={run_dir}", f"parallel.backend={backend}"]

        # One launch per world size for the saves, one per destination for the resumes (run_many).
        run_many([cell("none", root / "from_none", 2), cell("none", root / "straight", 4)])
        run_many([cell(b, root / f"from_{b}", 2) for b in RANKS if RANKS[b] == 2], 2)
        for dst in RANKS:
            for src in RANKS:
                if src != dst:
                    shutil.copytree(root / f"from_{src}", root / f"{src}_to_{dst}")
            run_many([cell(dst, root / f"{src}_to_{dst}", 4) for src in RANKS if src != dst], RANKS[dst])
        want = train_losses(root / "straight")
        rows = []
        for src in RANKS:
            c_src = calibration_constants(root / f"from_{src}" / "checkpoints/step_00000002", shapes)
            for dst in RANKS:
                if dst == src:
                    continue
                d = root / f"{src}_to_{dst}"
                got = train_losses(d)
                c_dst = calibration_constants(d / "checkpoints/step_00000004", shapes)
                same_c = (
                    bool(c_src) and set(c_src) == set(c_dst) and all(torch.equal(c_src[k], c_dst[k]) for k in c_src)
                )
                rel = [abs(got[s] - want[s]) / abs(want[s]) for s in (3, 4)]
                rows.append(
                    f"| {src} ({RANKS[src]}) | {dst} ({RANKS[dst]}) | {rel[0]:.1e} | {rel[1]:.1e} | "
                    f"{'bit-equal' if same_c else 'DIFFERENT'} ({len(c_src)} matrices) |"
                )
                print(rows[-1], flush=True)
    head = [
        "| saved under (ranks) | resumed under (ranks) | step-3 loss, rel. Δ | step-4 loss, rel. Δ | c |",
        "| --- | --- | --- | --- | --- |",
    ]
    table = "\n".join(head + rows)
    print(f"\n{table}\n\n{len(rows)} pairs in {time.perf_counter() - t0:.0f} s")
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
