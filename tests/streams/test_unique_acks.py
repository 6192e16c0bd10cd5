"""Faust's own commit step (``Consumer._new_offset``) over acks that hold an offset twice, with and
without :func:`~rewardflow_streams.commits.install_unique_acks`: Faust's code, run on the fields
it reads, as the worker's consumer holds them after a restart that stalled."""

from __future__ import annotations

from collections import defaultdict
from types import MethodType, SimpleNamespace
from typing import Any

from faust.transport.consumer import Consumer
from faust.types import TP
from intervaltree import Interval, IntervalTree

from rewardflow_streams.commits import install_unique_acks

RAW = TP("raw", 0)


def _consumer(acked: list[int], committed: int, gaps: tuple[tuple[int, int], ...] = ()) -> Any:
    c = SimpleNamespace(_acked=defaultdict(list), _acked_index=defaultdict(set),
                        _gap=defaultdict(IntervalTree), _committed_offset=defaultdict(lambda: None))
    c._acked[RAW] = list(acked)
    c._acked_index[RAW] = set(acked)
    c._committed_offset[RAW] = committed
    for begin, end in gaps:
        c._gap[RAW].add(Interval(begin, end))
    c._new_offset = MethodType(Consumer._new_offset, c)
    return c


def _commits(c: Any, rounds: int) -> list[int | None]:
    return [c._new_offset(RAW) for _ in range(rounds)]


def test_faust_alone_commits_doubled_acks_one_offset_at_a_time() -> None:
    doubled = sorted([*range(341, 614), *range(341, 614)])
    assert _commits(_consumer(doubled, 342), 3) == [342, 343, 344]


def test_unique_acks_commit_them_all_at_once() -> None:
    c = _consumer(sorted([*range(341, 614), *range(341, 614)]), 342)
    install_unique_acks(c)
    assert _commits(c, 2) == [614, None]
    assert c._acked[RAW] == []


def test_acks_a_gap_doubles_are_committed_by_the_next_round() -> None:
    """Faust adds a gap's offsets to the acks without looking at them: the round that does so still
    ends at the first double, the next one passes all."""
    acked, gaps = list(range(342, 614)), ((342, 614),)
    assert _commits(_consumer(acked, 342, gaps), 2) == [343, 344]
    c = _consumer(acked, 342, gaps)
    install_unique_acks(c)
    assert _commits(c, 2) == [343, 614]


def test_acks_without_doubles_are_left_as_faust_takes_them() -> None:
    c = _consumer([342, 343, 345], 342)
    install_unique_acks(c)
    assert c._new_offset(RAW) == 344
    assert c._acked[RAW] == [345]
