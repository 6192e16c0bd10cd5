"""Which window partials the live monitor may evaluate."""

from rewardflow.analysis.monitor_loop import closed_rows


def row(size: int, start: int, partition: int) -> dict[str, int]:
    return {"window_size_s": size, "window_start": start, "source_partition": partition}


def test_a_window_is_closed_only_when_every_partition_moved_past_it() -> None:
    rows = [row(60, 0, 0), row(60, 60_000, 0), row(60, 0, 1)]
    # partition 1 has not reported any later window: window 0 may still miss nothing, but 60_000 may miss p1's part
    assert closed_rows(rows) == []
    rows.append(row(60, 120_000, 1))
    assert sorted((r["window_start"], r["source_partition"]) for r in closed_rows(rows)) == [(0, 0), (0, 1)]


def test_sizes_are_independent() -> None:
    rows = [row(60, 0, 0), row(60, 60_000, 0), row(3600, 0, 0)]
    assert [(r["window_size_s"], r["window_start"]) for r in closed_rows(rows)] == [(60, 0)]
