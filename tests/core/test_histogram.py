"""LogHistogram: quantiles within the relative accuracy of exact nearest-rank quantiles; exact merging."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardflow.core.histogram import LogHistogram

QS = (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)


def exact_quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile: the ceil(q·n)-th smallest value (at least the first)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def assert_within(hist: LogHistogram, values: list[float], q: float) -> None:
    exact = exact_quantile(values, q)
    got = hist.quantile(q)
    # float slack only: the bound itself is the documented accuracy
    assert abs(got - exact) <= hist.accuracy * exact * (1 + 1e-9), (q, got, exact)


@pytest.mark.parametrize("accuracy", [0.01, 0.05])
def test_quantiles_of_random_latencies_are_within_accuracy(accuracy: float) -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(6.5, 1.2) + 1 for _ in range(5000)] + [rng.uniform(1, 60_000) for _ in range(500)]
    hist = LogHistogram(accuracy)
    hist.extend(values)
    assert hist.total == len(values)
    for q in QS:
        assert_within(hist, values, q)


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.floats(min_value=1.0, max_value=1e9, allow_nan=False), min_size=1, max_size=200),
    q=st.floats(min_value=0.0, max_value=1.0),
)
def test_any_quantile_of_any_data_is_within_accuracy(values: list[float], q: float) -> None:
    hist = LogHistogram()
    hist.extend(values)
    assert_within(hist, values, q)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=10**7), min_size=1, max_size=100))
def test_integer_latencies_including_bucket_edges(values: list[int]) -> None:
    hist = LogHistogram()
    hist.extend(values)
    for q in QS:
        assert_within(hist, [float(v) for v in values], q)


def test_values_at_or_below_one_share_bucket_zero() -> None:
    hist = LogHistogram()
    hist.extend([0, 0.5, 1.0])
    assert hist.counts == {0: 3}
    assert hist.quantile(1.0) == 1.0


def test_empty_histogram_quantile_is_zero_and_bad_arguments_are_refused() -> None:
    assert LogHistogram().quantile(0.5) == 0.0
    with pytest.raises(ValueError):
        LogHistogram().quantile(1.5)
    with pytest.raises(ValueError):
        LogHistogram(accuracy=0.0)
    with pytest.raises(ValueError):
        LogHistogram(accuracy=1.0)


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.lists(st.floats(min_value=0.0, max_value=1e7, allow_nan=False), max_size=50), min_size=1, max_size=6),
    as_mapping=st.booleans(),
)
def test_merging_partials_equals_one_histogram_over_all_values(parts: list[list[float]], as_mapping: bool) -> None:
    whole = LogHistogram()
    for p in parts:
        whole.extend(p)
    merged = LogHistogram()
    for p in parts:
        partial = LogHistogram()
        partial.extend(p)
        # partials travel as {index: count} dicts (window records); both forms must merge
        merged.merge(dict(partial.counts) if as_mapping else partial)
    assert merged.counts == whole.counts
    assert merged.total == whole.total
    for q in QS:
        assert merged.quantile(q) == whole.quantile(q)


def test_histogram_rebuilt_from_string_keyed_counts_is_the_same() -> None:
    """Window partials come back from JSON with string keys; the constructor normalises them."""
    hist = LogHistogram()
    hist.extend([3, 30, 300, 3000, 3000])
    again = LogHistogram(counts={str(k): v for k, v in hist.counts.items()})  # type: ignore[misc]
    assert again.counts == hist.counts and again.total == 5
    assert again.quantile(0.5) == hist.quantile(0.5)


def nearest_rank_bucket_value(hist: LogHistogram, q: float) -> float:
    """The documented definition, bucket by bucket: the value of the bucket holding rank ceil(q·total)."""
    if hist.total == 0:
        return 0.0
    rank, seen = max(1, math.ceil(q * hist.total)), 0
    for i in sorted(hist.counts):
        seen += hist.counts[i]
        if seen >= rank:
            return hist.value_of(i)
    return hist.value_of(max(hist.counts))  # only with counts not summing to total (negative counts)


@settings(max_examples=100, deadline=None)
@given(
    counts=st.dictionaries(st.integers(-5, 400), st.integers(-3, 50), max_size=8),
    qs=st.lists(st.floats(0.0, 1.0), max_size=6),
    accuracy=st.sampled_from([0.01, 0.05]),
)
def test_quantiles_at_once_equal_each_quantile_by_definition(counts: dict[int, int], qs: list[float], accuracy: float) -> None:
    hist = LogHistogram(accuracy, counts=counts)
    want = [nearest_rank_bucket_value(hist, q) for q in qs]
    assert hist.quantiles(qs) == want  # exact: the same buckets, the same float values
    assert [hist.quantile(q) for q in qs] == want


def test_quantiles_reject_an_out_of_range_q_even_when_empty_or_single_bucket() -> None:
    single = LogHistogram(counts={7: 3})
    for hist in (LogHistogram(), single):
        with pytest.raises(ValueError):
            hist.quantiles((0.5, 1.5))
    assert single.quantiles((0.0, 0.5, 1.0)) == [single.value_of(7)] * 3
    assert LogHistogram().quantiles((0.0, 1.0)) == [0.0, 0.0]


def test_default_accuracy_constants_equal_computed_ones() -> None:
    fast, slow = LogHistogram(), LogHistogram(0.01 + 0.0)
    ref_gamma = (1 + 0.01) / (1 - 0.01)
    assert fast.value_of(37) == 2.0 * ref_gamma**37 / (ref_gamma + 1.0) == slow.value_of(37)
    assert fast.index(12345.0) == math.ceil(math.log(12345.0) / math.log(ref_gamma))
