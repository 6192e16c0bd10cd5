"""Results render the same in every format: maps as objects (an empty one too), lists as lists. Pure."""

from __future__ import annotations

import io

import orjson
import pyarrow as pa
from rich.console import Console

from rewardflow.clickhouse.render import rows, write_csv, write_json, write_table

TABLE = pa.table({
    "m": pa.array([[], [(30, 1.0)]], pa.map_(pa.uint32(), pa.float64())),
    "l": pa.array([[], [1, 2]], pa.list_(pa.int64())),
})


def test_an_empty_map_is_an_empty_object_and_an_empty_list_stays_a_list() -> None:
    assert rows(TABLE) == [{"m": {}, "l": []}, {"m": {"30": 1.0}, "l": [1, 2]}]


def test_json_csv_and_table_agree_on_maps() -> None:
    out = io.StringIO()
    write_json(TABLE, out)
    assert orjson.loads(out.getvalue())[0] == {"m": {}, "l": []}
    out = io.StringIO()
    write_csv(TABLE, out)
    assert out.getvalue().splitlines()[1] == '"{}","[]"'
    console = Console(file=io.StringIO(), width=80)
    write_table(TABLE, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "{}" in text and '{"30":1.0}' in text
