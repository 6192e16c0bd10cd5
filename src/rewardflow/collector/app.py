"""The edge's routes: ``POST /v1/events``, ``GET /healthz``, ``GET /metrics``.

``POST /v1/events`` with ``Authorization: Bearer rfk_…``:

* 401 no key, unknown or revoked key; 403 an event of another org; 413 body or event count over
  the limits; 415 an encoding other than gzip; 400 a malformed body; 429 the key's rate is spent
  (``Retry-After``); 503 Kafka did not acknowledge (``Retry-After``; retry with the same event ids).
* 202 ``{"accepted": n, "rejected": [{"index", "field", "reason"}…]}`` once Kafka acknowledged every
  accepted event; rejected events are not produced, the valid ones of the same request are.
* Every refusal's body is ``{"error": "<why>"}``.

The events route is the edge's hot path: :class:`EdgeApp` serves it straight on ASGI (one
:class:`Ingest` call per request, no framework routing); every other path goes to a small FastAPI
app. Contract: the routes never raise to the server; each request is judged by
:mod:`rewardflow.collector.edge` (pure) and produced by :class:`~.kafka.AckingProducer`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rewardflow.collector.edge import Refused, admit, decode_body
from rewardflow.collector.kafka import AckingProducer, KafkaUnavailable
from rewardflow.collector.keys import KeyCache
from rewardflow.collector.limits import EdgeMetrics, RateLimiter, retry_after
from rewardflow.events.models import EVENT_MODELS
from rewardflow.settings import Settings

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Answer = tuple[int, dict[str, Any], dict[str, str]]  # status, JSON body, extra headers

EVENTS_PATH = "/v1/events"
_FIELDS = frozenset({"<event>", "event_type"} | {f for m in EVENT_MODELS.values() for f in m.model_fields})


class BodyTooLarge(Exception):
    """The request body went over the limit while it was read."""


class Disconnected(Exception):
    """The client went away before its body was read; nothing is answered."""


class Ingest:
    """``POST /v1/events`` without a framework: headers and a body reader in, an :data:`Answer` out."""

    def __init__(self, settings: Settings, keys: KeyCache, producer: AckingProducer, metrics: EdgeMetrics) -> None:
        self.settings, self.keys, self.producer, self.metrics = settings, keys, producer, metrics
        self.limiter = RateLimiter(settings.collect_rate_events_per_s, settings.collect_rate_burst)

    def _refuse(self, status: int, message: str, headers: dict[str, str] | None = None,
                events: int = 0, reason: str = "") -> Answer:
        self.metrics.requests.labels(str(status)).inc()
        if events:
            self.metrics.events.labels(reason or str(status)).inc(events)
        return status, {"error": message}, headers or {}

    async def __call__(self, headers: dict[bytes, bytes], read_body: Callable[[int], Awaitable[bytes]]) -> Answer:
        """Judge and produce one request. ``read_body(limit)`` raises :class:`BodyTooLarge` past ``limit``
        (answered 413) or :class:`Disconnected` (raised on to the caller)."""
        received_at = int(time.time() * 1000)
        s = self.settings
        auth = headers.get(b"authorization", b"").decode("latin-1")
        secret = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        found = self.keys.org_of(secret) if secret else None
        if found is None and secret:  # a key created a moment ago: look again once
            await asyncio.get_running_loop().run_in_executor(
                self.keys.miss_executor, self.keys.refresh_after_miss, time.monotonic())
            found = self.keys.org_of(secret)
        if found is None:
            return self._refuse(401, "missing, unknown or revoked key: send Authorization: Bearer rfk_…")
        key_id, org_id = found
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > s.collect_max_body_bytes:
            return self._refuse(413, f"body of {int(declared):,} bytes; at most {s.collect_max_body_bytes:,}")
        try:
            body = await read_body(s.collect_max_body_bytes)
        except BodyTooLarge:
            return self._refuse(413, f"body over {s.collect_max_body_bytes:,} bytes")
        encoding = headers.get(b"content-encoding")
        try:
            doc = decode_body(body, None if encoding is None else encoding.decode("latin-1"), s.collect_max_body_bytes)
            n = len(doc["events"]) if isinstance(doc.get("events"), list) else 0
            wait = self.limiter.take(key_id, n) if n <= s.collect_max_events else 0.0
            if wait:
                return self._refuse(429, f"key {key_id} is over its rate of {s.collect_rate_events_per_s:g} events/s",
                                    {"Retry-After": retry_after(wait)}, n, "rate_limited")
            judged = admit(doc, org_id, received_at, max_events=s.collect_max_events,
                           tolerance_ms=s.collect_clock_tolerance_ms)
        except Refused as exc:
            return self._refuse(exc.status, str(exc))
        for kind, count in judged.redacted.items():
            self.metrics.redacted.labels(kind).inc(count)
        for r in judged.rejected:  # a client names any field it likes: only the contract's become labels
            self.metrics.events.labels(f"invalid:{r.field if r.field in _FIELDS else 'other'}").inc()
        if judged.sessions:
            try:
                self.metrics.ack.observe(await self.producer.send(judged.sessions))
            except KafkaUnavailable as exc:
                return self._refuse(503, f"{exc}; retry with the same event ids", {"Retry-After": "2"},
                                    judged.accepted, "kafka_unavailable")
        self.metrics.events.labels("accepted").inc(judged.accepted)
        self.metrics.requests.labels("202").inc()
        return 202, {"accepted": judged.accepted, "rejected": [asdict(r) for r in judged.rejected],
                     "clock_offset_ms": judged.corrected_ms}, {}


class EdgeApp:
    """The collector's ASGI app: ``POST /v1/events`` to :class:`Ingest`, every other request to ``rest``."""

    def __init__(self, ingest: Ingest, rest: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.ingest, self.rest = ingest, rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != EVENTS_PATH:
            await self.rest(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _respond(send, 405, {"error": f"{scope['method']} {EVENTS_PATH}: only POST"}, {"Allow": "POST"})
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
            answer = await self.ingest(dict(scope["headers"]), read_body)
        except Disconnected:
            return
        await _respond(send, *answer)


async def _respond(send: Send, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
    data = orjson.dumps(body)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
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

    return EdgeApp(Ingest(settings, keys, producer, metrics), rest)
