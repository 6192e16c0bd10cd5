"""What a block of the engine's Arrow takes once its dictionary columns are decoded, asked before decoding."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rewardflow.clickhouse.chdbarrow import _decoded, decoded_size
from rewardflow.clickhouse.errors import QueryError


def batch_of(value: str, rows: int) -> pa.RecordBatch:
    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([value]))
    return pa.RecordBatch.from_arrays([column, pa.array(range(rows), pa.int64())], names=["s", "n"])


def test_a_few_long_values_repeated_are_sized_as_decoded_and_refused_before_decoding() -> None:
    wide = batch_of("x" * 1_000_000, 100)
    assert wide.nbytes < 2_000_000  # small as the engine sends it...
    assert 100_000_000 <= decoded_size(wide) <= 100_002_000  # ...large once decoded
    with pytest.raises(QueryError, match="REWARDFLOW_READ_MAX_BLOCK_BYTES"):
        _decoded(wide, max_bytes=64 * 1024**2)


def test_the_size_asked_is_never_below_what_decoding_takes() -> None:
    for value, rows in (("ab", 10_000), ("", 5), ("é" * 30, 1_000)):
        small = batch_of(value, rows)
        out = _decoded(small, max_bytes=64 * 1024**2)
        assert out.column("s").to_pylist() == [value] * rows
        assert decoded_size(small) >= out.nbytes - 64
