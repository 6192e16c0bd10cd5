"""The read endpoint's routes: authenticated, read-only, bounded (protocol: :mod:`rewardflow.clickhouse.remote`).

* Every route but ``/health`` and ``/hello`` needs a token's authority: a request signed with it
  (:mod:`.signing`, what readers send) or the token itself as a bearer token (:mod:`.tokens`);
  ``/cursor`` moves only the cursors the token's role allows.
* A body over ``read_max_body_bytes`` is refused (413) before it is read whole.
* At most ``read_max_queries`` queries run at once, each in a thread of its own
  that streams Arrow IPC through a small bounded queue (:mod:`.stream`); one more gets 503 with
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

import os
import re
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from rewardflow.clickhouse.errors import QueryError, clean_message, is_driver_error
from rewardflow.clickhouse.readers import CursorError
from rewardflow.clickhouse.remote import SERVICE, SIGNED
from rewardflow.readapi import signing
from rewardflow.readapi.service import ReadService
from rewardflow.readapi.stream import stream_query
from rewardflow.readapi.tokens import Grant

_MAX_PARAMETERS = 256
_NONCE = re.compile(r"[0-9a-f]{16,64}")


def create_app(service: ReadService) -> FastAPI:
    app = FastAPI(title="rewardflow read endpoint", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    limit = service.settings.read_max_body_bytes

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"service": SERVICE, "pid": os.getpid()})

    @app.post("/hello")
    async def hello(request: Request) -> Response:
        """The endpoint proves it keeps the client's token before the client sends it (no token needed)."""
        body = await _body(request, 1024, "")  # (a token id and a nonce: a fixed limit)
        if isinstance(body, Response):
            return body
        try:
            doc = orjson.loads(body)
            token_id, nonce = str(doc["token_id"])[:64], str(doc["nonce"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return PlainTextResponse('the body must be {"token_id": "...", "nonce": "..."}', 400)
        if _NONCE.fullmatch(nonce) is None:  # (a reader's: random hex; never a text of another MAC's form)
            return PlainTextResponse("the nonce must be 16 to 64 lowercase hex characters", 400)
        return JSONResponse({"service": SERVICE, "proof": service.tokens.proof(token_id, nonce)})

    @app.post("/query")
    async def query(request: Request) -> Response:
        admitted = await _admitted(service, request, limit, take=False)
        if isinstance(admitted, Response):
            return admitted
        try:
            sql, parameters, database = _query_of(admitted[1], request.headers.get("content-type", ""))
        except ValueError as exc:
            return PlainTextResponse(str(exc), 400)
        token_id = admitted[0].token_id
        busy = service.take_slot(token_id)
        if busy is not None:
            return busy  # (a signed request's nonce is not taken: the reader sends the same request again)
        refused = _take(service, admitted[2])
        if refused is not None:
            service.give_slot(token_id)
            return refused
        return await stream_query(service, request, token_id, database, sql, parameters)

    @app.post("/cursor")
    async def cursor(request: Request) -> Response:
        admitted = await _admitted(service, request, limit)
        if isinstance(admitted, Response):
            return admitted
        grant, body, _ = admitted
        try:
            doc = orjson.loads(body)
            trainer, position, rows, filters = str(doc["trainer"]), int(doc["cursor"]), int(doc["rows"]), str(doc["filters"])
            database = doc.get("database")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return PlainTextResponse(f"the body must be {{trainer, cursor, rows, filters}}: {exc}"[:300], 400)
        if not grant.may_move(trainer):
            return PlainTextResponse(f"forbidden: this token may not move the cursor of {trainer[:128]!r} (a token "
                                     f"that may: rewardflow tokens create --role trainer --trainer NAME)", 403)
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
        grant, body, _ = admitted
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
        grant, body, _ = admitted
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


async def _admitted(service: ReadService, request: Request, limit: int,
                    take: bool = True) -> tuple[Grant, bytes, signing.Signed | None] | Response:
    """The request's grant, body and signature (None for a bearer token), or the response refusing it:
    401 (before the body is read, but for a signature, which covers the body), 413. A signed request's
    nonce is taken here unless ``take`` is false; then the caller takes it (:func:`_take`) once nothing
    can refuse the request for being busy, which the reader retries with the same signature."""
    header = request.headers.get("authorization", "")
    signed = signing.parse(header)
    if signed is None:
        grant = _bearer(service, header)
        if isinstance(grant, Response):
            return grant
        body = await _body(request, limit)
        return body if isinstance(body, Response) else (grant, body, None)
    if (off := service.nonces.skew(signed.ts)) is not None:
        return _unauthorized(f"the request's time is {off:+.0f} s off this endpoint's clock (at most "
                             f"{service.nonces.window_s:g} s): check the reader's clock")
    body = await _body(request, limit)
    if isinstance(body, Response):
        return body
    found = service.tokens.signed(signed.token_id, request.url.path, signed.ts, signed.nonce,
                                  request.headers.get("content-type", ""), body, signed.sig)
    if found is None:
        return _unauthorized("the token is unknown or revoked, or the signature does not match the request")
    refused = _take(service, signed) if take else None
    return refused if refused is not None else (found, body, signed)


def _take(service: ReadService, signed: signing.Signed | None) -> Response | None:
    """Take a signed request's nonce: None, or the response refusing a copy (401), a token over its count
    (429) or a nonce the endpoint could not record (503)."""
    if signed is None:
        return None
    refused = service.nonces.take(signed.token_id, signed.nonce, signed.ts)
    if refused is None:
        return None
    if refused[0] in (429, 503):
        return PlainTextResponse(refused[1], refused[0], headers={"Retry-After": "5"})
    return _unauthorized(refused[1])


def _bearer(service: ReadService, header: str) -> Grant | Response:
    scheme, _, token = header.partition(" ")
    grant = service.tokens.verify(token.strip()) if scheme.lower() == "bearer" else None
    if grant is None:
        return _unauthorized("a bearer token is required" if not header else "the token is unknown or revoked")
    return grant


def _unauthorized(why: str) -> Response:
    return PlainTextResponse(f"unauthorized: {why} (rewardflow tokens create)", 401,
                             headers={"WWW-Authenticate": f"Bearer, {SIGNED}"})


async def _body(request: Request, limit: int, name: str = " (REWARDFLOW_READ_MAX_BODY_BYTES)") -> bytes | Response:
    """The request body, or 413 as soon as it is known to exceed ``limit`` (``name``: the limit's setting)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return PlainTextResponse(f"body of {declared} bytes exceeds the limit of {limit}{name}", 413)
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return PlainTextResponse(f"body exceeds the limit of {limit} bytes{name}", 413)
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


def _advance(service: ReadService, database: str | None, trainer: str, position: int, rows: int, filters: str) -> None:
    reader = service.borrow(database)
    try:
        reader.advance_cursor(trainer, position, rows, filters)
    finally:
        service.give_back(database, reader)
