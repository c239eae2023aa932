"""Statistics for the sweep report: bootstrap intervals, t-tests and the scaling fits.

The t statistic is computed here; the p-value comes from scipy's Student t distribution when scipy
is installed, else from the regularised incomplete beta function below (same value to ~1e-10).
Fits use a grid over the exponent with linear least squares for the other two parameters: robust
for the handful of points a sweep gives (curve_fit needs starting values and can wander off).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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


def _t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom."""
    try:
        from scipy import stats

        return float(stats.t.sf(t, df))
    except ImportError:
        x = df / (df + t * t)
        tail = 0.5 * _betainc(df / 2.0, 0.5, x)
        return tail if t >= 0 else 1.0 - tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (continued fraction, Numerical Recipes 6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return front * h / a


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


def compare(a: dict[int, float], b: dict[int, float]) -> Comparison | None:
    """a, b: seed -> final loss. Paired by seed when both have the same >= 2 seeds; None if either
    group has a single seed (no test is possible)."""
    if len(a) < 2 or len(b) < 2:
        return None
    common = sorted(set(a) & set(b))
    paired = len(common) >= 2 and set(a) == set(b)
    if paired:
        xa, xb = [a[s] for s in common], [b[s] for s in common]
    else:
        xa, xb = list(a.values()), list(b.values())
    t, df, p = t_test(xa, xb, paired)
    return Comparison(
        diff=float(np.mean(xa) - np.mean(xb)),
        ci=bootstrap_ci(xa, xb, paired),
        p=p,
        t=t,
        df=df,
        paired=paired,
        n=len(common) if paired else min(len(xa), len(xb)),
    )


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
