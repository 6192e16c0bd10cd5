"""Where the sink cuts batches: recorded ranges are reproduced exactly. Pure."""

from __future__ import annotations

from rewardflow.sink.batching import Batch, PartitionBuffer, Pending, cut

def buf(offsets: list[int], rows: int = 10) -> PartitionBuffer:
    b = PartitionBuffer("t", 0, "rewards")
    for o in offsets:
        b.add(Pending(o, rows, b"x"), 0.0)
    return b


def ranges(batches: list[Batch]) -> list[tuple[int, int, bool]]:
    return [(b.first, b.last, b.recorded) for b in batches]


def never(_: int) -> int | None:
    return None


def test_unrecorded_records_wait_for_the_trigger_then_cut_by_rows() -> None:
    b = buf(list(range(10)))
    assert cut(b, never, never, max_rows=30, force=False, position=None) == []
    assert len(b.records) == 10
    out = cut(b, never, never, max_rows=30, force=True, position=None)
    assert ranges(out) == [(0, 2, False), (3, 5, False), (6, 8, False), (9, 9, False)]
    assert b.records == []


def test_a_record_larger_than_max_rows_is_a_batch_of_its_own() -> None:
    out = cut(buf([5, 6], rows=100), never, never, max_rows=30, force=True, position=None)
    assert ranges(out) == [(5, 5, False), (6, 6, False)]


def test_recorded_ranges_are_reproduced_exactly_without_a_trigger() -> None:
    recorded = {0: 3, 4: 4, 5: 9}
    starts = sorted(recorded)

    def nxt(o: int) -> int | None:
        return next((s for s in starts if s > o), None)

    b = buf(list(range(12)))
    out = cut(b, recorded.get, nxt, max_rows=1000, force=False, position=None)
    assert ranges(out) == [(0, 3, True), (4, 4, True), (5, 9, True)]
    assert [p.offset for p in b.records] == [10, 11]
    assert [(x.first, x.last) for x in cut(b, recorded.get, nxt, max_rows=1000, force=True, position=None)] == [(10, 11)]


def test_an_incomplete_recorded_range_waits() -> None:
    b = buf([0, 1, 2])
    assert cut(b, {0: 5}.get, never, max_rows=1000, force=True, position=None) == []
    assert ranges(cut(b, {0: 5}.get, never, max_rows=1000, force=True, position=9)) == [(0, 5, True)]  # offsets 3-5 gone


def test_a_fresh_cut_never_crosses_the_start_of_a_recorded_range() -> None:
    b = buf(list(range(8)))
    out = cut(b, {5: 7}.get, lambda o: 5 if o < 5 else None, max_rows=1000, force=True, position=None)
    assert ranges(out) == [(0, 4, False), (5, 7, True)]


def test_token_is_a_function_of_the_range_only() -> None:
    a = Batch("t", 1, "rewards", 10, 20, (), False)
    assert a.token == Batch("t", 1, "events", 10, 20, (Pending(10, 1, b"y"),), True).token == "rf1:t::1:10:20"
