"""Statistics for the report: t-tests and t-intervals (scipy.stats), Holm's correction, least-squares
lines and the power-law fits.

Differences between optimizers get t-intervals (mean ± t₀.₉₇₅,df·s/√n), never a percentile bootstrap:
resampling 2-3 seeds gives a handful of distinct means and an interval that is too narrow by
~(n−1)/n in variance and by t/z in width. Fits use a grid over the exponent with linear least
squares for the other two parameters: robust for the handful of points a sweep gives (curve_fit
needs starting values and can wander off). Fit intervals draw each point's mean from its
t-distribution (x̄ + s/√n·T_{n−1}) and refit (`t_draws`, `fit_power_law_batch`), for the same reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

SEED = 0  # the draws' seed, fixed: the report is a pure function of the logs
ALPHA_RANGE = (0.005, 3.0)  # the exponent's search range


@dataclass
class Comparison:
    """mean(a) − mean(b) of two groups' final losses (negative: a has the lower loss)."""

    diff: float
    ci: tuple[float, float]
    p: float | None  # two-sided; None when undefined (zero variance)
    t: float | None
    df: float | None
    paired: bool  # True: a paired t-interval and test; False: Welch's
    n: int  # pairs (paired) or the smaller group's size
    p_holm: float | None = None  # Holm-adjusted over the headline's tests; None outside that family

    @property
    def within_noise(self) -> bool:
        """The interval includes 0: the seeds cannot tell the two apart."""
        return self.ci[0] <= 0.0 <= self.ci[1]


def t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t with df degrees of freedom."""
    return float(stats.t.ppf(q, df))


def t_interval(values: ArrayLike, level: float = 0.95) -> tuple[float, float, float, int] | None:
    """(mean, lo, hi, df): mean ± t_{(1+level)/2, n−1}·s/√n; None for fewer than 2 values."""
    v = np.asarray(values, float)
    if len(v) < 2 or not np.all(np.isfinite(v)):
        return None
    m = float(v.mean())
    lo, hi = stats.t.interval(level, len(v) - 1, loc=m, scale=stats.sem(v)) if np.ptp(v) > 0 else (m, m)
    return m, float(lo), float(hi), len(v) - 1


def compare(a: dict[int, float], b: dict[int, float]) -> Comparison | None:
    """a, b: seed -> final loss. Paired by seed when both have the same >= 2 seeds (the t-interval of
    the differences), else Welch; None if either group has a single seed (no test is possible)."""
    if len(a) < 2 or len(b) < 2:
        return None
    common = sorted(set(a) & set(b))
    paired = len(common) >= 2 and set(a) == set(b)
    xa = np.array([a[s] for s in common] if paired else list(a.values()), float)
    xb = np.array([b[s] for s in common] if paired else list(b.values()), float)
    diff = float(np.mean(xa) - np.mean(xb))
    spread = np.std(xa - xb, ddof=1) if paired else np.var(xa, ddof=1) + np.var(xb, ddof=1)
    n = len(common) if paired else min(len(xa), len(xb))
    if spread == 0.0:  # no variance: the difference is exact and no test is defined
        return Comparison(diff, (diff, diff), None, None, float(n - 1) if paired else None, paired, n)
    res = stats.ttest_rel(xa, xb) if paired else stats.ttest_ind(xa, xb, equal_var=False)
    ci = res.confidence_interval(0.95)
    p, t, df = min(1.0, float(res.pvalue)), float(res.statistic), float(res.df)
    return Comparison(diff, (float(ci.low), float(ci.high)), p, t, df, paired, n)


def holm(pvals: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (None stays None and is not counted as a test)."""
    given = sorted((float(p), i) for i, p in enumerate(pvals) if p is not None)
    out: list[float | None] = [None] * len(pvals)
    running = 0.0
    for rank, (p, i) in enumerate(given):
        running = max(running, min(1.0, (len(given) - rank) * p))  # monotone in the raw order
        out[i] = running
    return out


def t_draws(groups: Sequence[Sequence[float]], draws: int, seed: int = SEED) -> np.ndarray:
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


def ols_slope(x: ArrayLike, y: ArrayLike) -> Slope | None:
    """Least-squares line y = a + b x with a t-interval for b (df = n − 2)."""
    xv = np.asarray(x, float)
    if len(xv) < 2 or np.ptp(xv) == 0:
        return None
    fit = stats.linregress(xv, np.asarray(y, float))
    df = len(xv) - 2
    if df < 1:
        return Slope(float(fit.slope), float(fit.intercept), None, df, None)
    half = t_ppf(0.975, df) * float(fit.stderr)
    return Slope(float(fit.slope), float(fit.intercept), float(fit.stderr), df, (fit.slope - half, fit.slope + half))


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


def _least_squares(xs: np.ndarray, ys: np.ndarray, alphas: np.ndarray) -> tuple[np.ndarray, ...]:
    """E and A of y = E + A·x^−α by least squares for each y vector (ys: [B, n]) and exponent (alphas:
    [G]), with E >= 0 (a loss floor below zero is meaningless: A alone) and A >= 0 (else flat at
    the mean): (E, A), each [B, G], and the basis x^−α, [G, n]."""
    X = np.power(xs, -alphas[:, None])
    xm, ym = X.mean(1), ys.mean(1)[:, None]
    xc = X - xm[:, None]
    A = (ys - ym) @ xc.T / np.sum(xc * xc, 1)
    E = ym - A * xm
    A = np.where(E < 0, ys @ X.T / np.sum(X * X, 1), A)
    E = np.maximum(E, 0.0)
    return np.where(A < 0, ym, E), np.maximum(A, 0.0), X


def fit_power_law(x: ArrayLike, y: ArrayLike) -> PowerFit | None:
    """Fit y = E + A x^-alpha: a grid over alpha (then a finer grid around the best), E >= 0 and A >= 0
    by linear least squares for each alpha. Needs >= 3 points with distinct x."""
    xa, ya = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(xa) & np.isfinite(ya) & (xa > 0)
    xv, yv = xa[ok], ya[ok]
    if len(np.unique(xv)) < 3:
        return None
    # Work with x / geometric-mean(x) so that x^-alpha stays well scaled for N ~ 1e9.
    scale = float(np.exp(np.mean(np.log(xv))))
    grid, best = np.linspace(*ALPHA_RANGE, 600), (math.inf, 0.0, 0.0, 0.0)
    for _ in range(3):  # coarse grid, then two refinements around the minimum
        E, A, X = _least_squares(xv / scale, yv[None], grid)
        sse = np.sum((yv - E[0][:, None] - A[0][:, None] * X) ** 2, 1)
        k = int(np.argmin(sse))
        if sse[k] < best[0]:
            best = (float(sse[k]), float(grid[k]), float(E[0, k]), float(A[0, k]))
        step = grid[1] - grid[0]
        grid = np.linspace(max(best[1] - step, 1e-4), best[1] + step, 41)
    sse, alpha, E0, A_scaled = best
    at_edge = alpha <= ALPHA_RANGE[0] * 1.05 or alpha >= ALPHA_RANGE[1] * 0.99
    return PowerFit(E0, A_scaled * scale**alpha, alpha, math.sqrt(sse / len(xv)), len(xv), at_edge)


ALPHA_GRID = np.linspace(*ALPHA_RANGE, 300)  # step 0.01: enough for an interval


def fit_power_law_batch(x: ArrayLike, ys: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`fit_power_law` for many y vectors at once (ys: [B, n]) on a coarse α grid (step 0.01,
    enough for an interval): (E, A, α), each [B]."""
    xv, yv = np.asarray(x, float), np.asarray(ys, float)
    scale = float(np.exp(np.mean(np.log(xv))))
    E, A, X = _least_squares(xv / scale, yv, ALPHA_GRID)
    # Σ(y − E − A·x)² expanded in sums, so no [B, G, n] array is formed.
    syy, sy = np.sum(yv * yv, 1)[:, None], np.sum(yv, 1)[:, None]
    sxy, sx, sxx = yv @ X.T, X.sum(1), np.sum(X * X, 1)
    sse = syy + xv.size * E * E + A * A * sxx - 2 * E * sy - 2 * A * sxy + 2 * E * A * sx
    k = np.argmin(sse, axis=1)
    rows = np.arange(len(yv))
    alpha = ALPHA_GRID[k]
    return E[rows, k], A[rows, k] * scale**alpha, alpha
