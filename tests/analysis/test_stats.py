"""Estimators and intervals: known quantiles, and coverage in seeded simulations."""

from __future__ import annotations

import math
import random

import pytest

from rewardflow.analysis.stats import critical, difference, mean_estimate, quantile_estimate, ratio_estimate
from rewardflow.analysis.tdist import INF, t_cdf, t_quantile


@pytest.mark.parametrize(("df", "expected"), [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706),
                                              (10, 2.2281), (30, 2.0423), (INF, 1.95996)])
def test_t_quantile_matches_tables(df: float, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=2e-3)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=2e-3)


@pytest.mark.parametrize("df", [1.0, 1.7, 2.0, 3.0, 7.3, 40.0])
def test_t_cdf_inverts_t_quantile(df: float) -> None:
    for p in (0.001, 0.05, 0.5, 0.9, 0.995):
        assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_empty_and_single_samples_give_nan() -> None:
    assert math.isnan(mean_estimate([]).value)
    assert math.isnan(ratio_estimate([], []).value)
    assert math.isnan(quantile_estimate([], 0.5).value)
    lo, hi = difference(mean_estimate([1.0]), mean_estimate([2.0])).interval(0.95)
    assert math.isnan(lo) and math.isnan(hi)


def test_ratio_is_pooled_over_units() -> None:
    est = ratio_estimate([1, 0, 3], [2, 0, 4])  # the unit with x = 0 carries nothing
    assert est.value == pytest.approx(4 / 6) and est.n == 2


def _coverage(trial: object, reps: int) -> float:
    return sum(bool(trial(i)) for i in range(reps)) / reps  # type: ignore[operator]


def test_proportion_difference_ci_covers_the_truth() -> None:
    rng = random.Random(1)
    pa, pb, n = 0.30, 0.36, 400

    def trial(_: int) -> bool:
        a = [int(rng.random() < pa) for _ in range(n)]
        b = [int(rng.random() < pb) for _ in range(n)]
        lo, hi = difference(ratio_estimate(a, [1] * n), ratio_estimate(b, [1] * n)).interval(0.95)
        return lo <= pb - pa <= hi

    assert 0.91 <= _coverage(trial, 400) <= 0.985


def test_welch_ci_covers_the_truth_with_small_unequal_samples() -> None:
    rng = random.Random(2)

    def trial(_: int) -> bool:
        a = [rng.gauss(0.0, 1.0) for _ in range(6)]
        b = [rng.gauss(0.5, 3.0) for _ in range(9)]
        lo, hi = difference(mean_estimate(a), mean_estimate(b)).interval(0.95)
        return lo <= 0.5 <= hi

    assert 0.92 <= _coverage(trial, 600) <= 0.98


def test_p95_difference_ci_covers_the_truth() -> None:
    rng = random.Random(3)
    z95 = 1.6448536269514722
    true_a, true_b = 1000 * math.exp(0.6 * z95), 900 * math.exp(0.6 * z95)

    def trial(_: int) -> bool:
        a = [1000 * math.exp(0.6 * rng.gauss(0, 1)) for _ in range(1500)]
        b = [900 * math.exp(0.6 * rng.gauss(0, 1)) for _ in range(1500)]
        lo, hi = difference(quantile_estimate(a, 0.95), quantile_estimate(b, 0.95)).interval(0.95)
        return lo <= true_b - true_a <= hi

    assert 0.90 <= _coverage(trial, 250) <= 0.99


def test_relative_ci_covers_the_truth() -> None:
    rng = random.Random(4)

    def trial(_: int) -> bool:
        a = [rng.expovariate(1 / 10) for _ in range(300)]
        b = [rng.expovariate(1 / 11) for _ in range(300)]
        lo, hi = difference(mean_estimate(a), mean_estimate(b)).rel_interval(0.95)
        return lo <= 0.1 <= hi

    assert 0.91 <= _coverage(trial, 400) <= 0.985


def test_critical_rejects_bad_confidence() -> None:
    with pytest.raises(ValueError):
        critical(1.0)
