"""Streamed Arrow reads on this process's chDB engine: order, errors, streams abandoned midway."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from rewardflow.clickhouse.chdbarrow import ChdbArrowStream
from rewardflow.clickhouse.errors import QueryError
from tests.conftest_clickhouse import ChDatabase

pytestmark = pytest.mark.clickhouse
ROWS = 300_000  # several engine blocks, so the pump runs ahead of the reader


@pytest.fixture
def stream(ch_db: ChDatabase) -> Iterator[ChdbArrowStream]:
    if not ch_db.dsn.embedded:
        pytest.skip("ChdbArrowStream serves the embedded engine only")
    assert ch_db.dsn.path is not None
    s = ChdbArrowStream(ch_db.dsn.path, ch_db.name, {})
    yield s
    s.close()


def _pumps() -> int:
    return sum(t.name == "chdb-arrow-pump" for t in threading.enumerate())


def test_every_row_arrives_in_order_across_blocks(stream: ChdbArrowStream) -> None:
    batches = list(stream.stream("SELECT number, toString(number) AS s FROM numbers({n:UInt64})", {"n": ROWS}))
    assert len(batches) > 1
    table = pa.Table.from_batches(batches)
    assert table.column("number").to_pylist() == list(range(ROWS))
    assert table.column("s")[ROWS - 1].as_py() == str(ROWS - 1)
    assert _pumps() == 0


def test_an_engine_error_midway_is_a_query_error(stream: ChdbArrowStream) -> None:
    seen = 0
    with pytest.raises(QueryError, match="boom"):
        for batch in stream.stream(f"SELECT throwIf(number = {ROWS - 1}, 'boom') AS x FROM numbers({ROWS})"):
            seen += batch.num_rows
    assert seen < ROWS
    assert _pumps() == 0


def test_a_stream_abandoned_midway_frees_its_handle(stream: ChdbArrowStream) -> None:
    it = stream.stream(f"SELECT number FROM numbers({ROWS})")
    first = next(it)
    assert first.column("number")[0].as_py() == 0
    it.close()  # the reader stops early: the pump stops, the query ends, the handle goes back
    assert _pumps() == 0
    again = pa.Table.from_batches(list(stream.stream("SELECT number FROM numbers(5)")))  # the same handle
    assert again.column("number").to_pylist() == [0, 1, 2, 3, 4]


def test_batches_outlive_their_stream_and_its_engine_memory(ch_db: ChDatabase) -> None:
    """The batches reference the engine's result memory (no copy): it must live as long as they do."""
    if not ch_db.dsn.embedded:
        pytest.skip("ChdbArrowStream serves the embedded engine only")
    assert ch_db.dsn.path is not None
    s = ChdbArrowStream(ch_db.dsn.path, ch_db.name, {})
    batches = list(s.stream(f"SELECT number, repeat(toString(number), 3) AS s FROM numbers({ROWS})"))
    s.close()
    del s
    churn = ChdbArrowStream(ch_db.dsn.path, ch_db.name, {})  # new results reuse whatever memory was freed
    for _ in range(3):
        assert sum(b.num_rows for b in churn.stream(f"SELECT repeat('x', 40) AS y FROM numbers({ROWS})")) == ROWS
    churn.close()
    gc.collect()
    table = pa.Table.from_batches(batches)
    assert table.column("number").to_pylist() == list(range(ROWS))
    assert table.column("s").to_pylist() == [str(i) * 3 for i in range(ROWS)]


def test_a_block_over_the_limit_ends_the_stream_naming_the_setting(ch_db: ChDatabase) -> None:
    if not ch_db.dsn.embedded:
        pytest.skip("ChdbArrowStream serves the embedded engine only")
    assert ch_db.dsn.path is not None
    s = ChdbArrowStream(ch_db.dsn.path, ch_db.name, {}, max_block_bytes=2 * 1024**2)
    try:
        rows = sum(b.num_rows for b in s.stream(f"SELECT number, toString(number) AS s FROM numbers({ROWS})"))
        assert rows == ROWS  # a table's blocks are well within it
        with pytest.raises(QueryError, match="REWARDFLOW_READ_MAX_BLOCK_BYTES"):
            list(s.stream("SELECT repeat(repeat('x', 1000), 3000) AS wide FROM numbers(3)"))
        assert _pumps() == 0
    finally:
        s.close()
