"""Estimators with standard errors, and confidence intervals of differences.

* :func:`mean_estimate`: sample mean, SE = s/√n, df = n − 1.
* :func:`ratio_estimate`: R = Σy / Σx over units (turns), with the
  delta-method (linearisation) SE √(Σ(yᵢ − R·xᵢ)² / (n(n−1))) / x̄. With
  xᵢ = 1 it is a proportion with the Wald SE; with yᵢ = edits persisted and
  xᵢ = edits checked it is an edit-level rate that respects the clustering of
  edits within turns.
* :func:`quantile_estimate`: nearest-rank quantile; its SE comes from the
  distribution-free order-statistic interval (ranks nq ± 1.96·√(nq(1−q))),
  SE = width / (2·1.96).
* :func:`difference`: candidate − baseline, SE = √(sa² + sb²), Welch–
  Satterthwaite df; relative difference b/a − 1 with the delta-method SE.

Intervals are two-sided: estimate ± t(df, (1+c)/2)·SE (normal when df is
infinite). Contract: pure; an empty sample gives ``nan`` values, never raises.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from rewardflow.analysis.tdist import INF, t_quantile

_Z95 = NormalDist().inv_cdf(0.975)


def critical(confidence: float, df: float = INF) -> float:
    """Two-sided critical value of a ``confidence`` interval."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be in (0, 1)")
    return t_quantile(0.5 + confidence / 2, df)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with its standard error, sample size and degrees of freedom."""

    value: float
    se: float
    n: int
    df: float = INF


@dataclass(frozen=True, slots=True)
class Difference:
    """Candidate minus baseline, absolute and relative."""

    delta: float
    se: float
    df: float
    rel: float  # candidate / baseline − 1
    rel_se: float

    def interval(self, confidence: float) -> tuple[float, float]:
        return _interval(self.delta, self.se, confidence, self.df)

    def rel_interval(self, confidence: float) -> tuple[float, float]:
        return _interval(self.rel, self.rel_se, confidence, self.df)


def _interval(value: float, se: float, confidence: float, df: float) -> tuple[float, float]:
    if math.isnan(value) or math.isnan(se):
        return (math.nan, math.nan)
    half = critical(confidence, max(df, 1.0)) * se
    return (value - half, value + half)


def mean_estimate(values: Sequence[float]) -> Estimate:
    n = len(values)
    if n == 0:
        return Estimate(math.nan, math.nan, 0, 1.0)
    m = math.fsum(values) / n
    if n == 1:
        return Estimate(m, math.nan, 1, 1.0)
    var = math.fsum((v - m) ** 2 for v in values) / (n - 1)
    return Estimate(m, math.sqrt(var / n), n, float(n - 1))


def ratio_estimate(ys: Sequence[float], xs: Sequence[float]) -> Estimate:
    """Σy/Σx over units with xᵢ > 0 (units with xᵢ = 0 carry no information)."""
    pairs = [(y, x) for y, x in zip(ys, xs, strict=True) if x > 0]
    n = len(pairs)
    sx = math.fsum(x for _, x in pairs)
    if n == 0 or sx == 0:
        return Estimate(math.nan, math.nan, 0, 1.0)
    r = math.fsum(y for y, _ in pairs) / sx
    if n == 1:
        return Estimate(r, math.nan, 1, 1.0)
    resid = math.fsum((y - r * x) ** 2 for y, x in pairs)
    return Estimate(r, math.sqrt(resid / (n * (n - 1))) / (sx / n), n, float(n - 1))


def quantile_estimate(values: Sequence[float], q: float) -> Estimate:
    """Nearest-rank quantile ``q`` with its order-statistic standard error."""
    n = len(values)
    if n == 0:
        return Estimate(math.nan, math.nan, 0)
    xs = sorted(values)
    value = xs[max(1, math.ceil(q * n)) - 1]
    half = _Z95 * math.sqrt(n * q * (1 - q))
    lo = xs[min(n - 1, max(0, math.floor(n * q - half) - 1))]
    hi = xs[min(n - 1, max(0, math.ceil(n * q + half) - 1))]
    return Estimate(float(value), (hi - lo) / (2 * _Z95), n)


def difference(a: Estimate, b: Estimate) -> Difference:
    """``b − a`` (candidate minus baseline) with Welch-Satterthwaite df."""
    va, vb = a.se**2, b.se**2
    se = math.sqrt(va + vb)
    denom = va**2 / a.df + vb**2 / b.df if a.df > 0 and b.df > 0 else 0.0
    df = math.nan if math.isnan(se) else (va + vb) ** 2 / denom if denom > 0 else INF
    if a.value == 0 or math.isnan(a.value):
        rel, rel_se = math.nan, math.nan
    else:
        rel = b.value / a.value - 1
        rel_se = math.sqrt(vb / a.value**2 + b.value**2 * va / a.value**4)
    return Difference(b.value - a.value, se, df, rel, rel_se)
