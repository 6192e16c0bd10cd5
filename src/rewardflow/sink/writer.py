"""The sink's write stage: one batch -> one deduplicated insert, rejected rows -> dead_letters.

Contract of :meth:`BatchWriter.write`:

* the batch is inserted as ``JSONEachRow`` under ``insert_deduplication_token
  = batch.token`` (tables keep ``non_replicated_deduplication_window`` tokens),
  so writing the same batch twice stores its rows once;
* if ClickHouse rejects the *data* (parse or type error), the batch is split
  in halves recursively (records, then the rows of a single record) down to
  the rows it rejects; every accepted part is inserted under a token derived
  from the batch token and its position, so a replay repeats the same split
  and is dropped too. Each rejected row becomes one ``dead_letters`` row
  (reason_code ``sink_rejected``, reason = ClickHouse's message). A bad row
  therefore never blocks its partition;
* any other failure (server down, timeout, too many parts, fault hook) raises
  :class:`~.errors.ClickHouseUnavailable`; nothing is dead-lettered, and
  writing the batch again later is safe.

Blocks for the duration of the insert(s).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from rewardflow.sink.batching import Batch
from rewardflow.clickhouse.catalog import table as table_def
from rewardflow.clickhouse.errors import ClickHouseUnavailable, clean_message, is_data_error
from rewardflow.sink.decode import row_line
from rewardflow.core.records import stable_id
from rewardflow.core.rows import DeadLetter

STRICT_INPUT: dict[str, Any] = {
    "input_format_parallel_parsing": 0,  # one block per insert: a parse error writes nothing
    "input_format_force_null_for_omitted_fields": 1,  # a missing field is an error, not a silent 0
    "input_format_null_as_default": 0,
    # a batch's rows may span any number of the table's partitions (their event times are a client's, and late
    # rows are dated anywhere since 2000): over the engine's default of 100 an insert fails the same way each
    # time it is retried, and the sink would hold every table's rows behind it
    "max_partitions_per_insert_block": 0,
}

Fault = Callable[[str], None]
"""Test hook called with the table name before every insert; raising simulates an outage."""


class _Rejected(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)


class BatchWriter:
    """Writes batches through ``client``; counts go to the caller via the return value."""

    def __init__(self, client: Client, fault: Fault | None = None) -> None:
        self.client = client
        self.fault = fault

    def _insert(self, table: str, lines: list[bytes], token: str) -> None:
        body = b"\n".join(line for line in lines if line)
        if not body:
            return
        try:
            if self.fault is not None:
                self.fault(table)
            self.client.raw_insert(
                table,
                list(table_def(table).record_columns),
                body,
                fmt="JSONEachRow",
                settings={**STRICT_INPUT, "insert_deduplication_token": token},
            )
        except Exception as exc:
            if is_data_error(exc):
                raise _Rejected(clean_message(exc)) from None
            raise ClickHouseUnavailable(clean_message(exc)) from exc

    def write(self, batch: Batch) -> list[DeadLetter]:
        """Insert ``batch``; returns the dead letters written for rows ClickHouse rejected."""
        dead = [
            dead_letter(batch, p.offset, -1, p.reject[2], p.reject[0], p.reject[1], {})
            for p in batch.records
            if p.reject is not None
        ]
        self._records(batch, 0, len(batch.records), dead)
        if dead:
            lines = [row_line(dict(d)) for d in dead]
            try:
                self._insert("dead_letters", lines, batch.token + "/dlq")
            except _Rejected as exc:
                raise ClickHouseUnavailable(f"dead_letters refused a dead letter: {exc}") from None
        return dead

    def _records(self, batch: Batch, lo: int, hi: int, dead: list[DeadLetter]) -> None:
        whole = lo == 0 and hi == len(batch.records)
        token = batch.token if whole else f"{batch.token}/r{lo}-{hi}"
        try:
            self._insert(batch.table, [p.line for p in batch.records[lo:hi]], token)
            return
        except _Rejected:
            pass
        if hi - lo > 1:
            mid = (lo + hi) // 2
            self._records(batch, lo, mid, dead)
            self._records(batch, mid, hi, dead)
        else:
            self._split_rows(batch, lo, dead)

    def _split_rows(self, batch: Batch, index: int, dead: list[DeadLetter]) -> None:
        record = batch.records[index]
        try:
            rows = orjson.loads(b"[" + record.line + b"]")
        except orjson.JSONDecodeError as exc:
            dead.append(dead_letter(batch, record.offset, -1, record.line, "sink_bad_json", str(exc), {}))
            return
        self._bisect_rows(batch, index, rows, 0, len(rows), dead)

    def _bisect_rows(self, batch: Batch, index: int, rows: list[Any], lo: int, hi: int, dead: list[DeadLetter]) -> None:
        record = batch.records[index]
        lines = [row_line(r) if isinstance(r, dict) else orjson.dumps(r) for r in rows[lo:hi]]
        try:
            self._insert(batch.table, lines, f"{batch.token}/r{index}/{lo}-{hi}")
            return
        except _Rejected as exc:
            if hi - lo == 1:
                row = rows[lo] if isinstance(rows[lo], dict) else {}
                dead.append(dead_letter(batch, record.offset, lo, lines[0], "sink_rejected", str(exc), row))
                return
        mid = (lo + hi) // 2
        self._bisect_rows(batch, index, rows, lo, mid, dead)
        self._bisect_rows(batch, index, rows, mid, hi, dead)


def dead_letter(
    batch: Batch, offset: int, index: int, original: bytes, code: str, reason: str, row: dict[str, Any]
) -> DeadLetter:
    """The dead_letters row for a rejected row (``index`` >= 0) or record (``index`` -1)."""
    id_col = table_def(batch.table).id_column

    def text(key: str) -> str:
        value = row.get(key, "")
        return value if isinstance(value, str) else ""

    return DeadLetter(
        dead_letter_id=stable_id(batch.topic, batch.partition, offset, index),
        source_topic=batch.topic,
        source_partition=batch.partition,
        source_offset=offset,
        index=index,
        reason_code=code,
        reason=f"{batch.table}: {reason}"[:2000],
        event_type=text("event_type"),
        event_id=text(id_col) or text("event_id"),
        session_id=text("session_id"),
        original_b64=base64.b64encode(original).decode(),
        dead_lettered_at=int(time.time() * 1000),
    )


