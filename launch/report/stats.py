"""Statistics for the sweep report: t-intervals and tests, Holm's correction and the scaling fits.

The t statistic is computed here; p-values and quantiles come from scipy's Student t distribution
(`scipy.stats.t`). Differences between optimizers get t-intervals (mean ±
t₀.₉₇₅,df·s/√n), never a percentile bootstrap: resampling 2-3 seeds gives a handful of distinct
means and an interval that is too narrow by ~(n−1)/n in variance and by t/z in width.
Fits use a grid over the exponent with linear least squares for the other two parameters: robust
for the handful of points a sweep gives (curve_fit needs starting values and can wander off).
Fit intervals draw each point's mean from its t-distribution (x̄ + s/√n·T_{n−1}) and refit
(`t_draws`, `fit_power_law_batch`), for the same reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats as scipy_stats

BOOT_RESAMPLES = 10_000
BOOT_SEED = 0  # fixed: the report is a pure function of the logs


@dataclass
class Comparison:
    diff: float  # mean(a) - mean(b); negative: a has the lower loss
    ci: tuple[float, float]
    p: float | None  # two-sided; None when undefined (zero variance)
    t: float | None
    df: float | None
    paired: bool
    n: int  # pairs (paired) or min group size
    ci_method: str = "t"  # "t": paired t-interval, "welch": Welch t-interval

    @property
    def within_noise(self) -> bool:
        """The interval includes 0: the seeds cannot tell the two apart."""
        return self.ci[0] <= 0.0 <= self.ci[1]


def _t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom."""
    return float(scipy_stats.t.sf(t, df))


def t_test(a: Sequence[float], b: Sequence[float], paired: bool) -> tuple[float | None, float | None, float | None]:
    """(t, df, two-sided p): paired t-test on a-b, or Welch's test for independent groups."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if paired:
        d = a - b
        n = len(d)
        sd = float(np.std(d, ddof=1)) if n > 1 else 0.0
        if n < 2 or sd == 0.0:
            return None, None, None
        t, df = float(d.mean() / (sd / math.sqrt(n))), float(n - 1)
    else:
        if len(a) < 2 or len(b) < 2:
            return None, None, None
        va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        if va + vb == 0.0:
            return None, None, None
        t = float((a.mean() - b.mean()) / math.sqrt(va + vb))
        df = float((va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)))
    return t, df, min(1.0, 2.0 * _t_sf(abs(t), df))


def bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    paired: bool,
    level: float = 0.95,
    resamples: int = BOOT_RESAMPLES,
    seed: int = BOOT_SEED,
) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(a) - mean(b) (pairs resampled together when paired)."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a, float), np.asarray(b, float)
    if paired:
        d = a - b
        stats = d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    else:
        stats = a[rng.integers(0, len(a), size=(resamples, len(a)))].mean(axis=1) - b[
            rng.integers(0, len(b), size=(resamples, len(b)))
        ].mean(axis=1)
    lo, hi = np.percentile(stats, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


@lru_cache(maxsize=256)
def t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t with df degrees of freedom."""
    return float(scipy_stats.t.ppf(q, df))


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float, int] | None:
    """(mean, lo, hi, df): mean ± t_{(1+level)/2, n−1}·s/√n; None for fewer than 2 values."""
    v = np.asarray(values, float)
    if len(v) < 2 or not np.all(np.isfinite(v)):
        return None
    half = t_ppf((1 + level) / 2, len(v) - 1) * float(np.std(v, ddof=1)) / math.sqrt(len(v))
    m = float(v.mean())
    return m, m - half, m + half, len(v) - 1


def compare(a: dict[int, float], b: dict[int, float]) -> Comparison | None:
    """a, b: seed -> final loss. Paired by seed when both have the same >= 2 seeds (t-interval of
    the differences), else Welch; None if either group has a single seed (no test is possible)."""
    if len(a) < 2 or len(b) < 2:
        return None
    common = sorted(set(a) & set(b))
    paired = len(common) >= 2 and set(a) == set(b)
    if paired:
        xa, xb = [a[s] for s in common], [b[s] for s in common]
    else:
        xa, xb = list(a.values()), list(b.values())
    t, df, p = t_test(xa, xb, paired)
    diff = float(np.mean(xa) - np.mean(xb))
    if paired:
        ti = t_interval(np.subtract(xa, xb))
        ci = (ti[1], ti[2]) if ti is not None else (diff, diff)
        df = float(len(common) - 1)
    else:
        va, vb = np.var(xa, ddof=1) / len(xa), np.var(xb, ddof=1) / len(xb)
        half = t_ppf(0.975, df) * math.sqrt(va + vb) if df is not None else 0.0
        ci = (diff - half, diff + half)
    return Comparison(
        diff=diff,
        ci=ci,
        p=p,
        t=t,
        df=df,
        paired=paired,
        n=len(common) if paired else min(len(xa), len(xb)),
        ci_method="t" if paired else "welch",
    )


def holm(pvals: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (None stays None and is not counted as a test)."""
    given = sorted((float(p), i) for i, p in enumerate(pvals) if p is not None)
    out: list[float | None] = [None] * len(pvals)
    running = 0.0
    for rank, (p, i) in enumerate(given):
        running = max(running, min(1.0, (len(given) - rank) * p))  # monotone in the raw order
        out[i] = running
    return out


def t_draws(groups: Sequence[Sequence[float]], draws: int, seed: int = BOOT_SEED) -> np.ndarray:
    """[draws, len(groups)]: each group's mean drawn as x̄ + s/√n·T_{n−1} (a group with one value
    stays at it: no spread is known). The draws feed fit intervals (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out = np.empty((draws, len(groups)))
    for j, g in enumerate(groups):
        v = np.asarray(g, float)
        if len(v) < 2:
            out[:, j] = v.mean() if len(v) else np.nan
        else:
            out[:, j] = v.mean() + v.std(ddof=1) / math.sqrt(len(v)) * rng.standard_t(len(v) - 1, draws)
    return out


def percentile_ci(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of draws; inf draws (a loss below an asymptote) count at the top."""
    x = np.where(np.isnan(x), np.inf, np.asarray(x, float))
    # "nearest": interpolating between two infinite draws would give NaN
    lo, hi = np.percentile(x, [100 * (1 - level) / 2, 100 * (1 + level) / 2], method="nearest")
    return float(lo), float(hi)


@dataclass
class Slope:
    slope: float
    intercept: float
    se: float | None
    df: int
    ci: tuple[float, float] | None  # t-interval; None with 2 points (df = 0)


def ols_slope(x: Sequence[float], y: Sequence[float]) -> Slope | None:
    """Least-squares line y = a + b x with a t-interval for b (df = n − 2)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    xc = x - x.mean()
    b = float(xc @ (y - y.mean()) / (xc @ xc))
    a = float(y.mean() - b * x.mean())
    df = len(x) - 2
    if df < 1:
        return Slope(b, a, None, df, None)
    se = math.sqrt(float(np.sum((y - a - b * x) ** 2)) / df / float(xc @ xc))
    half = t_ppf(0.975, df) * se
    return Slope(b, a, se, df, (b - half, b + half))


@dataclass
class PowerFit:
    """y = E + A * x^(-alpha), fitted by least squares."""

    E: float
    A: float
    alpha: float
    rmse: float
    n: int
    at_edge: bool = False  # alpha at the end of the search range: the points do not pin the curve down

    def __call__(self, x: np.ndarray | float) -> np.ndarray | float:
        return self.E + self.A * np.power(x, -self.alpha)

    def inverse(self, y: float) -> float:
        """x at which the fit reaches y (inf when y is at or below the asymptote E)."""
        if y <= self.E or self.A <= 0:
            return math.inf
        return float((self.A / (y - self.E)) ** (1.0 / self.alpha))


def fit_power_law(x: Sequence[float], y: Sequence[float], alphas: np.ndarray | None = None) -> PowerFit | None:
    """Fit y = E + A x^-alpha: a grid over alpha (then a finer grid around the best), E and A by
    linear least squares for each alpha, A >= 0 and E >= 0. Needs >= 3 points with distinct x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[ok], y[ok]
    if len(np.unique(x)) < 3:
        return None
    # Work with x / geometric-mean(x) so that x^-alpha stays well scaled for N ~ 1e9.
    scale = float(np.exp(np.mean(np.log(x))))
    xs = x / scale
    grid = np.linspace(0.005, 3.0, 600) if alphas is None else np.asarray(alphas, float)
    best = None
    for _ in range(3):  # coarse grid, then two refinements around the minimum
        for alpha in grid:
            basis = np.power(xs, -alpha)
            M = np.stack([np.ones_like(basis), basis], axis=1)
            coef, *_ = np.linalg.lstsq(M, y, rcond=None)
            if coef[0] < 0:  # a loss floor below zero is meaningless: fit A alone with E = 0
                coef = np.array([0.0, float(basis @ y / (basis @ basis))])
            if coef[1] < 0:
                coef = np.array([y.mean(), 0.0])
            sse = float(np.sum((M @ coef - y) ** 2))
            if best is None or sse < best[0]:
                best = (sse, float(alpha), float(coef[0]), float(coef[1]))
        step = grid[1] - grid[0] if len(grid) > 1 else 0.0
        if step == 0.0:
            break
        grid = np.linspace(max(best[1] - step, 1e-4), best[1] + step, 41)
    sse, alpha, E, A_scaled = best
    lo, hi = (0.005, 3.0) if alphas is None else (float(np.min(alphas)), float(np.max(alphas)))
    return PowerFit(
        E=E,
        A=A_scaled * scale**alpha,
        alpha=alpha,
        rmse=math.sqrt(sse / len(x)),
        n=len(x),
        at_edge=alpha <= lo * 1.05 or alpha >= hi * 0.99,
    )


ALPHA_GRID = np.linspace(0.005, 3.0, 300)  # step 0.01: enough for an interval


def fit_power_law_batch(x: Sequence[float], ys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`fit_power_law` for many y vectors at once (ys: [B, n]) on a coarse α grid (step 0.01,
    enough for an interval): (E, A, α), each [B]. Same constraints: E >= 0, A >= 0."""
    x = np.asarray(x, float)
    ys = np.asarray(ys, float)
    scale = float(np.exp(np.mean(np.log(x))))
    X = np.power(x / scale, -ALPHA_GRID[:, None])  # [G, n]
    xm = X.mean(1)
    xc = X - xm[:, None]
    ym = ys.mean(1)
    A = (ys - ym[:, None]) @ xc.T / np.sum(xc * xc, 1)  # [B, G]
    E = ym[:, None] - A * xm
    neg = E < 0  # a floor below zero: A alone with E = 0
    A = np.where(neg, ys @ X.T / np.sum(X * X, 1), A)
    E = np.where(neg, 0.0, E)
    flat = A < 0
    E = np.where(flat, ym[:, None], E)
    A = np.where(flat, 0.0, A)
    # Σ(y − E − A·x)² expanded in sums, so no [B, G, n] array is formed.
    n = x.size
    syy, sy = np.sum(ys * ys, 1)[:, None], np.sum(ys, 1)[:, None]
    sxy, sx, sxx = ys @ X.T, X.sum(1), np.sum(X * X, 1)
    sse = syy + n * E * E + A * A * sxx - 2 * E * sy - 2 * A * sxy + 2 * E * A * sx
    k = np.argmin(sse, axis=1)
    rows = np.arange(len(ys))
    alpha = ALPHA_GRID[k]
    return E[rows, k], A[rows, k] * scale**alpha, alpha
