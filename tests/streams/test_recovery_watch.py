"""RecoveryWatch: how long a changelog recovery took, what is restoring, and when it is stuck. Pure."""

from __future__ import annotations

from typing import NamedTuple

from rewardflow_streams.recovery import RecoveryWatch, Snapshot, unrestored


class TP(NamedTuple):
    topic: str
    partition: int


def snap(now: float, *, in_recovery: bool = True, started: float | None = 100.0, remaining: dict[str, int] | None = None,
         received: dict[str, float] | None = None) -> Snapshot:
    return Snapshot(now, in_recovery, started, remaining or {}, received or {})


def test_a_recovery_is_timed_from_faust_start_to_its_end() -> None:
    w = RecoveryWatch(stall_s=30)
    assert w.observe(snap(90, in_recovery=False)).finished_s is None
    first = w.observe(snap(101, remaining={"c-0": 5, "c-1": 0}))
    assert first.finished_s is None and first.restoring == {"c-0": 5} and first.stalled == []
    done = w.observe(snap(104.5, in_recovery=False))
    assert done.finished_s == 4.5 and done.restoring == {} and done.stalled == []
    w.observe(snap(200, started=None, remaining={"c-0": 1}))  # no start time from Faust: from the first sight
    assert w.observe(snap(203, in_recovery=False)).finished_s == 3


def test_a_partition_that_receives_nothing_with_records_left_is_stalled() -> None:
    w = RecoveryWatch(stall_s=10)
    assert w.observe(snap(105, remaining={"c-0": 7, "c-1": 3}, received={"c-1": 104})).stalled == []
    seen = w.observe(snap(111, remaining={"c-0": 7, "c-1": 3}, received={"c-1": 104}))
    assert seen.stalled == ["c-0"]  # nothing since the start 11 s ago; c-1 had an event 7 s ago
    seen = w.observe(snap(115, remaining={"c-0": 7, "c-1": 3}, received={"c-1": 104}))
    assert seen.stalled == ["c-0", "c-1"]


def test_a_partition_with_nothing_left_is_never_stalled_and_progress_resets_the_clock() -> None:
    w = RecoveryWatch(stall_s=10)
    w.observe(snap(100, remaining={"c-0": 0, "c-1": 9}))
    assert w.observe(snap(130, remaining={"c-0": 0, "c-1": 2}, received={"c-1": 125})).stalled == []
    assert w.observe(snap(136, remaining={"c-0": 0, "c-1": 2}, received={"c-1": 125})).stalled == ["c-1"]


def test_a_recovery_shorter_than_the_snapshot_interval_is_timed_by_faust_stamps() -> None:
    w = RecoveryWatch(stall_s=10)
    idle = Snapshot(50, False, None, {}, {}, None)
    assert w.observe(idle).finished_s is None
    quick = Snapshot(60, False, 58.0, {}, {}, 58.25)  # started and ended between two snapshots
    assert w.observe(quick).finished_s == 0.25
    assert w.observe(Snapshot(61, False, 58.0, {}, {}, 58.25)).finished_s is None  # counted once


def test_a_partition_with_records_behind_and_nothing_processed_is_stalled() -> None:
    from rewardflow_streams.recovery import stalled_processing

    progress = {0: 130.0, 1: 105.0}
    behind = {0: 12, 1: 3, 2: 0, 3: 7}
    # since the assignment (100): p3 never processed anything, p1 not since 105; p2 has nothing to do
    assert stalled_processing(140, 100, progress, behind, stall_s=30) == [1, 3]
    assert stalled_processing(129, 100, progress, behind, stall_s=30) == []
    assert stalled_processing(140, 120, progress, behind, stall_s=30) == []  # a recent assignment resets the clock


def test_a_partition_sought_back_is_judged_again_from_then_until_the_recovery_ends() -> None:
    w = RecoveryWatch(stall_s=10)
    assert w.observe(snap(111, remaining={"c-0": 7})).stalled == ["c-0"]
    w.nudge(["c-0"], 111)
    assert w.nudged("c-0") and not w.nudged("c-1")
    assert w.observe(snap(120, remaining={"c-0": 7})).stalled == []  # 9 s after the seek back
    assert w.observe(snap(121, remaining={"c-0": 7})).stalled == ["c-0"]  # still nothing: stalled again
    w.observe(snap(125, in_recovery=False))
    assert not w.nudged("c-0")  # a later recovery starts afresh


def test_raw_partitions_assigned_without_their_changelog_partition_are_named() -> None:
    full = [TP("raw", 0), TP("raw", 3), TP("log", 0), TP("log", 3), TP("log", 5)]  # 5: a standby
    assert unrestored(full, "raw", "log") == set()
    assert unrestored([TP("raw", 0), TP("raw", 3), TP("log", 3), TP("other", 0)], "raw", "log") == {0}
    assert unrestored(iter([TP("raw", 1), TP("raw", 2)]), "raw", "log") == {1, 2}  # a leader that knew no changelog
    assert unrestored([], "raw", "log") == set()
