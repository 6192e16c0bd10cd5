"""The benchmarks' synthetic rows fit the tables they are inserted into.

A column added to a table and missing from a benchmark's rows makes the sink's strict
insert refuse them (``Cannot insert NULL value``), and ``rewardflow bench`` fails there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rewardflow.clickhouse.catalog import table

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_sink  # noqa: E402 - a script of bench/, imported by path


@pytest.mark.parametrize("name", sorted(bench_sink.MAKERS))
def test_the_sink_benchmark_rows_have_every_column_of_their_table(name: str) -> None:
    row = bench_sink.MAKERS[name](7)
    assert set(row) == set(table(name).record_columns)
