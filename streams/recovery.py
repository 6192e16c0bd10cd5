"""Watching Faust's changelog recovery: how long each takeover restores, and when one is stuck.

After a rebalance the worker restores each newly assigned partition's join state from the
changelog before it processes records. Faust can stall there: it waits for changelog events that
never come, logs ``No event received for active tp … since recovery start`` every few seconds,
and only a later rebalance moves it on. :class:`RecoveryWatch` sees that from outside, from
snapshots of Faust's own recovery bookkeeping (what :func:`snapshot` reads): a partition with
records left to restore that has received nothing for ``stall_s`` seconds (since recovery started,
or since its last event) is *stalled*. The worker first seeks it back, in place, to where Faust's
recovery stands (:meth:`RecoveryWatch.nudge`): changelog records of an interrupted recovery,
delivered after the new recovery's seek, can move Faust's read offset past the records it fetches
again, which its fetch loop then drops as already read. A partition still stalled one timeout
after that makes the worker leave the group and rejoin it: it exits with
:data:`EXIT_RECOVERY_STALLED` after a clean stop (offsets committed), and its supervisor
(``rewardflow run``, or any process manager) starts it again; the group gives its partitions back
to a fresh member, which restores them anew.

The same can happen after a recovery: a partition is assigned and has records on the raw topic,
yet the worker never processes them. Two ways are known: a rebalance that interrupts a recovery
can leave the partition out of the set Faust fetches; and records of the previous consumer
generation, delivered after the rebalance's seek, move Faust's read offset past the records
fetched again, which its fetch loop then drops as already read (only a later record would show
the hole to the gap guard). A third, with the read offset and the fetch set in order: every
record up to the end of the partition had been processed and acked, yet the group's committed
offset hardly moved, because each offset was acked twice and Faust commits the first run of
consecutive acked offsets (:func:`~rewardflow_streams.commits.install_unique_acks` answers it).
:func:`stalled_processing` names such partitions from the committed and end offsets and the time
of each partition's last processed record. The worker first puts the partition back in the fetch
set and seeks it back to the group's committed offset, which also resets Faust's read offset:
what is not committed is delivered again, so records processed and never committed get their
commit. :func:`fetch_state` logs what Faust held towards its next commit and what the Kafka client
held (:func:`~rewardflow_streams.clientstate.client_state`); only a partition still stuck one
timeout later makes it leave.

A partition can also be assigned with nothing to restore from: Faust's group leader hands each
raw partition's changelog partition to its owner only when the leader's consumer metadata holds the
changelog topic. :func:`unrestored` names the raw partitions of an assignment that came without
their changelog partition; the worker processes none of their records and leaves the group at once
(the same clean stop and exit), so that a later assignment gives their state with them.

Contract: :meth:`RecoveryWatch.observe` is pure given its inputs and returns what changed: a
finished recovery's seconds, the partitions still restoring, and the stalled ones. It never
raises on odd snapshots (missing offsets count as nothing received). :func:`stalled_processing`
is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rewardflow_streams.clientstate import client_state

EXIT_RECOVERY_STALLED = 75  # EX_TEMPFAIL: the supervisor starts the worker again


def unrestored(assigned: Iterable[Any], raw_topic: str, changelog_topic: str) -> set[int]:
    """The raw partitions in ``assigned`` (topic partitions) whose changelog partition is not in it. Pure."""
    tps = list(assigned)
    return ({tp.partition for tp in tps if tp.topic == raw_topic}
            - {tp.partition for tp in tps if tp.topic == changelog_topic})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Faust's recovery state at one moment (monotonic seconds)."""

    now: float
    in_recovery: bool
    started_at: float | None
    remaining: Mapping[Any, int]  # changelog partition -> records left to restore
    received_at: Mapping[Any, float]  # changelog partition -> when its last event arrived
    ended_at: float | None = None  # when Faust last ended a recovery


@dataclass(frozen=True, slots=True)
class Observation:
    finished_s: float | None  # a recovery ended since the last snapshot: how long it took
    restoring: dict[Any, int]  # partitions with records left
    stalled: list[Any]  # partitions with records left that received nothing for stall_s


@dataclass
class RecoveryWatch:
    stall_s: float
    _started: float | None = field(default=None, init=False)
    _last_ended: float | None = field(default=None, init=False)
    _nudged: dict[Any, float] = field(default_factory=dict, init=False)  # partition -> when it was sought back

    def nudge(self, tps: list[Any], now: float) -> None:
        """``tps`` were sought back at ``now``: each is judged again from then, and :meth:`nudged` says so
        until the recovery ends."""
        self._nudged.update(dict.fromkeys(tps, now))

    def nudged(self, tp: Any) -> bool:
        return tp in self._nudged

    def observe(self, snap: Snapshot) -> Observation:
        """A recovery is timed by Faust's own start and end stamps when it has them (so one shorter
        than the interval between snapshots is counted too), else from the snapshots."""
        finished = None
        if snap.in_recovery and self._started is None:
            self._started = snap.started_at if snap.started_at is not None else snap.now
        elif not snap.in_recovery:
            new_end = snap.ended_at is not None and snap.ended_at != self._last_ended
            if new_end and snap.started_at is not None and snap.ended_at is not None and snap.ended_at >= snap.started_at:
                finished = snap.ended_at - snap.started_at
            elif self._started is not None:
                finished = snap.now - self._started
            self._started, self._last_ended = None, snap.ended_at
        if not snap.in_recovery:
            self._nudged.clear()
            return Observation(finished, {}, [])
        restoring = {tp: n for tp, n in snap.remaining.items() if n > 0}
        since = self._started if self._started is not None else snap.now
        stalled = [tp for tp in restoring
                   if snap.now - max(since, snap.received_at.get(tp, since), self._nudged.get(tp, since)) >= self.stall_s]
        return Observation(finished, restoring, sorted(stalled, key=str))


def snapshot(recovery: Any, now: float) -> Snapshot:
    """What :class:`RecoveryWatch` needs, read from faust-streaming's ``app.tables.recovery``
    (its ``in_recovery``, ``active_remaining()``, and the private ``_recovery_started_at``,
    ``_recovery_ended_at`` and ``_active_events_received_at`` it keeps for its own logs)."""
    in_recovery = bool(getattr(recovery, "in_recovery", False))
    remaining = dict(recovery.active_remaining()) if in_recovery else {}
    return Snapshot(now, in_recovery, getattr(recovery, "_recovery_started_at", None), remaining,
                    dict(getattr(recovery, "_active_events_received_at", {}) or {}),
                    getattr(recovery, "_recovery_ended_at", None))


def stalled_processing(now: float, since: float, progress: Mapping[int, float], behind: Mapping[int, int],
                       stall_s: float) -> list[int]:
    """Partitions with records behind (end offset past the committed one) and no record processed
    for ``stall_s`` seconds: since ``since`` (the assignment, or the end of its recovery) or since
    their last processed record (``progress``), whichever is later."""
    return sorted(p for p, n in behind.items()
                  if n > 0 and now - max(since, progress.get(p, since)) >= stall_s)


def fetch_state(consumer: Any, tp: Any, position: int | None = None) -> str:
    """What Faust's consumer holds for ``tp``, for a log line: its read offset, whether it is in the
    fetch set (or held back as buffered), and the fetch position when given (private fields of
    faust-streaming's ``Consumer``; "?" where one is missing)."""
    read = getattr(consumer, "_read_offset", {}).get(tp, "?")
    active = getattr(consumer, "_active_partitions", None)
    paused: Any = getattr(consumer, "_paused_partitions", set())
    buffered: Any = getattr(consumer, "_buffered_partitions", set())
    fetching = "?" if active is None else ("yes" if tp in active else "no")
    flags = (", paused" if tp in paused else "") + (", buffered" if tp in buffered else "")
    at = "" if position is None else f", position {position}"
    return f"read offset {read}, fetching {fetching}{flags}{at}{_acks(consumer, tp)}{client_state(consumer, tp)}"


def _acks(consumer: Any, tp: Any) -> str:
    """``, acked 12 (343..354), last commit 341, gaps 0``: what Faust holds towards its next commit of ``tp``
    (a commit takes the acked offsets consecutive from the last commit, gaps filled; '' when unreadable)."""
    try:
        acked = sorted(consumer._acked[tp])
        span = f" ({acked[0]}..{acked[-1]})" if acked else ""
        return (f", acked {len(acked)}{span}, last commit {consumer._committed_offset.get(tp)}, "
                f"gaps {len(consumer._gap.get(tp) or ())}")
    except Exception:  # noqa: BLE001 - another faust-streaming: say nothing
        return ""
