"""Render an Arrow result for a terminal or a pipe: table, CSV or JSON. Pure except for ``out``.

Maps become JSON objects, timestamps ISO 8601 strings, bytes base64 - the same
in every format, so ``--format json`` output parses back to what the table shows.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
from typing import Any, TextIO

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
from rich.console import Console
from rich.table import Table


def plain(value: Any, typ: pa.DataType | None = None) -> Any:
    """A JSON-friendly version of one Arrow Python value; ``typ`` (its Arrow type) tells an empty map
    (``{}``) from an empty list."""
    if typ is not None and pa.types.is_map(typ) and isinstance(value, list):
        return {str(k): plain(v, typ.item_type) for k, v in value}
    if typ is not None and pa.types.is_list(typ) and isinstance(value, list):
        return [plain(v, typ.value_type) for v in value]
    if isinstance(value, list) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return {str(k): plain(v) for k, v in value}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def rows(table: pa.Table) -> list[dict[str, Any]]:
    """The result as a list of plain dicts (column order kept)."""
    types = {f.name: f.type for f in table.schema}
    return [{k: plain(v, types[k]) for k, v in r.items()} for r in table.to_pylist()]


def write_json(table: pa.Table, out: TextIO) -> None:
    """A JSON array of row objects."""
    out.write(orjson.dumps(rows(table), option=orjson.OPT_NON_STR_KEYS).decode())
    out.write("\n")


def write_csv(table: pa.Table, out: TextIO) -> None:
    """CSV with a header; nested values are written as JSON."""
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_nested(col.type) or pa.types.is_binary(col.type):
            cols[name] = pa.array([None if v is None else orjson.dumps(plain(v, col.type)).decode() for v in col.to_pylist()],
                                  pa.string())
        else:
            cols[name] = col
    buf = io.BytesIO()
    pacsv.write_csv(pa.table(cols) if cols else table, buf)
    out.write(buf.getvalue().decode())


def write_table(table: pa.Table, console: Console, max_rows: int = 1000) -> None:
    """A rich table (first ``max_rows`` rows) and a row count."""
    view = Table(*table.column_names, show_lines=False)
    for r in rows(table.slice(0, max_rows)):
        view.add_row(*("NULL" if v is None else orjson.dumps(v).decode() if isinstance(v, dict | list) else str(v) for v in r.values()))
    console.print(view)
    more = f" (showing {max_rows})" if table.num_rows > max_rows else ""
    console.print(f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}{more}", style="dim")
