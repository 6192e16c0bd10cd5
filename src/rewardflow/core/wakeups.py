"""When each session of a partition needs the watermark's attention: its wake-up schedule.

A session wakes up at the earliest of its open turns' deadlines (settling, and the provisional
horizons when those are on) and the times its seen ids or tombstones may be pruned
(:meth:`~rewardflow.core.session.SessionState.next_wake`). :class:`Wakeups` keeps one wake-up per
session in a heap; the processor settles a session when the watermark reaches it.

Contract: pure, no I/O. Wake-up times are event times (ms). A stale heap entry (the session was
rescheduled since) is skipped when popped, so rescheduling never searches the heap.
"""

from __future__ import annotations

import heapq

from rewardflow.core.config import JoinConfig
from rewardflow.core.session import SessionState
from rewardflow.core.turn import TurnState

_anchor = TurnState.anchor


class Wakeups:
    """One partition's wake-up schedule: session id -> its next wake-up, in a heap."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, str]] = []
        self._at: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self._heap)

    def schedule(self, sid: str, t: int | None) -> None:
        """Make ``t`` the session's next wake-up (None: it needs none)."""
        if t is None:
            self._at.pop(sid, None)
        elif self._at.get(sid) != t:
            self._at[sid] = t
            heapq.heappush(self._heap, (t, sid))

    def pop_due(self, wm: int, due: list[str], seen: set[str]) -> None:
        """Append to ``due`` (and ``seen``) every session whose wake-up is at or before ``wm`` and not
        in ``seen`` yet, in wake-up order; their wake-ups are consumed."""
        heap, at = self._heap, self._at
        while heap and heap[0][0] <= wm:
            t, sid = heapq.heappop(heap)
            if at.get(sid) == t:
                del at[sid]
                if sid not in seen:
                    seen.add(sid)
                    due.append(sid)


def deadlines(st: SessionState, cfg: JoinConfig) -> list[int]:
    """Each open turn's next deadline: settling, or its next provisional horizon when that is earlier."""
    out = []
    for turn in st.turns.values():
        anchor = turn.anchor()
        nxt = anchor + cfg.settle_ms
        if cfg.provisional and turn.served is not None:
            for h in cfg.horizons_s[:-1]:
                if h > turn.provisional_h:
                    nxt = min(nxt, anchor + h * 1000 + cfg.grace_ms)
                    break
        out.append(nxt)
    return out


def first_deadline(st: SessionState, cfg: JoinConfig) -> int | None:
    """The earliest of :func:`deadlines` (None without an open turn). Runs for every record's session:
    without provisional horizons it is the earliest anchor's settling, taken without a list."""
    turns = st.turns
    if not turns:
        return None
    if not cfg.provisional:
        return min(map(_anchor, turns.values())) + cfg.settle_ms
    return min(deadlines(st, cfg))


def wake_at(st: SessionState, cfg: JoinConfig, wm: int) -> int | None:
    """The earliest watermark at which the session needs settling or pruning, or None."""
    return _earliest(st, cfg, wm, first_deadline(st, cfg))


def next_after_settle(st: SessionState, cfg: JoinConfig, wm: int) -> int | None:
    """The wake-up of a session just settled at ``wm``: a prune-only wake-up it already passed
    (tombstones whose windows are open, held ones not committed yet) is looked at again one window
    later; deadlines are never postponed."""
    t = _earliest(st, cfg, wm, None)
    if t is not None and t <= wm:
        t = wm + min(cfg.window_sizes_s) * 1000
    first = first_deadline(st, cfg)
    if first is not None and (t is None or first < t):
        t = first
    return t


def _earliest(st: SessionState, cfg: JoinConfig, wm: int, first: int | None) -> int | None:
    """The earliest of ``first`` (the first turn deadline, if any) and the session's pruning time: the
    first time something can be pruned, rounded up to the next multiple of ``cfg.prune_step_ms`` (what
    expires within one step goes in one wake-up), or ``wm`` while tombstones are held (they go at a prune
    once the commit passed them)."""
    t = st.next_wake([], cfg.dedup_ms, cfg.keep_done_ms, cfg.longest_window_ms)
    if t is not None:
        step = cfg.prune_step_ms
        t = -(-t // step) * step
    if st.held:
        t = wm if t is None else min(t, wm)
    if first is not None and (t is None or first < t):
        t = first
    return t
