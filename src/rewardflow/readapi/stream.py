"""A query's result streamed as Arrow IPC: the engine's batches in a thread of the query's own, through a
small queue bounded in bytes, to the response. A block of the result over ``READ_MAX_BLOCK_BYTES`` ends
the query: with the engine's read-ahead, a query holds a few times that in the process at most.

Contract: :func:`stream_query` takes a slot already taken for the query (``ReadService.take_slot``) and gives
it back when the query's thread ends, however it ends: the result read out, the query failed, or the client
gone (its response stopped, or nothing taken from the queue for longer than the query may run). A failure
before the first batch is the response itself (400, 403, 500 with one line); once the stream has begun, a
failure cuts the connection (the body never gets its last chunk, nor the Arrow stream its end marker).
"""

from __future__ import annotations

import io
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pyarrow as pa
from fastapi import Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from rewardflow.clickhouse.bytequeue import ByteQueue
from rewardflow.clickhouse.chdbarrow import block_too_large
from rewardflow.clickhouse.errors import QueryError
from rewardflow.clickhouse.readonly import ReadOnlyViolation
from rewardflow.clickhouse.remote import ARROW_STREAM
from rewardflow.readapi.service import ReadService

_END = object()
_WAITING = object()


async def stream_query(service: ReadService, request: Request, token_id: str, database: str | None, sql: str,
                       parameters: dict[str, Any]) -> Response:
    """The response of one query of ``token_id``, whose slot is taken: its Arrow stream, or its failure.
    A client that leaves before the first batch (an aggregation has none until it ends) stops the query
    within a second."""
    chunks = ByteQueue(4, service.settings.read_max_block_bytes)
    stop = threading.Event()
    producer = threading.Thread(target=_run_query, args=(service, token_id, database, sql, parameters, chunks, stop),
                                name="rewardflow-read-query", daemon=True)
    try:
        producer.start()
    except RuntimeError as exc:  # (no thread to be had)
        service.give_slot(token_id)
        return PlainTextResponse(f"cannot run the query now ({exc}); retry", 503, headers={"Retry-After": "1"})
    while (first := await run_in_threadpool(_next_chunk, chunks, producer, 0.5)) is _WAITING:
        if await request.is_disconnected():
            stop.set()  # (the query thread ends the engine's query, and gives the slot back)
            return PlainTextResponse("the client left", 400)
    if isinstance(first, Response):
        return first
    if first is _END:
        return PlainTextResponse("the query ended without a result", 500)
    return StreamingResponse(_drain(first, chunks, stop, producer), media_type=ARROW_STREAM)


class _Chunks(io.RawIOBase):
    """A write-only file that keeps what Arrow's stream writer writes, taken out by :meth:`take`."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out



def _run_query(service: ReadService, token_id: str, database: str | None, sql: str, parameters: dict[str, Any],
               chunks: ByteQueue, stop: threading.Event) -> None:
    """One query, in its own thread: the first item put is a Response (failed) or bytes, then bytes, then _END.
    A consumer that takes nothing for longer than the query may run stops it (a client gone unnoticed)."""
    deadline = time.monotonic() + service.settings.read_max_execution_s + 30
    cap = service.settings.read_max_block_bytes

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                chunks.put(item, len(item) if isinstance(item, bytes) else 0, timeout=0.5)
                return True
            except queue.Full:
                if time.monotonic() > deadline:
                    stop.set()
        return False

    reader, clean = None, False  # a reader whose stream failed or was cut off is closed, not reused
    try:
        reader = service.borrow(database)
        batches = reader.stream_arrow(sql, parameters, cancel=stop)
        first = next(batches, None)
        schema = first.schema if first is not None else reader.query_arrow(sql, parameters).schema
        sink = _Chunks()
        with pa.ipc.new_stream(sink, schema) as writer:
            for batch in _chain(first, batches):
                if batch.nbytes > cap:  # (chDB's stream refuses such a block before it reads ahead)
                    raise block_too_large(batch.nbytes, cap)
                writer.write_batch(batch)
                if not put(sink.take()):
                    getattr(batches, "close", lambda: None)()  # (a generator: ends the engine's stream)
                    return
        clean = put(sink.take())
    except ReadOnlyViolation as exc:
        clean = True  # (refused before it ran)
        put(PlainTextResponse(str(exc), 403))
    except (QueryError, ValueError) as exc:
        put(PlainTextResponse(str(exc), 400))
    except Exception as exc:  # noqa: BLE001 - one line to the client, the endpoint goes on
        put(PlainTextResponse(f"{type(exc).__name__}: {exc}"[:500], 500))
    finally:
        if reader is not None:
            if clean:
                service.give_back(database, reader)
            else:
                reader.close()
        service.give_slot(token_id)
        put(_END)  # (waits for room: a consumer still reading must see the end; one gone set ``stop``)


def _chain(first: pa.RecordBatch | None, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    if first is not None:
        yield first
        yield from rest


def _next_chunk(chunks: ByteQueue, producer: threading.Thread, wait_s: float | None = None) -> Any:
    """The query thread's next item, or _END once that thread has ended with nothing left to take, or
    _WAITING after ``wait_s`` (None: no limit) without either.

    Blocks a worker thread of the endpoint until then, never longer: an end marker the query thread
    could not put (it stopped first) must not keep that worker, and the endpoint has only so many.
    """
    while True:
        try:
            return chunks.get(timeout=0.5 if wait_s is None else wait_s)
        except queue.Empty:
            if wait_s is not None and producer.is_alive():
                return _WAITING
            if not producer.is_alive():
                try:
                    return chunks.get_nowait()
                except queue.Empty:
                    return _END


class StreamCut(RuntimeError):
    """A query failed after its answer had begun: the response is cut off, never ended as if whole."""


class OneLineCuts(logging.Filter):
    """The server's log of a :class:`StreamCut` as one line, without its traceback: any token holder
    can cause one (a query that fails midway), and a traceback a query would let one flood the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        cut = _cut_in(exc)
        if cut is not None:
            record.msg, record.args, record.exc_info, record.exc_text = "read query cut off: %s", (cut,), None, None
        return True


def _cut_in(exc: BaseException | None) -> StreamCut | None:
    """The StreamCut ``exc`` is, or holds (an exception group, or the cause of another), if any."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, StreamCut):
            return exc
        group = getattr(exc, "exceptions", None)
        if group:
            for inner in group:
                found = _cut_in(inner)
                if found is not None:
                    return found
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


async def _drain(first: bytes, chunks: ByteQueue, stop: threading.Event,
                 producer: threading.Thread) -> AsyncIterator[bytes]:
    """The response body: the query thread's chunks until it ends; stops the query if the client left.
    A failure once the body has begun raises :class:`StreamCut`, so the server drops the connection
    without the body's last chunk: the client sees a cut answer, never a shorter one that looks whole."""
    try:
        yield first
        while (item := await run_in_threadpool(_next_chunk, chunks, producer)) is not _END:
            if isinstance(item, bytes):
                yield item
            else:
                reason = bytes(getattr(item, "body", b"")).decode("utf-8", "replace")
                raise StreamCut(f"the query failed after its answer began: {reason}")
    finally:
        stop.set()  # (the query thread notices within half a second, and stops)
