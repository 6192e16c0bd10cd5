"""The gap guard's ``admit`` when a rebalance comes while it waits on the broker (``streams/gaps.py``).

The guard runs over a stand-in for Faust's app and consumer that holds only what ``admit`` reads:
the consumer generation, the assignment, the log start offsets and Faust's gap intervals. A
rebalance during a lookup makes the batch stale: nothing is admitted and nothing of the lookup is
kept, so the next assignment's first batch looks its start offsets up afresh.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faust.types import TP

from rewardflow_streams.gaps import GapGuard, _Refetched
from rewardflow_streams.metrics import WorkerMetrics

RAW = TP("events.raw", 0)


class _Consumer:
    def __init__(self, app: _App) -> None:
        self.app = app
        self._gap: dict[Any, Any] = {}

    def assignment(self) -> set[Any]:
        return {RAW}

    async def earliest_offsets(self, *tps: Any) -> dict[Any, int]:
        if self.app.rebalance_during_lookup:
            self.app.consumer_generation_id += 1
        return dict.fromkeys(tps, 0)


class _App:
    def __init__(self, rebalance_during_lookup: bool) -> None:
        self.consumer_generation_id = 1
        self.rebalance_during_lookup = rebalance_during_lookup
        self.consumer = _Consumer(self)


def _admit(rebalance_during_lookup: bool, broker_answers: bool = False) -> tuple[list[Any], GapGuard]:
    """``broker_answers``: the log starts come from the worker's AdminClient (else it cannot say,
    and Faust's consumer is asked)."""
    app = _App(rebalance_during_lookup)

    def log_starts(tps: list[Any]) -> dict[Any, int | None]:
        if not broker_answers:
            return dict.fromkeys(tps)
        if app.rebalance_during_lookup:
            app.consumer_generation_id += 1
        return dict.fromkeys(tps, 0)

    guard = GapGuard(app, WorkerMetrics(0.5, 60.0), lambda tps: dict.fromkeys(tps, 5), log_starts, {})
    msgs = [_Refetched(RAW, offset, b"{}", [], 1) for offset in (5, 6, 7)]
    return asyncio.run(guard.admit(None, 0, msgs)), guard  # type: ignore[arg-type]


@pytest.mark.parametrize("broker_answers", [True, False], ids=["admin", "faust-consumer"])
def test_a_batch_is_admitted_from_the_committed_offset_when_no_rebalance_comes(broker_answers: bool) -> None:
    admitted, guard = _admit(rebalance_during_lookup=False, broker_answers=broker_answers)
    assert [m.offset for m in admitted] == [5, 6, 7]
    assert guard.start_offset(0) == 5 and guard.expected(0) == 8


@pytest.mark.parametrize("broker_answers", [True, False], ids=["admin", "faust-consumer"])
def test_a_rebalance_during_the_start_offset_lookup_admits_nothing_and_keeps_nothing(broker_answers: bool) -> None:
    admitted, guard = _admit(rebalance_during_lookup=True, broker_answers=broker_answers)
    assert admitted == []
    assert guard.start_offset(0) is None and guard.expected(0) is None
