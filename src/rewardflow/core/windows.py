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

Hot path: :meth:`WindowBook.add` runs once per final reward record and often
opens a window, so it reads a record once for all sizes and starts a new
window from the record's values; ids are hashed in one piece and aggregates are
built as dict literals. The float sums are derived from exact integer units
only when read, so they are the same whatever the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from rewardflow.core.histogram import LogHistogram
from rewardflow.core.records import id_of_joined
from rewardflow.core.rows import RewardRecord, WindowAggregate


_NEVER = 2**62  # beyond any event time (as the processor's)
_UNIT = 10**12  # reward sums are kept in exact integer units of 1e-12
_UNIT_SQ = _UNIT * _UNIT
_QUANTILES = (0.5, 0.95, 0.99)
_latency_bucket = LogHistogram().index


def window_start(ts: int, size_ms: int) -> int:
    return ts - ts % size_ms


def window_key(size_s: int, start: int, checkpoint: str, arm: str, surface: str, spec: str) -> str:
    # = stable_id("w", size_s, start, checkpoint, arm, surface, spec), without its generic per-call work
    return id_of_joined(f"w\x1f{size_s!s}\x1f{start!s}\x1f{checkpoint!s}\x1f{arm!s}\x1f{surface!s}\x1f{spec!s}\x1f")


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
    latency: LogHistogram = field(default_factory=LogHistogram, init=False)  # default accuracy (see WindowBook.add)
    # Sums in exact integer units of 1e-12 (rewards are rounded to 12 decimals): a float running sum
    # depends on the order of addition, and a rebuilt accumulator adds in another order.
    reward_units: int = 0
    reward_sq_units: int = 0

    @property
    def reward_sum(self) -> float:
        return self.reward_units / _UNIT

    @property
    def reward_sq_sum(self) -> float:
        return self.reward_sq_units / _UNIT_SQ

    def to_record(self, partition: int) -> WindowAggregate:
        key = window_key(self.size_s, self.start, self.checkpoint_id, self.experiment_arm, self.surface, self.spec_version)
        p50, p95, p99 = self.latency.quantiles(_QUANTILES)
        return {
            "window_id": id_of_joined(f"{key}\x1f{partition!s}\x1f"),  # = stable_id(key, partition)
            "window_key": key,
            "window_start": self.start, "window_end": self.start + self.size_s * 1000, "window_size_s": self.size_s,
            "checkpoint_id": self.checkpoint_id, "experiment_arm": self.experiment_arm, "surface": self.surface,
            "spec_version": self.spec_version, "source_partition": partition,
            "samples": self.samples, "reward_sum": self.reward_units / _UNIT,
            "reward_sq_sum": self.reward_sq_units / _UNIT_SQ,
            "turns_with_edit": self.turns_with_edit, "turns_dissatisfied": self.turns_dissatisfied,
            "turns_followup": self.turns_followup, "turns_clarifying": self.turns_clarifying,
            "turns_broken": self.turns_broken, "tool_calls": self.tool_calls, "tool_broken": self.tool_broken,
            "tool_error": self.tool_error, "completion_tokens_sum": self.completion_tokens_sum,
            "persisted": dict(self.persisted), "checked": dict(self.checked),
            "latency_hist": dict(self.latency.counts),
            "latency_p50": p50, "latency_p95": p95, "latency_p99": p99,
        }


@dataclass(slots=True)
class WindowBook:
    """Open window accumulators of one partition, for every configured size."""

    sizes_s: list[int]
    partition: int
    closed_through: dict[int, int] = field(default_factory=dict)  # size_s -> windows ending <= this are closed
    open: dict[tuple[int, int, str, str, str, str], WindowAccumulator] = field(default_factory=dict)
    _min_closed: int | None = field(default=None, compare=False, repr=False)  # kept until close() moves one
    _next_due: int | None = field(default=None, compare=False, repr=False)  # likewise, for due()

    def min_closed_through(self) -> int:
        """The lowest ``closed_through`` over the sizes (-1 while one has none). Kept between calls:
        only :meth:`close` changes ``closed_through``."""
        m = self._min_closed
        if m is None:
            m = self._min_closed = min((self.closed_through.get(s, -1) for s in self.sizes_s), default=-1)
        return m

    def due(self, limit: int) -> bool:
        """Whether :meth:`close` of ``limit`` would close the windows of some size (moves a
        ``closed_through``). Kept between calls: only :meth:`close` changes the answer's threshold."""
        n = self._next_due
        if n is None:
            closed = self.closed_through
            # the first window start above closed_through: ct - ct % size + size (ct need not be aligned)
            n = self._next_due = min((closed[s] - closed[s] % (s * 1000) + s * 1000 if s in closed else -_NEVER
                                      for s in self.sizes_s), default=_NEVER)
        return limit >= n

    def add(self, r: RewardRecord) -> None:
        """Add a final reward record to each size's window."""
        # Each size's window gets the record's terms, read once; a new window starts from them (0 + x
        # is x: the sums are ints, the maps int counts). tests/core/test_windows.py checks this against
        # the plain definition (one record folded into one accumulator at a time).
        ts, closed, opened = r["served_ts"], self.closed_through, self.open
        ck, arm, surface, spec = r["checkpoint_id"], r["experiment_arm"], r["surface"], r["spec_version"]
        u = round(r["reward"] * _UNIT)
        uu = u * u
        edit = 1 if r["n_edits"] > 0 else 0
        dissatisfied = 1 if r["n_dissatisfied"] > 0 else 0
        followup = 1 if r["n_followups"] > 0 else 0
        clarifying = 1 if r["n_clarifying"] > 0 else 0
        calls, broken, error, tokens = r["n_tool_calls"], r["n_tool_broken"], r["n_tool_error"], r["completion_tokens"]
        any_broken = 1 if broken > 0 else 0
        bucket = _latency_bucket(r["latency_ms"])  # every accumulator's histogram has the default accuracy
        persisted, checked = r["persisted"], r["checked"]
        for size in self.sizes_s:
            size_ms = size * 1000
            start = ts - ts % size_ms
            if start + size_ms <= closed.get(size, -1):
                continue  # cannot happen under the close rule; kept defensive
            k = (size, start, ck, arm, surface, spec)
            a = opened.get(k)
            if a is None:
                a = opened[k] = WindowAccumulator(
                    size, start, ck, arm, surface, spec, 1, edit, dissatisfied, followup, clarifying, any_broken,
                    calls, broken, error, tokens, dict(persisted), dict(checked), u, uu)
                a.latency.counts[bucket] = 1
                a.latency.total = 1
                continue
            a.samples += 1
            a.reward_units += u
            a.reward_sq_units += uu
            a.turns_with_edit += edit
            a.turns_dissatisfied += dissatisfied
            a.turns_followup += followup
            a.turns_clarifying += clarifying
            a.turns_broken += any_broken
            a.tool_calls += calls
            a.tool_broken += broken
            a.tool_error += error
            a.completion_tokens_sum += tokens
            d = a.persisted
            for h, n in persisted.items():
                d[h] = d.get(h, 0) + n
            d = a.checked
            for h, n in checked.items():
                d[h] = d.get(h, 0) + n
            d = a.latency.counts
            d[bucket] = d.get(bucket, 0) + 1
            a.latency.total += 1

    def close(self, limit: int) -> list[WindowAggregate]:
        """Close every window ending at or before ``limit`` (aligned per size)."""
        out: list[WindowAggregate] = []
        closed, opened, partition = self.closed_through, self.open, self.partition
        for size in self.sizes_s:
            size_ms = size * 1000
            through = limit - limit % size_ms
            if through <= closed.get(size, -1):
                continue
            closed[size] = through
            self._min_closed = self._next_due = None
            for k in [k for k in opened if k[0] == size and k[1] + size_ms <= through]:
                out.append(opened.pop(k).to_record(partition))
        return out


_FLAGS = (("turns_with_edit", "n_edits"), ("turns_dissatisfied", "n_dissatisfied"), ("turns_followup", "n_followups"),
          ("turns_clarifying", "n_clarifying"), ("turns_broken", "n_tool_broken"))
_COUNTS = (("tool_calls", "n_tool_calls"), ("tool_broken", "n_tool_broken"), ("tool_error", "n_tool_error"))


def correction_deltas(first: RewardRecord, latest: RewardRecord, sizes_s: list[int], partition: int) -> list[WindowAggregate]:
    """The delta partials of a corrected turn, one per window size: ``latest`` minus ``first`` (the
    turn's rewards as first scored and as now corrected, same spec and served event), with ``samples``
    0 and id ``stable_id(window_key, partition, 'rev', org_id, session_id, sample_id)``. Merged with the window's partials,
    the turn counts as ``latest``; a later correction's delta replaces this one (same id). The served
    event does not change, so neither do the window, the latency or the tokens."""
    ts = first["served_ts"]
    u0, u1 = round(first["reward"] * _UNIT), round(latest["reward"] * _UNIT)
    out: list[WindowAggregate] = []
    for size in sizes_s:
        start = ts - ts % (size * 1000)
        key = window_key(size, start, first["checkpoint_id"], first["experiment_arm"], first["surface"],
                         first["spec_version"])
        row: dict[str, Any] = {
            "window_id": id_of_joined(f"{key}\x1f{partition!s}\x1frev\x1f{first['org_id']!s}\x1f"
                                      f"{first['session_id']!s}\x1f{first['sample_id']!s}\x1f"),
            "window_key": key, "window_start": start, "window_end": start + size * 1000, "window_size_s": size,
            "checkpoint_id": first["checkpoint_id"], "experiment_arm": first["experiment_arm"],
            "surface": first["surface"], "spec_version": first["spec_version"], "source_partition": partition,
            "samples": 0, "reward_sum": (u1 - u0) / _UNIT, "reward_sq_sum": (u1 * u1 - u0 * u0) / _UNIT_SQ,
            **{col: int(latest[f] > 0) - int(first[f] > 0) for col, f in _FLAGS},  # type: ignore[literal-required]
            **{col: latest[f] - first[f] for col, f in _COUNTS},  # type: ignore[literal-required]
            "completion_tokens_sum": 0,
            "persisted": _map_delta(first["persisted"], latest["persisted"]),
            "checked": _map_delta(first["checked"], latest["checked"]),
            "latency_hist": {}, "latency_p50": 0.0, "latency_p95": 0.0, "latency_p99": 0.0,
        }
        out.append(cast(WindowAggregate, row))
    return out


def _map_delta(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    return {h: b.get(h, 0) - a.get(h, 0) for h in sorted({*a, *b}) if b.get(h, 0) != a.get(h, 0)}


def window_from_obj(w: dict[str, Any]) -> WindowAggregate:
    """A window record as stored in the state, with its int map keys restored (JSON made them str)."""
    maps = {k: {int(h): v for h, v in w[k].items()} for k in ("persisted", "checked", "latency_hist")}
    return cast(WindowAggregate, {**w, **maps})
