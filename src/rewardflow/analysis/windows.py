"""Per-checkpoint time series from :class:`~rewardflow.core.rows.WindowAggregate` rows.

Window partials are deduplicated by ``window_id`` (redeliveries are equal),
merged by ``window_key`` (partials of one window from several source
partitions) and then across arms and surfaces of the same checkpoint and
window start. Every field is a sum or a histogram, so merging is exact; the
p95 latency is read from the merged log histogram.

Contract: pure. Rows may be a ``pyarrow.Table`` or mappings; map columns may
be dicts (int or str keys) or lists of pairs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rewardflow.analysis.rows import epoch_ms, int_map, to_dicts
from rewardflow.core.histogram import LogHistogram


@dataclass(slots=True)
class WindowPoint:
    """One merged window of one checkpoint."""

    checkpoint_id: str
    window_start: int
    window_end: int
    samples: int = 0
    reward_sum: float = 0.0
    turns_dissatisfied: int = 0
    persisted: int = 0  # at the final horizon (the largest horizon checked in any row)
    checked: int = 0
    latency: LogHistogram = field(default_factory=LogHistogram)

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.samples if self.samples else None

    @property
    def persistence_rate(self) -> float | None:
        return self.persisted / self.checked if self.checked else None

    @property
    def dissatisfied_rate(self) -> float | None:
        return self.turns_dissatisfied / self.samples if self.samples else None

    @property
    def latency_p95(self) -> float | None:
        return self.latency.quantile(0.95) if self.latency.total else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id, "window_start": self.window_start, "window_end": self.window_end,
            "samples": self.samples, "mean_reward": self.mean_reward, "persistence_rate": self.persistence_rate,
            "dissatisfied_rate": self.dissatisfied_rate, "latency_p95": self.latency_p95,
        }


SERIES = ("mean_reward", "persistence_rate", "dissatisfied_rate", "latency_p95")


def merge_windows(rows: Any, *, checkpoints: Iterable[str] | None = None, spec_version: str | None = None,
                  size_s: int | None = None) -> dict[str, list[WindowPoint]]:
    """Series per checkpoint, sorted by window start.

    ``size_s=None`` uses the smallest window size present; ``spec_version``
    and ``checkpoints`` filter (``None``: keep all).
    """
    data = to_dicts(rows)
    wanted = set(checkpoints) if checkpoints is not None else None
    if spec_version is not None:
        data = [r for r in data if r["spec_version"] == spec_version]
    if wanted is not None:
        data = [r for r in data if r["checkpoint_id"] in wanted]
    if not data:
        return {c: [] for c in sorted(wanted or ())}
    size = size_s if size_s is not None else min(int(r["window_size_s"]) for r in data)
    unique = {r["window_id"]: r for r in data if int(r["window_size_s"]) == size}
    h = max((max(int_map(r["checked"]), default=0) for r in unique.values()), default=0)  # final horizon
    points: dict[tuple[str, int], WindowPoint] = {}
    for _, r in sorted(unique.items()):  # a fixed order: float sums do not depend on arrival order
        key = (str(r["checkpoint_id"]), epoch_ms(r["window_start"]))
        p = points.get(key)
        if p is None:
            p = points[key] = WindowPoint(key[0], key[1], epoch_ms(r["window_end"]))
        p.samples += int(r["samples"])
        p.reward_sum += float(r["reward_sum"])
        p.turns_dissatisfied += int(r["turns_dissatisfied"])
        p.persisted += int_map(r["persisted"]).get(h, 0)
        p.checked += int_map(r["checked"]).get(h, 0)
        p.latency.merge(int_map(r["latency_hist"]))
    out: dict[str, list[WindowPoint]] = {c: [] for c in sorted(wanted or ())}
    for (ck, _), p in sorted(points.items()):
        out.setdefault(ck, []).append(p)
    return out
