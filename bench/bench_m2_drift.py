"""How far CBP with M2 (`model.center_mlp=true`) on 2 ranks drifts from one process, per backend.

    python -m bench.bench_m2_drift [--no-m3]

The runs of `tests/test_distributed.py` (6 steps, accumulation, vocab 50257): one process, then 2
ranks under DDP, FSDP2 and ZeRO-2. Prints the three tensors with the largest relative difference
‖w₂ − w₁‖/‖w₁‖ after 6 steps, and the largest relative loss difference. `--no-m3` turns off CBP's
preconditioner (optim.cbp.precondition=false), whose 1/(√v̂ + ζ) grows reduction-order noise.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.helpers import run_train, train_losses
from tests.launch.test_distributed import EQUAL, final_weights

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-m3", action="store_true", help="optim.cbp.precondition=false")
    args = parser.parse_args()
    extra = ["optim.cbp.precondition=false"] if args.no_m3 else []
    root = Path(tempfile.mkdtemp(prefix="m2-drift-"))
    common = ["optim.name=cbp", "model.center_mlp=true", *EQUAL, *extra]
    runs = {}
    for backend, nproc in (("none", 1), ("ddp", 2), ("fsdp", 2), ("zero2", 2)):
        run_dir = root / f"{backend}-center"  # final_weights reads "center" in the name
        run_train([f"run.dir={run_dir}", f"parallel.backend={backend}", *common], nproc=nproc)
        runs[backend] = run_dir
    ref_w, ref_l = final_weights(runs["none"]), train_losses(runs["none"])
    print(f"CBP + M2{' (no M3)' if args.no_m3 else ''}, 6 steps, 2 ranks vs 1 process")
    for backend in ("ddp", "fsdp", "zero2"):
        w, losses = final_weights(runs[backend]), train_losses(runs[backend])
        worst = sorted((((w[k] - ref_w[k]).norm() / ref_w[k].norm()).item(), k) for k in ref_w)[::-1][:3]
        loss_gap = max(abs(losses[s] - ref_l[s]) / abs(ref_l[s]) for s in ref_l)
        print(f"  {backend:6s} loss {loss_gap:.1e}  " + "  ".join(f"{k} {v:.1e}" for v, k in worst))


if __name__ == "__main__":
    main()
