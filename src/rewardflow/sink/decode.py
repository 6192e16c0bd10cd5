"""The sink's decode stage: what one Kafka record of an output topic becomes. Pure.

Every output record's value is a JSON *list* of row dicts (see
:mod:`rewardflow.kafka.topics`). Two views of the same record:

* :func:`rows_from_message` - Snuba's ``process_message``: the table and the
  decoded rows. Used to explain and isolate failures (bisecting a rejected
  batch down to one row) and by tests.
* :func:`line_from_message` - the fast path: the table, the record's rows as
  comma-separated JSON objects (the list without its brackets) and a row
  count. The sink concatenates such lines and lets ClickHouse parse them as
  ``JSONEachRow``: C++ parsing is 2-3x faster than ``orjson`` + Arrow building
  in Python for these wide rows (measured in bench/bench_sink.py), and the
  bytes are never decoded in Python at all.

Neither function does I/O. Both raise :class:`MessageRejected` for a value
that is not a JSON list, which the sink dead-letters whole (index -1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from rewardflow.clickhouse.catalog import table_of_topic


class MessageRejected(ValueError):
    """The record cannot be turned into rows; ``reason_code`` is stable, ``str()`` explains."""

    def __init__(self, reason_code: str, reason: str) -> None:
        super().__init__(reason)
        self.reason_code = reason_code


@dataclass(frozen=True)
class Line:
    """One record ready for a JSONEachRow body. ``rows`` counts the id fields (0 for ``[]``)."""

    table: str
    body: bytes
    rows: int


def rows_from_message(topic: str, value: bytes | None) -> tuple[str, list[dict[str, Any]]]:
    """Decode an output record of logical ``topic`` into (table name, rows).

    Raises ``KeyError`` for a topic that is not an output topic and
    :class:`MessageRejected` when the value is not a JSON list of objects.
    """
    table = table_of_topic(topic)
    if value is None:
        raise MessageRejected("sink_null_value", "record has no value (tombstone)")
    try:
        rows = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise MessageRejected("sink_bad_json", f"value is not JSON: {exc}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise MessageRejected("sink_not_a_list", "value is not a JSON list of row objects")
    return table.name, rows


def line_from_message(topic: str, value: bytes | None) -> Line:
    """Frame an output record of logical ``topic`` as a JSONEachRow line, without parsing it.

    Only the framing is checked here (a ``[...]`` list); the rows themselves are
    checked by ClickHouse at insert, and a rejected row is isolated by the
    writer. Raises ``KeyError`` for an unknown topic, :class:`MessageRejected`
    for a value that is not a list.
    """
    table = table_of_topic(topic)
    if value is None:
        raise MessageRejected("sink_null_value", "record has no value (tombstone)")
    body = value.strip()
    if len(body) < 2 or body[:1] != b"[" or body[-1:] != b"]":
        raise MessageRejected("sink_not_a_list", "value is not a JSON list of row objects")
    inner = body[1:-1].strip()
    if not inner:
        return Line(table.name, b"", 0)
    marker = b'"' + table.id_column.encode() + b'":'
    return Line(table.name, inner, max(1, inner.count(marker)))


def row_line(row: dict[str, Any]) -> bytes:
    """One decoded row re-encoded as a JSONEachRow line (used when isolating a bad row)."""
    return orjson.dumps(row, option=orjson.OPT_NON_STR_KEYS)
