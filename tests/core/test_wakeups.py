"""The wake-up schedule: one wake-up per session, due ones in order, stale entries skipped; when a
session wakes up."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rewardflow.core.config import PRUNE_STEPS, JoinConfig
from rewardflow.core.session import SessionState
from rewardflow.core.wakeups import Wakeups, deadlines, first_deadline, next_after_settle, wake_at
from tests.core.test_session import sessions
from tests.factories import T0


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


@settings(max_examples=300, deadline=None)
@given(s=sessions(), wm=st.integers(T0, T0 + 12_000_000), dedup=st.integers(1, 5_000_000),
       correction=st.sampled_from([0, 3_600_000]), provisional=st.booleans())
def test_a_session_wakes_to_be_pruned_on_the_grid_and_for_its_deadlines_on_time(
        s: SessionState, wm: int, dedup: int, correction: int, provisional: bool) -> None:
    """Pruning waits for the next step of the grid (never comes early, never a full step late); a turn's
    deadline is never moved."""
    cfg = JoinConfig(dedup_ms=dedup, correction_ms=correction, provisional=provisional)
    step = cfg.prune_step_ms
    assert step == max(1, min(cfg.dedup_ms, cfg.keep_done_ms) // PRUNE_STEPS)
    turn_deadlines = deadlines(s, cfg)
    first_prune = s.next_wake([], cfg.dedup_ms, cfg.keep_done_ms, max(cfg.window_sizes_s) * 1000)
    got = wake_at(s, cfg, wm)
    prune = None if first_prune is None else -(-first_prune // step) * step
    assert prune is None or (prune % step == 0 and first_prune <= prune < first_prune + step)
    assert got == min([*turn_deadlines, *([] if prune is None else [prune])], default=None)
    after = next_after_settle(s, cfg, wm)
    if prune is not None and prune <= wm:  # passed already (tombstones whose windows are still open)
        prune = wm + min(cfg.window_sizes_s) * 1000
    assert after == min([*turn_deadlines, *([] if prune is None else [prune])], default=None)


@settings(max_examples=200, deadline=None)
@given(s=sessions(), provisional=st.booleans())
def test_the_first_deadline_is_the_earliest_of_the_turns_deadlines(s: SessionState, provisional: bool) -> None:
    cfg = JoinConfig(provisional=provisional)
    assert first_deadline(s, cfg) == min(deadlines(s, cfg), default=None)
