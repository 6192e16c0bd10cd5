"""A mergeable log-bucket histogram for latency quantiles.

Values ``x > 0`` fall in bucket ``ceil(log(x) / log(gamma))`` with
``gamma = (1 + a) / (1 - a)``; the bucket's representative value is within a
relative error ``a`` (default 1 %) of every value in it, so any quantile read
from the histogram is within ``a`` of a value of the exact quantile's rank.
Values ``<= 1`` share bucket 0. Merging is adding counts, so per-partition
partials combine exactly.

Contract: pure; :meth:`quantile` of an empty histogram is ``0.0``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

DEFAULT_ACCURACY = 0.01


def _gammas(accuracy: float) -> tuple[float, float]:
    """``gamma`` and ``log(gamma)`` of an accuracy."""
    if not 0 < accuracy < 1:
        raise ValueError("accuracy must be in (0, 1)")
    gamma = (1 + accuracy) / (1 - accuracy)
    return gamma, math.log(gamma)


_DEFAULT_GAMMA, _DEFAULT_LOG_GAMMA = _gammas(DEFAULT_ACCURACY)


class LogHistogram:
    """Bucket counts keyed by integer index."""

    __slots__ = ("accuracy", "_gamma", "_log_gamma", "counts", "total")

    def __init__(self, accuracy: float = DEFAULT_ACCURACY, counts: Mapping[int, int] | None = None) -> None:
        if accuracy == DEFAULT_ACCURACY:  # the common case (one per open window): constants computed once
            self._gamma, self._log_gamma = _DEFAULT_GAMMA, _DEFAULT_LOG_GAMMA
        else:
            self._gamma, self._log_gamma = _gammas(accuracy)
        self.accuracy = accuracy
        if counts:
            self.counts: dict[int, int] = {int(k): int(v) for k, v in counts.items() if v}
            self.total = sum(self.counts.values())
        else:
            self.counts = {}
            self.total = 0

    def index(self, value: float) -> int:
        return 0 if value <= 1.0 else math.ceil(math.log(value) / self._log_gamma)

    def value_of(self, index: int) -> float:
        """Representative value of a bucket (its midpoint in relative terms)."""
        if index <= 0:
            return 1.0
        return 2.0 * self._gamma**index / (self._gamma + 1.0)

    def add(self, value: float, count: int = 1) -> None:
        i = self.index(value)
        self.counts[i] = self.counts.get(i, 0) + count
        self.total += count

    def extend(self, values: Iterable[float]) -> None:
        for v in values:
            self.add(v)

    def merge(self, other: LogHistogram | Mapping[int, int]) -> None:
        counts = other.counts if isinstance(other, LogHistogram) else other
        for i, c in counts.items():
            self.counts[int(i)] = self.counts.get(int(i), 0) + int(c)
            self.total += int(c)

    def quantile(self, q: float) -> float:
        """Value at quantile ``q`` in [0, 1], nearest-rank definition."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """:meth:`quantile` of each of ``qs``, sorting the buckets once."""
        for q in qs:
            if not 0.0 <= q <= 1.0:
                raise ValueError("q must be in [0, 1]")
        counts, total = self.counts, self.total
        if total == 0:
            return [0.0] * len(qs)
        if len(counts) <= 1:  # the one bucket, reached or not (none: max() raises, as the scan's fallback did)
            return [self.value_of(max(counts))] * len(qs)
        # One walk over the sorted buckets: for a rank not below the last one, no bucket before the
        # last one found can be the first to reach it. A lower rank restarts the walk.
        keys = sorted(counts)
        last = len(keys) - 1
        pos, seen, prev_rank = 0, counts[keys[0]], 0  # seen: count through keys[pos]
        out: list[float] = []
        for q in qs:
            rank = max(1, math.ceil(q * total))
            if rank < prev_rank:
                pos, seen = 0, counts[keys[0]]
            prev_rank = rank
            while seen < rank and pos < last:
                pos += 1
                seen += counts[keys[pos]]
            out.append(self.value_of(keys[pos]))  # not reached (rank > total): max(counts), the last key
        return out
