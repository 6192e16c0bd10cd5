"""The read endpoint's routes: authenticated, read-only, bounded (protocol: :mod:`rewardflow.clickhouse.remote`).

* Every route but ``/health`` needs a bearer token (:mod:`.tokens`); ``/cursor``
  moves only the cursors the token's role allows.
* A body over ``read_max_body_bytes`` is refused (413) before it is read whole.
* At most ``read_max_queries`` queries run at once, each in a thread of its own
  that streams Arrow IPC through a small bounded queue; one more gets 503 with
  ``Retry-After``. One token runs at most ``read_max_queries_per_token`` of them;
  one more of its own gets 429 with ``Retry-After``. A client that goes away (or
  whose connection the server closes: :mod:`.server`) stops its query at the next
  batch, and the engine stops any query at ``read_max_execution_s``.
* Statements pass the engine's :class:`~rewardflow.clickhouse.sqlguard.SqlGuard`
  and run with the read limits (:func:`~rewardflow.clickhouse.readonly.read_settings`).

Contract: :func:`create_app` builds the ASGI app over a :class:`ReadService`; the
routes never raise to the server (every failure is a status with a one-line body).
"""

from __future__ import annotations

import io
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pyarrow as pa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from rewardflow.clickhouse.connect import local_reader
from rewardflow.clickhouse.ddl import quote_ident
from rewardflow.clickhouse.dsn import Dsn
from rewardflow.clickhouse.errors import QueryError, clean_message, is_driver_error
from rewardflow.clickhouse.readers import CursorError, LocalReader
from rewardflow.clickhouse.readonly import ReadOnlyViolation
from rewardflow.clickhouse.remote import ARROW_STREAM, SERVICE
from rewardflow.readapi.tokens import Grant, TokenStore
from rewardflow.settings import Settings

_MAX_PARAMETERS = 256
_END = object()


class ReadService:
    """What the routes share: the engine's readers (a pool per database), the token store, the query slots."""

    def __init__(self, dsn: Dsn, settings: Settings) -> None:
        self.dsn, self.settings = dsn, settings
        self.tokens = TokenStore(settings.home)
        self._pools: dict[str | None, list[LocalReader]] = {}
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}  # token id -> its queries running now (absent: none)

    def take_slot(self, token_id: str) -> Response | None:
        """A query slot for a query of ``token_id``, or the response refusing it: 503 when every slot is
        taken, 429 when the token's own share is. Never blocks. A slot taken is given back by :meth:`give_slot`."""
        cap, share = self.settings.read_max_queries, self.settings.read_max_queries_per_token
        with self._lock:
            held = self._running.get(token_id, 0)
            if sum(self._running.values()) >= cap:
                return PlainTextResponse(f"{cap} queries are running; retry", 503, headers={"Retry-After": "1"})
            if held >= share:
                return PlainTextResponse(f"this token runs {held} queries, its share "
                                         "(REWARDFLOW_READ_MAX_QUERIES_PER_TOKEN); retry", 429, headers={"Retry-After": "1"})
            self._running[token_id] = held + 1
        return None

    def give_slot(self, token_id: str) -> None:
        with self._lock:
            left = self._running.get(token_id, 0) - 1
            if left > 0:
                self._running[token_id] = left
            else:
                self._running.pop(token_id, None)

    def borrow(self, database: str | None) -> LocalReader:
        """A reader of ``database`` no other request uses now (blocking: may open a connection)."""
        if database is not None:
            quote_ident(database)  # refuse anything but a plain name
        with self._lock:
            pool = self._pools.setdefault(database, [])
            if pool:
                return pool.pop()
        return local_reader(self.dsn.with_database(database), self.settings)

    def give_back(self, database: str | None, reader: LocalReader) -> None:
        with self._lock:
            self._pools.setdefault(database, []).append(reader)

    def close(self) -> None:
        with self._lock:
            for pool in self._pools.values():
                for reader in pool:
                    reader.close()
            self._pools.clear()


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


def create_app(service: ReadService) -> FastAPI:
    app = FastAPI(title="rewardflow read endpoint", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    limit = service.settings.read_max_body_bytes

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"service": SERVICE, "pid": os.getpid()})

    @app.post("/query")
    async def query(request: Request) -> Response:
        admitted = await _admitted(service, request, limit)
        if isinstance(admitted, Response):
            return admitted
        try:
            sql, parameters, database = _query_of(admitted[1], request.headers.get("content-type", ""))
        except ValueError as exc:
            return PlainTextResponse(str(exc), 400)
        token_id = admitted[0].token_id
        busy = service.take_slot(token_id)
        if busy is not None:
            return busy
        chunks: queue.Queue[Any] = queue.Queue(maxsize=4)
        stop = threading.Event()
        producer = threading.Thread(target=_run_query, args=(service, token_id, database, sql, parameters, chunks, stop),
                                    name="rewardflow-read-query", daemon=True)
        producer.start()
        first = await run_in_threadpool(_next_chunk, chunks, producer)
        if isinstance(first, Response):
            return first
        if first is _END:
            return PlainTextResponse("the query ended without a result", 500)
        return StreamingResponse(_drain(first, chunks, stop, producer), media_type=ARROW_STREAM)

    @app.post("/cursor")
    async def cursor(request: Request) -> Response:
        admitted = await _admitted(service, request, limit)
        if isinstance(admitted, Response):
            return admitted
        grant, body = admitted
        try:
            doc = orjson.loads(body)
            trainer, position, rows, filters = str(doc["trainer"]), int(doc["cursor"]), int(doc["rows"]), str(doc["filters"])
            database = doc.get("database")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return PlainTextResponse(f"the body must be {{trainer, cursor, rows, filters}}: {exc}"[:300], 400)
        if not grant.may_move(trainer):
            return PlainTextResponse(f"forbidden: this token may not move the cursor of {trainer[:128]!r}", 403)
        try:
            await run_in_threadpool(_advance, service, database, trainer, position, rows, filters)
        except (CursorError, ValueError) as exc:
            return PlainTextResponse(str(exc), 400)
        except QueryError as exc:
            return PlainTextResponse(str(exc), 400)
        return Response(status_code=204)

    @app.post("/keys")
    async def keys(request: Request) -> Response:
        """Ingestion keys, for ``rewardflow keys`` while this process owns the engine: the owner's token only."""
        admitted = await _admitted(service, request, limit)
        if isinstance(admitted, Response):
            return admitted
        grant, body = admitted
        if grant.role != "owner":
            return PlainTextResponse("forbidden: ingestion keys are managed with the owner's token", 403)
        try:
            doc = orjson.loads(body)
            result = await run_in_threadpool(_manage_keys, service, doc)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return PlainTextResponse(f"keys: {exc}"[:300], 400)
        return JSONResponse(result)

    @app.post("/checkpoints")
    async def checkpoints(request: Request) -> Response:
        """Checkpoint registrations, for ``rewardflow checkpoints`` while this process owns the engine: the
        owner's token only; 409 for a registration the registry refuses."""
        from rewardflow.lineage.registry import LineageError

        admitted = await _admitted(service, request, limit)
        if isinstance(admitted, Response):
            return admitted
        grant, body = admitted
        if grant.role != "owner":
            return PlainTextResponse("forbidden: checkpoints are registered with the owner's token", 403)
        try:
            doc = orjson.loads(body)
            result = await run_in_threadpool(_manage_checkpoints, service, doc)
        except LineageError as exc:
            return PlainTextResponse(str(exc), 409)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return PlainTextResponse(f"checkpoints: {exc}"[:300], 400)
        except Exception as exc:  # noqa: BLE001 - ClickHouse's error, one line to the client
            message = clean_message(exc) if is_driver_error(exc) else f"{type(exc).__name__}: {exc}"
            return PlainTextResponse(message[:500], 500)
        return JSONResponse(result)

    return app


def _manage_checkpoints(service: ReadService, doc: dict[str, Any]) -> Any:
    from rewardflow.clickhouse.connect import get_client
    from rewardflow.lineage.store import manage

    if not isinstance(doc, dict):
        raise TypeError("the body must be a JSON object")
    client = get_client(dsn=service.dsn.with_database(doc.get("database")))
    try:
        return manage(client, doc)
    finally:
        client.close()


def _manage_keys(service: ReadService, doc: dict[str, Any]) -> Any:
    from dataclasses import asdict

    from rewardflow.clickhouse.connect import get_client
    from rewardflow.collector.keys import IngestKeys

    client = get_client(dsn=service.dsn.with_database(doc.get("database")))
    try:
        keys = IngestKeys(client)
        action = doc["action"]
        if action == "create":
            info, secret = keys.create(str(doc["org"]), str(doc.get("name", "")))
            return {**asdict(info), "secret": secret}
        if action == "revoke":
            revoked = keys.revoke(str(doc["key_id"]))
            return asdict(revoked) if revoked is not None else None
        if action == "list":
            return [asdict(k) for k in keys.all()]
        raise ValueError(f"unknown action {str(action)[:32]!r}")
    finally:
        client.close()


async def _admitted(service: ReadService, request: Request, limit: int) -> tuple[Grant, bytes] | Response:
    """The request's grant and body, or the response refusing it: 401 before the body is read, 413."""
    grant = _authorized(service, request)
    if isinstance(grant, Response):
        return grant
    body = await _body(request, limit)
    return body if isinstance(body, Response) else (grant, body)


def _authorized(service: ReadService, request: Request) -> Grant | Response:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    grant = service.tokens.verify(token.strip()) if scheme.lower() == "bearer" else None
    if grant is None:
        why = "a bearer token is required" if not header else "the token is unknown or revoked"
        return PlainTextResponse(f"unauthorized: {why} (rewardflow tokens create)", 401,
                                 headers={"WWW-Authenticate": "Bearer"})
    return grant


async def _body(request: Request, limit: int) -> bytes | Response:
    """The request body, or 413 as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return PlainTextResponse(f"body of {declared} bytes exceeds the limit of {limit} (REWARDFLOW_READ_MAX_BODY_BYTES)", 413)
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return PlainTextResponse(f"body exceeds the limit of {limit} bytes (REWARDFLOW_READ_MAX_BODY_BYTES)", 413)
        parts.append(chunk)
    return b"".join(parts)


def _query_of(body: bytes, content_type: str) -> tuple[str, dict[str, Any], str | None]:
    if not content_type.startswith("application/json"):
        return body.decode("utf-8", "replace"), {}, None  # curl -d 'SELECT 1'
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON body: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("sql"), str):
        raise ValueError('the body must be {"sql": "...", "parameters": {...}, "database": "..."}')
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict) or len(parameters) > _MAX_PARAMETERS:
        raise ValueError(f"parameters must be an object of at most {_MAX_PARAMETERS} names")
    database = doc.get("database")
    if database is not None and not isinstance(database, str):
        raise ValueError("database must be a name")
    return doc["sql"], parameters, database


def _run_query(service: ReadService, token_id: str, database: str | None, sql: str, parameters: dict[str, Any],
               chunks: queue.Queue[Any], stop: threading.Event) -> None:
    """One query, in its own thread: the first item put is a Response (failed) or bytes, then bytes, then _END.
    A consumer that takes nothing for longer than the query may run stops it (a client gone unnoticed)."""
    deadline = time.monotonic() + service.settings.read_max_execution_s + 30

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.5)
                return True
            except queue.Full:
                if time.monotonic() > deadline:
                    stop.set()
        return False

    reader, clean = None, False  # a reader whose stream failed or was cut off is closed, not reused
    try:
        reader = service.borrow(database)
        batches = reader.stream_arrow(sql, parameters)
        first = next(batches, None)
        schema = first.schema if first is not None else reader.query_arrow(sql, parameters).schema
        sink = _Chunks()
        with pa.ipc.new_stream(sink, schema) as writer:
            for batch in _chain(first, batches):
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


def _next_chunk(chunks: queue.Queue[Any], producer: threading.Thread) -> Any:
    """The query thread's next item, or _END once that thread has ended with nothing left to take.

    Blocks a worker thread of the endpoint until then, never longer: an end marker the query thread
    could not put (it stopped first) must not keep that worker, and the endpoint has only so many.
    """
    while True:
        try:
            return chunks.get(timeout=0.5)
        except queue.Empty:
            if not producer.is_alive():
                try:
                    return chunks.get_nowait()
                except queue.Empty:
                    return _END


async def _drain(first: bytes, chunks: queue.Queue[Any], stop: threading.Event,
                 producer: threading.Thread) -> AsyncIterator[bytes]:
    """The response body: the query thread's chunks until it ends; stops the query if the client left."""
    try:
        yield first
        while (item := await run_in_threadpool(_next_chunk, chunks, producer)) is not _END:
            if isinstance(item, bytes):
                yield item
    finally:
        stop.set()  # (the query thread notices within half a second, and stops)


def _advance(service: ReadService, database: str | None, trainer: str, position: int, rows: int, filters: str) -> None:
    reader = service.borrow(database)
    try:
        reader.advance_cursor(trainer, position, rows, filters)
    finally:
        service.give_back(database, reader)
