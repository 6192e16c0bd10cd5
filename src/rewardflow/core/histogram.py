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
from collections.abc import Iterable, Mapping

DEFAULT_ACCURACY = 0.01


class LogHistogram:
    """Bucket counts keyed by integer index."""

    __slots__ = ("accuracy", "_gamma", "_log_gamma", "counts", "total")

    def __init__(self, accuracy: float = DEFAULT_ACCURACY, counts: Mapping[int, int] | None = None) -> None:
        if not 0 < accuracy < 1:
            raise ValueError("accuracy must be in (0, 1)")
        self.accuracy = accuracy
        self._gamma = (1 + accuracy) / (1 - accuracy)
        self._log_gamma = math.log(self._gamma)
        self.counts: dict[int, int] = {int(k): int(v) for k, v in (counts or {}).items() if v}
        self.total = sum(self.counts.values())

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
        if not 0.0 <= q <= 1.0:
            raise ValueError("q must be in [0, 1]")
        if self.total == 0:
            return 0.0
        rank = max(1, math.ceil(q * self.total))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return self.value_of(i)
        return self.value_of(max(self.counts))  # pragma: no cover - rank <= total
