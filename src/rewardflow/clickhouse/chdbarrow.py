"""Streamed Arrow reads from the chDB engine of this process, block by block.

clickhouse-connect's chDB backend cannot stream Arrow: chDB emits every block
as a complete Arrow stream, so the driver runs ``ArrowStream`` queries to the
end and hands back one buffer of the whole result (a second copy of it, and
nothing for the caller until the last row is formatted). :class:`ChdbArrowStream`
reads the same statement through its own chDB connection handle (chDB allows
any number of handles on the engine this process hosts) with ``send_query``,
and turns each block into record batches as soon as ClickHouse has it: a
pump thread fetches the next blocks while the caller decodes this one, and the
blocks come uncompressed (in one process, Arrow's lz4 framing only costs CPU).

The handle is opened with the reader's session settings, ``readonly`` last
(like every read connection: after it no setting can change). Parameters are
bound exactly as clickhouse-connect binds them (server-side ``{name:Type}``).
``LowCardinality`` columns leave ClickHouse as Arrow dictionaries (its
conversion of them to plain strings is slow) and are decoded here, so the
batches have exactly the types of the driver's Arrow (plain strings).
Not thread-safe; one per reader.
"""

from __future__ import annotations

import os
import queue
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rewardflow.clickhouse.allocator import configure_engine_allocator
from rewardflow.clickhouse.bytequeue import ByteQueue
from rewardflow.clickhouse.ddl import quote_ident
from rewardflow.clickhouse.errors import QueryError, clean_message, error_code


class ChdbArrowStream:
    """Arrow record batches of read statements on the chDB engine at ``path`` (owned by this process).

    Each running stream has a handle of its own, taken from a pool and given back when the stream
    ends, so streams may run side by side (the owner's read endpoint serves one per request thread).
    With ``max_block_bytes``, a block of the result larger than that ends its stream with a QueryError,
    and the blocks read ahead hold at most that many bytes together.
    """

    def __init__(self, path: Path, database: str | None, settings: Mapping[str, Any],
                 max_block_bytes: int | None = None) -> None:
        self._path = path
        self._max_block_bytes = max_block_bytes
        self._database = database
        self._settings = dict(settings)
        self._lock = threading.Lock()
        self._idle: list[Any] = []
        self._running: dict[int, Any] = {}  # id(result) -> the streaming result, while it is read
        self._closed = False

    def _open_handle(self) -> Any:
        return open_handle(self._path, self._database, self._settings)

    def _take(self) -> Any:
        with self._lock:
            if self._closed:
                raise QueryError("the reader is closed")
            if self._idle:
                return self._idle.pop()
        return self._open_handle()

    def _give_back(self, conn: Any) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    def stream(self, sql: str, parameters: Mapping[str, Any] | None = None,
               cancel: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        """Run ``sql`` (already checked read-only) and yield its batches in order (a result without rows:
        one empty batch of its columns); errors as QueryError.

        A stream cut short by :meth:`close`, or by ``cancel`` set (noticed within 0.2 s, also while the
        engine has no batch yet), raises instead of ending: a caller must never take that for the end
        of the rows.
        """
        query, params = bind(sql, parameters)
        tag = f"rf-stream-{secrets.token_hex(8)}"  # (a comment before the statement: how its kill finds it;
        # the engine keeps the first 100,000 characters of a statement's text)
        conn = self._take()
        result: Any = None
        pump: _Pump | None = None
        try:
            try:
                result = conn.send_query(f"/* {tag} */ {query}", "ArrowStream", params=params)
            except Exception as exc:
                raise QueryError(clean_message(exc), error_code(exc)) from None
            with self._lock:
                self._running[id(result)] = result
            pump = _Pump(result, cancel, lambda: self._kill(tag), max_bytes=self._max_block_bytes)
            schema, rows = None, False
            for chunk in pump:
                stream = pa.ipc.open_stream(chunk)
                schema = stream.schema
                for batch in stream:
                    rows = True
                    yield _decoded(batch, self._max_block_bytes)
            if not rows and schema is not None:  # a result without rows still has its columns
                yield _decoded(pa.RecordBatch.from_pylist([], schema=schema))
            with self._lock:
                if id(result) not in self._running:
                    raise QueryError("the stream was closed before its end (reader closed)") from None
        finally:
            # end the query before the handle is reused or closed (a stream left open makes the
            # handle answer the next query with nothing; one cancelled after its handle closed hangs)
            if pump is not None:
                pump.stop()
            if result is not None:
                with self._lock:
                    self._running.pop(id(result), None)
                result.close()
            self._give_back(conn)

    def _kill(self, tag: str) -> None:
        """Stop the engine's query whose text carries ``tag`` (a streaming result cannot be cancelled while
        its first block is computed: the cancel waits for it). A handle without ``readonly`` does it; the
        query id comes from the engine, the statement is this module's own."""
        conn = open_handle(self._path, None, {})
        try:
            ids = conn.query("SELECT query_id FROM system.processes WHERE position(query, {t:String}) > 0 "
                             "AND query_id != queryID()", "TabSeparated", params={"t": tag})
            for query_id in ids.bytes().decode().split():
                conn.query("KILL QUERY WHERE query_id = {q:String} ASYNC", "TabSeparated", params={"q": query_id})
        finally:
            conn.close()

    def close(self) -> None:
        """Cut the running streams short and close the handles (busy ones when their stream ends). Idempotent."""
        with self._lock:
            self._closed = True
            running, self._running = list(self._running.values()), {}
            idle, self._idle = self._idle, []
        for result in running:
            result.close()
        for conn in idle:
            conn.close()


def open_handle(path: Path, database: str | None, settings: Mapping[str, Any]) -> Any:
    """A chDB connection handle on the engine at ``path`` (owned by this process), in ``database``,
    with the streaming settings and then ``settings`` applied. The caller closes it."""
    configure_engine_allocator()
    import chdb

    conn = chdb.connect(os.path.realpath(path))  # type: ignore[no-untyped-call]
    try:
        if database:
            conn.query(f"USE {quote_ident(database)}", "TabSeparated")
        for key, value in {**_STREAM_SETTINGS, **settings}.items():
            conn.query(f"SET {key} = {_literal(value)}", "TabSeparated")
    except Exception:
        conn.close()
        raise
    return conn


def bind(sql: str, parameters: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """``sql`` and its parameters as chDB's ``send_query`` takes them, bound exactly as
    clickhouse-connect binds them (server-side ``{name:Type}``)."""
    from clickhouse_connect.driver.binding import bind_query

    query, bound = bind_query(sql, dict(parameters or {}))
    assert isinstance(query, str)  # bytes only when binding binary insert data
    return query, {k.removeprefix("param_"): v for k, v in bound.items()}


class _Pump:
    """Fetches a streaming result's chunks in a thread of its own, a few ahead of the reader.

    The engine formats the next block while the caller decodes this one (both release the
    GIL), which is about 10% of an export on two cores. The blocks fetched ahead hold at most
    ``max_bytes`` together (one larger block alone), and a block over ``max_bytes`` ends the stream
    with a QueryError in its place. Iterating yields each chunk's bytes in
    order; an engine error is raised there as QueryError. Until :meth:`stop` returns only the
    pump thread iterates the result (:meth:`ChdbArrowStream.close` may still close it from
    another thread, which ends the iteration, as it did before the pump).
    """

    _END = object()

    def __init__(self, result: Any, cancel: threading.Event | None = None, kill: Callable[[], None] | None = None,
                 depth: int = 4, max_bytes: int | None = None) -> None:
        self._result, self._cancel, self._kill, self._max_bytes = result, cancel, kill, max_bytes
        self._queue = ByteQueue(depth, max_bytes if max_bytes is not None else 1 << 62)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chdb-arrow-pump", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        item: Any = self._END
        try:
            for chunk in self._result:
                if self._stopping.is_set():
                    break
                buf = _buffer(chunk)
                if self._max_bytes is not None and buf.size > self._max_bytes:
                    item = block_too_large(buf.size, self._max_bytes)
                    break
                self._put(buf)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, raised there
            item = QueryError(clean_message(exc), error_code(exc))
        self._put(item)

    def _put(self, item: Any) -> None:
        while not self._stopping.is_set():
            try:
                self._queue.put(item, item.size if isinstance(item, pa.Buffer) else 0, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[pa.Buffer]:
        while True:
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                if self._cancel is not None and self._cancel.is_set():
                    if self._kill is not None:
                        self._kill()  # (the pump's fetch then ends with the engine's QUERY_WAS_CANCELLED)
                    raise QueryError("the query was cancelled (its client left)") from None
                continue
            if item is self._END:
                return
            if isinstance(item, QueryError):
                raise item
            yield item

    def stop(self) -> None:
        """Stop fetching and wait for the thread (at most the chunk being fetched). Idempotent."""
        self._stopping.set()
        self._thread.join()


def _buffer(chunk: Any) -> pa.Buffer:
    """The chunk's bytes as an Arrow buffer, without a copy.

    chDB's ``get_memview()`` object holds a shared pointer to the chunk's memory, but the
    memoryview its ``view()`` returns does not hold that object; the buffer does (``base``), so
    the memory lives as long as any batch read from it.
    """
    owner = chunk.get_memview()
    view = owner.view()
    if not len(view):
        return pa.py_buffer(b"")
    return pa.foreign_buffer(pa.py_buffer(view).address, len(view), base=owner)


_STREAM_SETTINGS: dict[str, Any] = {"output_format_arrow_low_cardinality_as_dictionary": 1,
                                    "output_format_arrow_compression_method": "none"}


def block_too_large(size: int, cap: int) -> QueryError:
    """The error that stops a query whose block of ``size`` bytes is over ``cap``."""
    return QueryError(f"a block of the result is {size / 1e6:,.1f} MB, over the {cap / 1e6:,.1f} MB one may take "
                      "(REWARDFLOW_READ_MAX_BLOCK_BYTES): select narrower rows, or fewer of them in one row")


def decoded_size(batch: pa.RecordBatch) -> int:
    """The bytes ``batch`` takes once its dictionary columns are decoded (each value's bytes where it
    is used, and an offset a row), without decoding them: a column of few long values repeated takes
    little encoded and all of it decoded."""
    size = 0
    for column in batch.columns:
        if not pa.types.is_dictionary(column.type):
            size += column.nbytes
            continue
        values = column.dictionary
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type) \
                or pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
            lengths = pc.binary_length(values)
        else:
            lengths = pa.array([values.nbytes // max(1, len(values))] * len(values), pa.int64())
        size += (pc.sum(pc.take(lengths, column.indices)).as_py() or 0) + 8 * len(column)
    return size


def _decoded(batch: pa.RecordBatch, max_bytes: int | None = None) -> pa.RecordBatch:
    """``batch`` with its dictionary columns decoded to their value type (nullability kept). Raises
    QueryError when it would take over ``max_bytes`` decoded (:func:`decoded_size`, asked first)."""
    if not any(pa.types.is_dictionary(f.type) for f in batch.schema):
        return batch
    if max_bytes is not None and (size := decoded_size(batch)) > max_bytes:
        raise block_too_large(size, max_bytes)
    fields, columns = [], []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_dictionary(field.type):
            column = column.dictionary_decode()
            field = pa.field(field.name, column.type, field.nullable, field.metadata)
        fields.append(field)
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields, batch.schema.metadata))


def _literal(value: Any) -> str:
    return str(value) if isinstance(value, int) else "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
