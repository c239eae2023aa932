"""Benchmark (prints, asserts nothing): CBP's head-to-head study on the six-arm spiral (seed 000
§6.3, Table 6) with our optimizers, next to the paper's numbers.

    OMP_NUM_THREADS=1 python -m bench.bench_cbp_spiral [--seeds 10] [--iters 1500] [--batch 64]
        [--lrs 0.001,0.003,0.01,0.03,0.1,0.3] [--arms Adam,...] [--noise 0.30]
        [--select-seeds K]

Protocol (paper §6 intro and §6.3): a six-arm noisy spiral in R², standardised, split 60/20/20
(train/val/test); a 10-hidden-layer width-48 ReLU MLP (He init, zero biases), softmax +
cross-entropy; every arm × LR of the common grid × seed is trained; an LR is discarded if any seed
ends non-finite; the LR with the lowest mean final validation loss is selected per arm; its test
numbers are reported with paired (by seed) two-sided t-tests against Adam. "iters@0.30" = first
iteration at which an EMA (decay 0.9) of the minibatch loss drops below 0.30 (runs that never do
count as --iters and are flagged). The paper's Appendix C (spiral noise, sample count, batch size,
iterations) is not in the seed text: the values here are our choices (see --help), the noise
picked once so that Adam's test accuracy lands in the paper's 0.86–0.88 band, not per method.

Arms: the paper's (M1, M2 and M1+M2 attach to an SGD-style step, β1 = 0; M3 and the full method to
the bias-corrected Adam-style step). M1 blocks: each weight matrix is a block (equalised among the
weights), each bias vector a block (equalised among the biases). M2 = every Linear is a
models.centered_linear.CenteredLinear, means updated after each step (Algorithm 1, lines 10–11).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from models.centered_linear import CenteredLinear, update_means
from orscale.cbp import CBP
from orscale.lamb_lars import LAMB, LARS, trust_ratio_param_groups

GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)
# Table 6: l.r., train loss (mean, sd), test loss, test acc (mean, sd), iters@0.30 (mean, sd).
PAPER = {
    "SGD": (0.03, 0.245, 0.039, 0.368, 0.862, 0.016, 896, 67),
    "SGD+momentum": (0.001, 0.222, 0.033, 0.337, 0.879, 0.011, 897, 100),
    "Adam": (0.001, 0.201, 0.025, 0.387, 0.871, 0.010, 326, 22),
    "AdamW": (0.001, 0.201, 0.021, 0.390, 0.870, 0.012, 324, 24),
    "LARS": (0.001, 0.231, 0.016, 0.364, 0.868, 0.012, 726, 55),
    "LAMB": (0.001, 0.196, 0.014, 0.376, 0.875, 0.008, 371, 32),
    "Adam+Center": (0.001, 0.164, 0.010, 0.400, 0.872, 0.008, 234, 7),
    "CBP-M1": (0.03, 0.233, 0.040, 0.361, 0.870, 0.013, 721, 83),
    "CBP-M2": (0.01, 0.186, 0.014, 0.304, 0.884, 0.005, 535, 63),
    "CBP-M3": (0.001, 0.206, 0.037, 0.367, 0.871, 0.016, 342, 28),
    "CBP-M1M2": (0.01, 0.183, 0.014, 0.308, 0.884, 0.005, 504, 63),
    "CBP (full)": (0.001, 0.170, 0.015, 0.387, 0.875, 0.010, 241, 9),
}


# ----------------------------------------------------------------------------- data and model
def make_spiral(
    seed: int, n_per_class: int = 500, classes: int = 6, noise: float = 0.30, turns: float = 0.75
) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy K-arm spiral: radius r ~ U(0, 1), angle 2πk/K + 2π·turns·r + noise·N(0, 1)·(radians),
    then standardised to zero mean and unit variance per coordinate. Returns (x [N, 2], y [N])."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    xs, ys = [], []
    for k in range(classes):
        r = torch.rand(n_per_class, generator=gen)
        theta = 2 * math.pi * k / classes + 2 * math.pi * turns * r
        theta = theta + noise * torch.randn(n_per_class, generator=gen)
        xs.append(torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1))
        ys.append(torch.full((n_per_class,), k, dtype=torch.long))
    x, y = torch.cat(xs), torch.cat(ys)
    x = (x - x.mean(0)) / x.std(0)
    perm = torch.randperm(len(y), generator=gen)
    return x[perm], y[perm]


def split(x: torch.Tensor, y: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    n = len(y)
    a, b = int(0.6 * n), int(0.8 * n)
    return {"train": (x[:a], y[:a]), "val": (x[a:b], y[a:b]), "test": (x[b:], y[b:])}


def make_mlp(
    seed: int,
    centered: bool,
    hidden: int = 10,
    width: int = 48,
    classes: int = 6,
    act: Callable[[], nn.Module] = nn.ReLU,
) -> nn.Sequential:
    """He-initialised MLP (zero biases); identical weights for the plain and the centred variant."""
    gen = torch.Generator().manual_seed(seed)
    dims = [2] + [width] * hidden + [classes]
    layers: list[nn.Module] = []
    for i, (fi, fo) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        lin = nn.Linear(fi, fo)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(fo, fi, generator=gen) * math.sqrt(2.0 / fi))
            lin.bias.zero_()
        layers.append(CenteredLinear.from_linear(lin) if centered else lin)
        if i < len(dims) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def weight_bias_groups(model: nn.Module) -> list[dict]:
    """M1 blocks: weights equalised among themselves, biases among themselves (c per group)."""
    named = list(model.named_parameters())
    return [
        dict(params=[(n, p) for n, p in named if p.ndim >= 2]),
        dict(params=[(n, p) for n, p in named if p.ndim < 2]),
    ]


# arm name -> (centred model?, optimizer factory over the per-seed models). Every optimizer
# treats each seed's tensors as separate blocks; CBP gets one weight and one bias group per seed
# so its M1 target c never mixes seeds. torch optimizers use their multi-tensor (foreach) path.
def _flat(models: list[nn.Module]) -> list[nn.Parameter]:
    return [p for m in models for p in m.parameters()]


def _named(models: list[nn.Module]) -> list[tuple[str, nn.Parameter]]:
    return [(f"seed{i}.{n}", p) for i, m in enumerate(models) for n, p in m.named_parameters()]


def _cbp_groups(models: list[nn.Module]) -> list[dict]:
    return [g for m in models for g in weight_bias_groups(m)]


OptFactory = Callable[[list[nn.Module], float], torch.optim.Optimizer]
ARMS: dict[str, tuple[bool, OptFactory]] = {
    "SGD": (False, lambda ms, lr: torch.optim.SGD(_flat(ms), lr=lr, foreach=True)),
    "SGD+momentum": (False, lambda ms, lr: torch.optim.SGD(_flat(ms), lr=lr, momentum=0.9, foreach=True)),
    "Adam": (False, lambda ms, lr: torch.optim.Adam(_flat(ms), lr=lr, foreach=True)),
    "AdamW": (False, lambda ms, lr: torch.optim.AdamW(_flat(ms), lr=lr, weight_decay=0.01, foreach=True)),
    "LARS": (
        False,
        lambda ms, lr: LARS(trust_ratio_param_groups(_named(ms), 0.0), lr=lr, momentum=0.9, trust_coefficient=1e-3),
    ),
    "LAMB": (False, lambda ms, lr: LAMB(trust_ratio_param_groups(_named(ms), 0.01), lr=lr)),
    "Adam+Center": (True, lambda ms, lr: torch.optim.Adam(_flat(ms), lr=lr, foreach=True)),
    "CBP-M1": (False, lambda ms, lr: CBP(_cbp_groups(ms), lr=lr, betas=(0.0, 0.999), precondition=False)),
    "CBP-M2": (True, lambda ms, lr: torch.optim.SGD(_flat(ms), lr=lr, foreach=True)),
    "CBP-M3": (False, lambda ms, lr: CBP(_cbp_groups(ms), lr=lr, equalize=False)),
    "CBP-M1M2": (True, lambda ms, lr: CBP(_cbp_groups(ms), lr=lr, betas=(0.0, 0.999), precondition=False)),
    "CBP (full)": (True, lambda ms, lr: CBP(_cbp_groups(ms), lr=lr)),
}


# ----------------------------------------------------------------------------- seeds in one pass
def ensemble_forward(models: list[nn.Sequential], x: torch.Tensor, record: bool) -> torch.Tensor:
    """All seeds' MLPs at once: x [S, B, in] -> logits [S, B, out], one batched matmul per layer.

    Computes exactly what each model computes on its own slice (W(x − μ) + b for a
    CenteredLinear); with ``record`` it also records each CenteredLinear's input sum, as the
    module's own training-mode forward does, so ``update_means`` (the module's code) can run the
    EMA and the bias transport after the step. Python overhead, not FLOPs, bounds these tiny nets:
    batching the seeds is what makes the full protocol fit on one core.
    """
    h = x
    for layer in zip(*models, strict=True):
        first = layer[0]
        if isinstance(first, (nn.Linear, CenteredLinear)):
            w = torch.stack([m.weight for m in layer])
            b = torch.stack([m.bias for m in layer])
            if isinstance(first, CenteredLinear):
                if record:
                    torch._foreach_add_([m._sum for m in layer], list(h.detach().sum(1).unbind(0)))
                    for m in layer:
                        m._rows += h.shape[1]
                h = h - torch.stack([m.mu for m in layer]).unsqueeze(1)
            h = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
        else:
            h = first(h)  # the activation
    return h


@torch.no_grad()
def evaluate(models: list[nn.Sequential], x: torch.Tensor, y: torch.Tensor) -> tuple[list, list]:
    logits = ensemble_forward(models, x, record=False)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    acc = (logits.argmax(-1) == y).float()
    return loss.mean(1).tolist(), acc.mean(1).tolist()


def train_run(
    arm: str,
    lr: float,
    seeds: list[int],
    data: dict,
    iters: int,
    batch: int,
    threshold: float = 0.30,
    smooth: float = 0.9,
) -> list[dict[str, float]]:
    """One arm at one LR for every seed (seed s: its own data, init and minibatch order)."""
    centered, make_opt = ARMS[arm]
    models = [make_mlp(s, centered) for s in seeds]
    opt = make_opt(models, lr)
    xtr, ytr = data["train"]  # [S, N, 2], [S, N]
    S = len(seeds)
    order = torch.stack(
        [
            torch.randint(0, ytr.shape[1], (iters, batch), generator=torch.Generator().manual_seed(20_000 + s))
            for s in seeds
        ],
        dim=1,
    )  # [iters, S, B]: same order for every arm
    rows = torch.arange(S).unsqueeze(1)
    ema: list[float] = [math.nan] * S
    hit: list[int | None] = [None] * S
    finite = [True] * S
    for it in range(iters):
        idx = order[it]
        logits = ensemble_forward(models, xtr[rows, idx], record=centered)
        per_seed = (
            F.cross_entropy(logits.flatten(0, 1), ytr[rows, idx].flatten(), reduction="none").view(S, batch).mean(1)
        )
        opt.zero_grad(set_to_none=True)
        per_seed.sum().backward()  # seeds share no parameter: each gets its own mean-loss gradient
        opt.step()
        if centered:
            for m in models:
                update_means(m)
        for s, val in enumerate(per_seed.tolist()):
            if not math.isfinite(val):
                finite[s] = False
                continue
            ema[s] = val if it == 0 else smooth * ema[s] + (1 - smooth) * val
            if hit[s] is None and ema[s] < threshold:
                hit[s] = it + 1
    out = [
        {"finite": float(f), "iters": float(h if h is not None else iters), "censored": float(h is None)}
        for f, h in zip(finite, hit, strict=True)
    ]
    for part in ("train", "val", "test"):
        losses, accs = evaluate(models, *data[part])
        for o, loss, acc in zip(out, losses, accs, strict=True):
            o[f"{part}_loss"], o[f"{part}_acc"] = loss, acc
            if not (math.isfinite(loss) and math.isfinite(acc)):
                o["finite"] = 0.0
    return out


# ----------------------------------------------------------------------------- statistics
def boot_ci(x: np.ndarray, reps: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = rng.choice(x, size=(reps, len(x)), replace=True).mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def paired(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sided paired t-test p and Cohen's d of the per-seed differences a − b."""
    from scipy import stats

    d = a - b
    if len(d) < 2 or np.allclose(d, d[0]):
        return math.nan, math.nan
    return float(stats.ttest_rel(a, b).pvalue), float(d.mean() / d.std(ddof=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--iters", type=int, default=1500, help="training iterations per run (ours)")
    ap.add_argument("--batch", type=int, default=64, help="minibatch size (ours)")
    ap.add_argument("--per-class", type=int, default=500, help="points per arm (ours): 3000 in all")
    ap.add_argument("--noise", type=float, default=0.30, help="angular noise, radians (ours)")
    ap.add_argument("--lrs", default=",".join(map(str, GRID)))
    ap.add_argument(
        "--select-seeds",
        type=int,
        default=0,
        help="reduced protocol: select the LR on the first k seeds, then run only the "
        "selected LR on all --seeds (default 0: every LR on every seed)",
    )
    ap.add_argument("--arms", default=",".join(ARMS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    lrs = [float(v) for v in args.lrs.split(",")]
    arms = [a for a in args.arms.split(",") if a]
    seeds = list(range(args.seeds))
    parts = [split(*make_spiral(s, args.per_class, noise=args.noise)) for s in seeds]
    data = {k: tuple(torch.stack([p[k][i] for p in parts]) for i in range(2)) for k in parts[0]}
    print(
        f"# spiral: 6 arms x {args.per_class} pts, noise {args.noise}; MLP 10x48 ReLU; "
        f"batch {args.batch}; {args.iters} iters; seeds {args.seeds}; LR grid {lrs}"
    )
    t0 = time.perf_counter()
    k = min(args.select_seeds or args.seeds, args.seeds)
    sel = {key: tuple(t[:k] for t in val) for key, val in data.items()}
    grid: dict[str, dict[float, list[dict]]] = {}
    for arm in arms:  # stage 1: every LR of the grid on the first k seeds
        grid[arm] = {lr: train_run(arm, lr, seeds[:k], sel, args.iters, args.batch) for lr in lrs}
        print(f"#   {arm:13s} grid done ({time.perf_counter() - t0:7.1f} s)", flush=True)

    print(f"\n## Validation loss per LR (mean over {k} seeds; 'x' = discarded: a seed went non-finite)")
    print(f"{'method':14s}" + "".join(f"{lr:>9g}" for lr in lrs))
    chosen: dict[str, float] = {}
    for arm in arms:
        cells, best = [], (math.inf, None)
        for lr in lrs:
            runs = grid[arm][lr]
            if not all(r["finite"] for r in runs):
                cells.append(f"{'x':>9s}")
                continue
            v = float(np.mean([r["val_loss"] for r in runs]))
            cells.append(f"{v:9.3f}" if v < 1e3 else f"{v:9.1e}")  # exploded but finite
            best = min(best, (v, lr))
        chosen[arm] = best[1]
        print(f"{arm:14s}" + "".join(cells))
    results: dict[str, dict[float, list[dict]]] = {}
    for arm in arms:  # stage 2 (reduced protocol only): the selected LR on every seed
        lr = chosen[arm]
        if lr is None:
            continue
        results[arm] = {
            lr: grid[arm][lr] if k == args.seeds else train_run(arm, lr, seeds, data, args.iters, args.batch)
        }
    if k < args.seeds:
        print(f"#   final runs on {args.seeds} seeds done ({time.perf_counter() - t0:7.1f} s)")

    def col(arm: str, key: str) -> np.ndarray:
        return np.array([r[key] for r in results[arm][chosen[arm]]])

    print(
        "\n## Selected LR, test split; mean ± sd over seeds; p = paired t-test vs Adam "
        "(d = Cohen's d of the per-seed differences arm − Adam); the paper's Table 6 after |"
    )
    hdr = (
        f"{'method':13s} {'lr':>6s} {'train loss':>14s} {'CI95':>15s} {'test loss':>9s} "
        f"{'test acc':>14s} {'iters@0.30':>12s} {'CI95':>12s} {'p(loss)':>8s} {'d':>5s} "
        f"{'p(iters)':>8s} {'d':>5s} | paper: lr, train, test acc, iters"
    )
    print(hdr)
    for arm in arms:
        if chosen[arm] is None:
            print(f"{arm:13s} no finite LR")
            continue
        tl, it, ta = col(arm, "train_loss"), col(arm, "iters"), col(arm, "test_acc")
        cens = int(col(arm, "censored").sum())
        lo, hi = boot_ci(tl)
        ilo, ihi = boot_ci(it)
        p1 = d1 = p2 = d2 = math.nan
        if "Adam" in chosen and chosen["Adam"] is not None and arm != "Adam":
            p1, d1 = paired(tl, col("Adam", "train_loss"))
            p2, d2 = paired(it, col("Adam", "iters"))
        pp = PAPER.get(arm)
        paper = f"{pp[0]:g}, {pp[1]:.3f}±{pp[2]:.3f}, {pp[4]:.3f}±{pp[5]:.3f}, {pp[6]}±{pp[7]}" if pp else ""
        flag = f"*{cens}" if cens else ""
        print(
            f"{arm:13s} {chosen[arm]:6g} {tl.mean():6.3f}±{tl.std(ddof=1):.3f} "
            f"[{lo:.3f},{hi:.3f}] {col(arm, 'test_loss').mean():9.3f} "
            f"{ta.mean():6.3f}±{ta.std(ddof=1):.3f} {it.mean():6.0f}±{it.std(ddof=1):3.0f}{flag:3s}"
            f"[{ilo:4.0f},{ihi:4.0f}] {p1:8.2g} {d1:5.1f} {p2:8.2g} {d2:5.1f} | {paper}"
        )
    print(f"(*n: n seeds never reached 0.30; counted as {args.iters}.)  total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
