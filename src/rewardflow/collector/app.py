"""The edge's routes: ``POST /v1/events``, ``GET /healthz``, ``GET /metrics``.

``POST /v1/events`` with ``Authorization: Bearer rfk_…``:

* 401 no key, unknown or revoked key; 403 an event of another org; 413 body or event count over
  the limits; 415 an encoding other than gzip; 400 a malformed body; 429 the key's rate (of events, new
  sessions or free text) is spent (``Retry-After``); 503 Kafka did not acknowledge (``Retry-After``; retry with the same event ids).
* 202 ``{"accepted": n, "rejected": [{"index", "field", "reason"}…]}`` once Kafka acknowledged every
  accepted event; rejected events are not produced, the valid ones of the same request are.
* Every refusal's body is ``{"error": "<why>"}``.

``POST /v1/traces`` takes OTLP/HTTP trace exports (protobuf or JSON) with the same keys, limits and
statuses, and maps GenAI spans to events (:mod:`.traces`).

The ingest routes are the edge's hot path: :class:`EdgeApp` serves them straight on ASGI (one
:class:`Ingest` call per request, no framework routing); every other path goes to a small FastAPI
app. Contract: the routes never raise to the server; each request is judged by
:mod:`rewardflow.collector.edge` (pure) and produced by :class:`~.kafka.AckingProducer`.
"""

from __future__ import annotations

import asyncio
from functools import partial
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rewardflow.collector.edge import EVENTS_SHAPE, Admitted, Refused, admit, decode_json, free_text_chars, inflate
from rewardflow.collector.kafka import AckingProducer, KafkaUnavailable
from rewardflow.collector.keys import KeyCache
from rewardflow.collector.limits import EdgeMetrics, RateLimiter, SessionGate, contract_field, retry_after
from rewardflow.collector.records import RecordTooLarge
from rewardflow.collector.traces import traces
from rewardflow.settings import Settings

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Answer = tuple[int, dict[str, Any] | bytes, dict[str, str]]  # status, JSON body (or bytes), extra headers
ReadBody = Callable[[int], Awaitable[bytes]]

EVENTS_PATH, TRACES_PATH = "/v1/events", "/v1/traces"
INLINE_TEXT_CHARS = 2_048  # a request with more free text is judged off the event loop (~5 ms of scrubbing)


class BodyTooLarge(Exception):
    """The request body went over the limit while it was read."""


class Disconnected(Exception):
    """The client went away before its body was read; nothing is answered."""


class Ingest:
    """The ingest routes without a framework: headers and a body reader in, an :data:`Answer` out.

    ``read_body(limit)`` raises :class:`BodyTooLarge` past ``limit`` (answered 413) or
    :class:`Disconnected` (raised on to the caller). :meth:`events` serves ``POST /v1/events``;
    :mod:`.traces` serves ``POST /v1/traces`` with the same steps: :meth:`key`, :meth:`body`,
    :meth:`admit_rate`, :meth:`produce`.
    """

    def __init__(self, settings: Settings, keys: KeyCache, producer: AckingProducer, metrics: EdgeMetrics) -> None:
        self.settings, self.keys, self.producer, self.metrics = settings, keys, producer, metrics
        self.limiter = RateLimiter(settings.collect_rate_events_per_s, settings.collect_rate_burst)
        self.text_limiter = RateLimiter(settings.collect_rate_text_chars_per_s, settings.collect_rate_text_burst)
        self.session_gate = SessionGate(settings.collect_new_sessions_per_s, settings.collect_new_sessions_burst)

    def refuse(self, status: int, message: str, headers: dict[str, str] | None = None,
               events: int = 0, reason: str = "") -> Answer:
        """Count a refusal and answer it with ``{"error": message}``."""
        self.metrics.requests.labels(str(status)).inc()
        if events:
            self.metrics.events.labels(reason or str(status)).inc(events)
        return status, {"error": message}, headers or {}

    async def key(self, headers: dict[bytes, bytes]) -> tuple[str, str] | None:
        """``(key_id, org_id)`` of the request's bearer key; None when it has none that is active
        (answer :meth:`no_key`)."""
        auth = headers.get(b"authorization", b"").decode("latin-1")
        secret = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        found = self.keys.org_of(secret) if secret else None
        if found is None and secret:  # a key created a moment ago: look again once
            await asyncio.get_running_loop().run_in_executor(
                self.keys.miss_executor, self.keys.refresh_after_miss, time.monotonic())
            found = self.keys.org_of(secret)
        return found

    def no_key(self) -> Answer:
        return self.refuse(401, "missing, unknown or revoked key: send Authorization: Bearer rfk_…")

    async def body(self, headers: dict[bytes, bytes], read_body: ReadBody) -> bytes | Answer:
        """The body as sent, inflated when gzip; or its 413 / 415 / 400."""
        limit = self.settings.collect_max_body_bytes
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return self.refuse(413, f"body of {int(declared):,} bytes; at most {limit:,}")
        try:
            body = await read_body(limit)
        except BodyTooLarge:
            return self.refuse(413, f"body over {limit:,} bytes")
        encoding = headers.get(b"content-encoding")
        try:
            return inflate(body, None if encoding is None else encoding.decode("latin-1"), limit)
        except Refused as exc:
            return self.refuse(exc.status, str(exc))

    def admit_rate(self, key_id: str, n: int) -> Answer | None:
        """Take ``n`` events from the key's rate; its 429 when spent."""
        wait = self.limiter.take(key_id, n)
        if not wait:
            return None
        return self.refuse(429, f"key {key_id} is over its rate of {self.settings.collect_rate_events_per_s:g} events/s",
                           {"Retry-After": retry_after(wait)}, n, "rate_limited")

    def admit_text(self, key_id: str, events: list[Any], chars: int) -> Answer | None:
        """Take the request's ``chars`` of free text (:func:`free_text_chars`) from the key's text rate; its 413
        over the burst, its 429 when spent. Scrubbing is the edge's costliest step, so what one key sends of
        it is bounded apart from its events."""
        if not chars:
            return None
        s = self.settings
        if chars > s.collect_rate_text_burst:
            return self.refuse(413, f"{chars:,} characters of free text in one request; at most "
                                    f"{s.collect_rate_text_burst:,} (REWARDFLOW_COLLECT_RATE_TEXT_BURST)",
                               events=len(events), reason="text_too_large")
        wait = self.text_limiter.take(key_id, chars)
        if not wait:
            return None
        return self.refuse(429, f"key {key_id} is over its rate of {s.collect_rate_text_chars_per_s:g} characters of "
                                "free text a second (REWARDFLOW_COLLECT_RATE_TEXT_CHARS_PER_S); nothing was accepted",
                           {"Retry-After": retry_after(wait)}, len(events), "text_rate_limited")

    async def produce(self, key_id: str, judged: Admitted) -> Answer | None:
        """Count the judgement and produce its events; their 429 when they open sessions faster than the
        key may (:class:`~rewardflow.collector.limits.SessionGate`), their 503 when Kafka did not acknowledge."""
        for kind, count in judged.redacted.items():
            self.metrics.redacted.labels(kind).inc(count)
        for r in judged.rejected:  # a client names any field it likes: only the contract's become labels
            self.metrics.events.labels(f"invalid:{contract_field(r.field)}").inc()
        if judged.sessions:
            if wait := self.session_gate.take(key_id, judged.sessions):
                return self.refuse(429, f"key {key_id} is over its rate of {self.settings.collect_new_sessions_per_s:g} "
                                        "new sessions/s (REWARDFLOW_COLLECT_NEW_SESSIONS_PER_S); nothing was accepted",
                                   {"Retry-After": retry_after(wait)}, judged.accepted, "session_rate_limited")
            try:
                self.metrics.ack.observe(await self.producer.send(judged.sessions))
            except KafkaUnavailable as exc:
                return self.refuse(503, f"{exc}; retry with the same event ids", {"Retry-After": "2"},
                                   judged.accepted, "kafka_unavailable")
            except RecordTooLarge as exc:
                return self.refuse(413, f"{exc}; nothing was accepted", events=judged.accepted, reason="too_large")
        self.metrics.events.labels("accepted").inc(judged.accepted)
        return None

    async def events(self, headers: dict[bytes, bytes], read_body: ReadBody) -> Answer:
        """Judge and produce one ``POST /v1/events`` request."""
        received_at = int(time.time() * 1000)
        s = self.settings
        found = await self.key(headers)
        if found is None:
            return self.no_key()
        key_id, org_id = found
        body = await self.body(headers, read_body)
        if not isinstance(body, bytes):
            return body
        try:
            doc = decode_json(body, EVENTS_SHAPE)
            events = doc["events"] if isinstance(doc.get("events"), list) else []
            chars = free_text_chars(events)
            if len(events) <= s.collect_max_events:
                if (refused := self.admit_rate(key_id, len(events))) is not None:
                    return refused
                if (refused := self.admit_text(key_id, events, chars)) is not None:
                    self.limiter.give_back(key_id, len(events))  # refused for its text: its events cost nothing
                    return refused
            judge = partial(admit, doc, org_id, received_at, max_events=s.collect_max_events,
                            tolerance_ms=s.collect_clock_tolerance_ms, max_record_bytes=s.max_record_bytes)
            # a request with much free text is judged off the event loop: scrubbing takes up to a second or two
            # of CPU, and the loop keeps serving other requests, acknowledgements and /healthz meanwhile (the
            # rest is judged in place: the hand-over to a thread costs 0.12-0.16 ms, about a small request's whole cost)
            judged = await asyncio.to_thread(judge) if chars > INLINE_TEXT_CHARS else judge()
        except Refused as exc:
            return self.refuse(exc.status, str(exc))
        if (failed := await self.produce(key_id, judged)) is not None:
            return failed
        self.metrics.requests.labels("202").inc()
        return 202, {"accepted": judged.accepted, "rejected": [asdict(r) for r in judged.rejected],
                     "clock_offset_ms": judged.corrected_ms}, {}


class EdgeApp:
    """The collector's ASGI app: each path of ``routes`` (POST only) to its handler, every other
    request to ``rest``."""

    def __init__(self, routes: dict[str, Callable[[dict[bytes, bytes], ReadBody], Awaitable[Answer]]],
                 rest: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.routes, self.rest = routes, rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            await self.rest(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _respond(send, 405, {"error": f"{scope['method']} {scope['path']}: only POST"}, {"Allow": "POST"})
            return

        async def read_body(limit: int) -> bytes:
            body: bytes = b""
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise Disconnected()
                body += message.get("body", b"")
                if len(body) > limit:
                    raise BodyTooLarge(f"over {limit}")
                if not message.get("more_body", False):
                    return body

        try:
            answer = await route(dict(scope["headers"]), read_body)
        except Disconnected:
            return
        await _respond(send, *answer)


async def _respond(send: Send, status: int, body: dict[str, Any] | bytes, headers: dict[str, str]) -> None:
    """A JSON body, or bytes whose ``Content-Type`` is among ``headers``."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    raw = [] if isinstance(body, bytes) else [(b"content-type", b"application/json")]
    raw += [(b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


def create_app(settings: Settings, keys: KeyCache, producer: AckingProducer, metrics: EdgeMetrics) -> EdgeApp:
    """The collector's ASGI app over its key cache, producer and metrics."""
    rest = FastAPI(title="rewardflow collector", description="The ingestion edge of rewardflow.", version="1",
                   docs_url=None, redoc_url=None, openapi_url=None)

    @rest.get("/healthz")  # async: served on the loop, never queued behind the thread pool
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "keys_loaded_s_ago": round(time.monotonic() - keys.loaded_at, 1)}

    @rest.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    ingest = Ingest(settings, keys, producer, metrics)
    return EdgeApp({EVENTS_PATH: ingest.events, TRACES_PATH: partial(traces, ingest)}, rest)
