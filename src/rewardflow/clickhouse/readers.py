"""The :class:`Reader` interface of every read path, and its in-process implementation.

A reader runs read-only SQL and returns Arrow: every statement passes
:func:`~.readonly.check_read_only`, and the connection itself is opened with
``readonly = 1`` (set once on the session, so the server refuses any write
and any attempt to lift it). It can also advance a trainer cursor, the one
narrow write a reader is allowed, through a second, ordinary connection. Implementations: :class:`LocalReader` (a clickhouse-connect
client in this process) and :class:`~.remote.RemoteReader` (the chDB owner's
endpoint). Readers are not thread-safe; use one per thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
from clickhouse_connect.driver.client import Client

from rewardflow.clickhouse.errors import QueryError, clean_message, error_code, is_driver_error
from rewardflow.clickhouse.readonly import check_read_only

if TYPE_CHECKING:
    from rewardflow.clickhouse.chdbarrow import ChdbArrowStream

CURSOR_INSERT = "trainer_cursors"
CURSOR_COLUMNS = ("trainer", "cursor", "rows", "filters")


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
        """Record ``cursor`` as trainer's position (a row of trainer_cursors); blocks until stored."""
        ...

    def close(self) -> None:
        """Release the connection. Idempotent."""
        ...


def run_query_error(exc: BaseException) -> QueryError:
    """A driver error as a :class:`QueryError` with ClickHouse's cleaned message."""
    return QueryError(clean_message(exc), error_code(exc))


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

    def query_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        statement = check_read_only(sql)
        try:
            table: pa.Table = self.client.query_arrow(statement, parameters=dict(parameters or {}))
        except Exception as exc:
            if is_driver_error(exc):
                raise run_query_error(exc) from None
            raise
        return table

    def stream_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None) -> Iterator[pa.RecordBatch]:
        statement = check_read_only(sql)
        if self._arrow_stream is not None:
            yield from self._arrow_stream.stream(statement, parameters)
            return
        try:
            with self.client.query_arrow_stream(statement, parameters=dict(parameters or {})) as stream:
                yield from stream
        except Exception as exc:
            if is_driver_error(exc):
                raise run_query_error(exc) from None
            raise

    def advance_cursor(self, trainer: str, cursor: int, rows: int, filters: str) -> None:
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
