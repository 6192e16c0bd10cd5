"""Event-time tumbling windows per checkpoint × arm × surface × spec version.

A turn belongs to the window containing its ``served_ts``. Each partition keeps
in-memory accumulators (:class:`WindowBook`) fed by final reward records; they
are *derived* state, rebuilt after a restart from the tombstones of finalised
turns, so they never double count a turn. A window closes on a partition once
the watermark is past ``end + last horizon + grace`` and no open served turn
of that partition is older than ``end``; its partial is then emitted once,
with id ``stable_id(window_key, partition)``. Merging the partials of a
``window_key`` (sums and histogram counts) gives the exact whole window.

Contract: pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rewardflow.core.histogram import LogHistogram
from rewardflow.core.records import RewardRecord, WindowAggregate, stable_id


_UNIT = 10**12  # reward sums are kept in exact integer units of 1e-12
_UNIT_SQ = _UNIT * _UNIT


def window_start(ts: int, size_ms: int) -> int:
    return ts - ts % size_ms


def window_key(size_s: int, start: int, checkpoint: str, arm: str, surface: str, spec: str) -> str:
    return stable_id("w", size_s, start, checkpoint, arm, surface, spec)


@dataclass(slots=True)
class WindowAccumulator:
    """Sums over the reward records of one window on one partition."""

    size_s: int
    start: int
    checkpoint_id: str
    experiment_arm: str
    surface: str
    spec_version: str
    samples: int = 0
    reward_sum: float = 0.0
    reward_sq_sum: float = 0.0
    turns_with_edit: int = 0
    turns_dissatisfied: int = 0
    turns_followup: int = 0
    turns_clarifying: int = 0
    turns_broken: int = 0
    tool_calls: int = 0
    tool_broken: int = 0
    tool_error: int = 0
    completion_tokens_sum: int = 0
    persisted: dict[int, int] = field(default_factory=dict)
    checked: dict[int, int] = field(default_factory=dict)
    latency: LogHistogram = field(default_factory=LogHistogram)
    # Sums in exact integer units of 1e-12 (rewards are rounded to 12 decimals): a float running sum
    # depends on the order of addition, and a rebuilt accumulator adds in another order.
    _units: list[int] = field(default_factory=lambda: [0, 0])

    def add(self, r: RewardRecord) -> None:
        self.samples += 1
        u = round(r["reward"] * _UNIT)
        self._units[0] += u
        self._units[1] += u * u
        self.reward_sum = self._units[0] / _UNIT
        self.reward_sq_sum = self._units[1] / _UNIT_SQ
        self.turns_with_edit += r["n_edits"] > 0
        self.turns_dissatisfied += r["n_dissatisfied"] > 0
        self.turns_followup += r["n_followups"] > 0
        self.turns_clarifying += r["n_clarifying"] > 0
        self.turns_broken += r["n_tool_broken"] > 0
        self.tool_calls += r["n_tool_calls"]
        self.tool_broken += r["n_tool_broken"]
        self.tool_error += r["n_tool_error"]
        self.completion_tokens_sum += r["completion_tokens"]
        for h, n in r["persisted"].items():
            self.persisted[h] = self.persisted.get(h, 0) + n
        for h, n in r["checked"].items():
            self.checked[h] = self.checked.get(h, 0) + n
        self.latency.add(r["latency_ms"])

    def to_record(self, partition: int) -> WindowAggregate:
        key = window_key(self.size_s, self.start, self.checkpoint_id, self.experiment_arm, self.surface, self.spec_version)
        return WindowAggregate(
            window_id=stable_id(key, partition), window_key=key,
            window_start=self.start, window_end=self.start + self.size_s * 1000, window_size_s=self.size_s,
            checkpoint_id=self.checkpoint_id, experiment_arm=self.experiment_arm, surface=self.surface,
            spec_version=self.spec_version, source_partition=partition,
            samples=self.samples, reward_sum=self.reward_sum, reward_sq_sum=self.reward_sq_sum,
            turns_with_edit=self.turns_with_edit, turns_dissatisfied=self.turns_dissatisfied,
            turns_followup=self.turns_followup, turns_clarifying=self.turns_clarifying,
            turns_broken=self.turns_broken, tool_calls=self.tool_calls, tool_broken=self.tool_broken,
            tool_error=self.tool_error, completion_tokens_sum=self.completion_tokens_sum,
            persisted=dict(self.persisted), checked=dict(self.checked), latency_hist=dict(self.latency.counts),
            latency_p50=self.latency.quantile(0.5), latency_p95=self.latency.quantile(0.95),
            latency_p99=self.latency.quantile(0.99),
        )


@dataclass(slots=True)
class WindowBook:
    """Open window accumulators of one partition, for every configured size."""

    sizes_s: list[int]
    partition: int
    closed_through: dict[int, int] = field(default_factory=dict)  # size_s -> windows ending <= this are closed
    open: dict[tuple[int, int, str, str, str, str], WindowAccumulator] = field(default_factory=dict)

    def min_closed_through(self) -> int:
        return min((self.closed_through.get(s, -1) for s in self.sizes_s), default=-1)

    def add(self, r: RewardRecord) -> None:
        """Add a final reward record to each size's window."""
        for size in self.sizes_s:
            start = window_start(r["served_ts"], size * 1000)
            if start + size * 1000 <= self.closed_through.get(size, -1):
                continue  # cannot happen under the close rule; kept defensive
            k = (size, start, r["checkpoint_id"], r["experiment_arm"], r["surface"], r["spec_version"])
            acc = self.open.get(k)
            if acc is None:
                acc = self.open[k] = WindowAccumulator(size, start, *k[2:])
            acc.add(r)

    def close(self, limit: int) -> list[WindowAggregate]:
        """Close every window ending at or before ``limit`` (aligned per size)."""
        out: list[WindowAggregate] = []
        for size in self.sizes_s:
            through = window_start(limit, size * 1000)
            if through <= self.closed_through.get(size, -1):
                continue
            self.closed_through[size] = through
            for k in [k for k in self.open if k[0] == size and k[1] + size * 1000 <= through]:
                out.append(self.open.pop(k).to_record(self.partition))
        return out
