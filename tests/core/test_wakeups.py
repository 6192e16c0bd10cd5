"""The wake-up schedule: one wake-up per session, due ones in order, stale entries skipped."""

from __future__ import annotations

from rewardflow.core.wakeups import Wakeups


def test_due_sessions_come_in_wake_up_order_once_each() -> None:
    w = Wakeups()
    w.schedule("a", 30)
    w.schedule("b", 10)
    w.schedule("c", 20)
    w.schedule("d", 99)
    due: list[str] = []
    w.pop_due(25, due, set())
    assert due == ["b", "c"]
    w.pop_due(25, due, set(due))
    assert due == ["b", "c"]  # consumed
    w.pop_due(50, due, set(due))
    assert due == ["b", "c", "a"] and bool(w)  # "d" still waits


def test_a_rescheduled_session_wakes_at_its_new_time_only() -> None:
    w = Wakeups()
    w.schedule("a", 10)
    w.schedule("a", 40)  # the entry at 10 is stale now
    due: list[str] = []
    w.pop_due(20, due, set())
    assert due == []
    w.schedule("b", 5)
    w.schedule("b", None)  # needs none any more
    w.pop_due(40, due, set())
    assert due == ["a"] and not w


def test_a_session_already_due_is_not_added_twice() -> None:
    w = Wakeups()
    w.schedule("a", 10)
    w.schedule("b", 11)
    due = ["a"]
    w.pop_due(20, due, {"a"})
    assert due == ["a", "b"]
