"""The :class:`Reader` interface of every read path, and its in-process implementation.

A reader runs read-only SQL and returns Arrow: every statement passes the
parser-based :class:`~.sqlguard.SqlGuard` of the engine that runs it, and the
connection itself is opened with ``readonly = 1`` and the read limits (set once
on the session, so the engine refuses any write and any attempt to lift them).
It can also advance a trainer cursor, the one narrow write a reader is allowed,
through a second, ordinary connection; the cursor must move forward, stay within
the rewards table's range (at most the ``_seq`` of now), and its fields are
bounded. Implementations: :class:`LocalReader` (a clickhouse-connect client in
this process) and :class:`~.remote.RemoteReader` (the chDB owner's endpoint).
Readers are not thread-safe; use one per thread.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
from clickhouse_connect.driver.binding import bind_query
from clickhouse_connect.driver.client import Client

from rewardflow.clickhouse.errors import QueryError, clean_message, error_code, is_driver_error
from rewardflow.clickhouse.sqlguard import SqlGuard

if TYPE_CHECKING:
    from rewardflow.clickhouse.chdbarrow import ChdbArrowStream

CURSOR_INSERT = "trainer_cursors"
CURSOR_COLUMNS = ("trainer", "cursor", "rows", "filters")
MAX_FILTERS_CHARS = 4_096
_NOT_STREAMABLE = 36  # chDB streams SELECTs only (SHOW, DESCRIBE, EXISTS, EXPLAIN come whole; they are small)
_WHOLE = re.compile(r"\s*(SHOW|DESCRIBE|DESC|EXISTS)\b", re.IGNORECASE)  # ...and only those are run whole
TRAINER_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class CursorError(ValueError):
    """A cursor commit that would move a cursor back, past the table, or carries oversized fields."""


class Reader(Protocol):
    """Read-only access to one database."""

    description: str

    def query_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        """Run one read statement; raises ReadOnlyViolation or QueryError (ClickHouse's message)."""
        ...

    def stream_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None) -> Iterator[pa.RecordBatch]:
        """Run one read statement and yield its result as record batches, in order."""
        ...

    def advance_cursor(self, trainer: str, cursor: int, rows: int, filters: str) -> None:
        """Record ``cursor`` as trainer's position (a row of trainer_cursors); blocks until stored.
        Raises :class:`CursorError` for a cursor that moves back or past the table, or bad fields."""
        ...

    def close(self) -> None:
        """Release the connection. Idempotent."""
        ...


def run_query_error(exc: BaseException) -> QueryError:
    """A driver error as a :class:`QueryError` with ClickHouse's cleaned message."""
    return QueryError(clean_message(exc), error_code(exc))


@contextmanager
def _query_errors() -> Iterator[None]:
    """Raise a driver error from within as :func:`run_query_error` does; anything else as it is."""
    try:
        yield
    except Exception as exc:
        if is_driver_error(exc):
            raise run_query_error(exc) from None
        raise


def _sent(sql: str, parameters: Mapping[str, Any]) -> str | bytes:
    """The statement text clickhouse-connect sends with ``parameters`` (:class:`~.sqlguard.SqlGuard`'s ``bind``)."""
    return bind_query(sql, dict(parameters))[0]


class LocalReader:
    """A :class:`Reader` over clickhouse-connect clients in this process.

    ``client`` must have been opened with :data:`~.readonly.READONLY_SETTINGS`;
    ``writer`` opens the connection used for cursor commits (on first use);
    ``arrow_stream`` (chDB only, same settings) streams :meth:`stream_arrow` block by block,
    which the driver cannot do on chDB.
    """

    def __init__(
        self,
        client: Client,
        description: str,
        writer: Callable[[], Client] | None = None,
        arrow_stream: ChdbArrowStream | None = None,
    ) -> None:
        self.client = client
        self.description = description
        self._open_writer = writer
        self._writer: Client | None = None
        self._arrow_stream = arrow_stream
        self.guard = SqlGuard(self._rows, _sent)

    def _rows(self, sql: str, parameters: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        with _query_errors():
            return [tuple(row) for row in self.client.query(sql, parameters=dict(parameters)).result_rows]

    def query_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        statement = self.guard.check(sql, parameters)
        if statement.startswith("EXPLAIN"):
            return self._explained(statement, parameters)
        return self._whole(statement, parameters)

    def _whole(self, statement: str, parameters: Mapping[str, Any] | None) -> pa.Table:
        """A checked statement's whole result, through the driver."""
        with _query_errors():
            table: pa.Table = self.client.query_arrow(statement, parameters=dict(parameters or {}))
        return table

    def stream_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None,
                     cancel: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        """:meth:`Reader.stream_arrow`; on chDB, ``cancel`` set stops the engine's query even before its first
        batch (an aggregation yields nothing until it ends), and the stream raises QueryError."""
        statement = self.guard.check(sql, parameters)
        if statement.startswith("EXPLAIN"):
            yield from self._explained(statement, parameters).to_batches()
            return
        if self._arrow_stream is not None:
            began = False
            try:
                for batch in self._arrow_stream.stream(statement, parameters, cancel):
                    began = True
                    yield batch
            except QueryError as exc:  # (only a statement chDB cannot stream is run whole, and only before a row)
                if exc.code != _NOT_STREAMABLE or began or _WHOLE.match(statement) is None:
                    raise
                yield from self._whole(statement, parameters).to_batches()
            return
        with _query_errors(), self.client.query_arrow_stream(statement, parameters=dict(parameters or {})) as stream:
            yield from stream

    def _explained(self, statement: str, parameters: Mapping[str, Any] | None) -> pa.Table:
        """An ``EXPLAIN`` result as Arrow (the engine writes EXPLAIN output as text rows, not in Arrow)."""
        with _query_errors():
            result = self.client.query(statement, parameters=dict(parameters or {}))
        names = list(result.column_names)
        return pa.table({n: [str(row[i]) for row in result.result_rows] for i, n in enumerate(names)})

    def advance_cursor(self, trainer: str, cursor: int, rows: int, filters: str) -> None:
        if not TRAINER_NAME.match(trainer):
            raise CursorError("trainer: letters, digits and . _ : - only, at most 128 characters")
        if not 0 <= rows < 2**63 or len(filters) > MAX_FILTERS_CHARS:
            raise CursorError(f"rows must be 0..2^63-1 and filters at most {MAX_FILTERS_CHARS} characters")
        ((current, count, now),) = self._rows(
            "SELECT argMax(cursor, _seq), count(), dateTime64ToSnowflakeID(now64(3)) FROM trainer_cursors "
            "WHERE trainer = {t:String}", {"t": trainer})
        if not 0 <= cursor <= int(now):
            raise CursorError(f"cursor {cursor} is beyond the rewards table (the _seq of now is {now})")
        if count and cursor < int(current):
            raise CursorError(f"cursor {cursor} would move {trainer}'s cursor back from {current}")
        if self._writer is None:
            if self._open_writer is None:
                raise RuntimeError("this reader cannot commit cursors (no writer connection)")
            self._writer = self._open_writer()
        self._writer.insert(CURSOR_INSERT, [[trainer, cursor, rows, filters]], column_names=list(CURSOR_COLUMNS))

    def close(self) -> None:
        if self._arrow_stream is not None:
            self._arrow_stream.close()
        self.client.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
