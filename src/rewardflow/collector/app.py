"""The edge's routes: ``POST /v1/events``, ``GET /healthz``, ``GET /metrics`` (FastAPI).

``POST /v1/events`` with ``Authorization: Bearer rfk_…``:

* 401 no key, unknown or revoked key; 403 an event of another org; 413 body or event count over
  the limits; 415 an encoding other than gzip; 400 a malformed body; 429 the key's rate is spent
  (``Retry-After``); 503 Kafka did not acknowledge (``Retry-After``; retry with the same event ids).
* 202 ``{"accepted": n, "rejected": [{"index", "field", "reason"}…]}`` once Kafka acknowledged every
  accepted event; rejected events are not produced, the valid ones of the same request are.
* Every refusal's body is ``{"error": "<why>"}``.

Contract: the routes never raise to the server; each request is judged by
:mod:`rewardflow.collector.edge` (pure) and produced by :class:`~.kafka.AckingProducer`.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from rewardflow.collector.edge import Refused, admit, decode_body
from rewardflow.collector.kafka import AckingProducer, KafkaUnavailable
from rewardflow.collector.keys import KeyCache
from rewardflow.events.models import EVENT_MODELS
from rewardflow.settings import Settings


_FIELDS = frozenset({"<event>", "event_type"} | {f for m in EVENT_MODELS.values() for f in m.model_fields})


class RateLimiter:
    """A token bucket of events per key: ``rate`` per second, up to ``burst`` at once. Thread-safe."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, n: int, now: float | None = None) -> float:
        """Take ``n`` events' worth; returns 0 when allowed, else the seconds until they would be."""
        now = time.monotonic() if now is None else now
        with self._lock:
            level, at = self._buckets.get(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - at) * self.rate)
            if n > level:
                self._buckets[key] = (level, now)
                return (n - level) / self.rate if n <= self.burst else math.inf
            self._buckets[key] = (level - n, now)
            return 0.0


class EdgeMetrics:
    """Prometheus metrics of one collector, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("rewardflow_collect_requests", "Requests by status.", ["status"], registry=self.registry)
        self.events = Counter("rewardflow_collect_events", "Events by outcome (accepted, or the reason refused).",
                              ["outcome"], registry=self.registry)
        self.redacted = Counter("rewardflow_collect_redacted", "Secret-looking tokens scrubbed from free text, by kind.",
                                ["kind"], registry=self.registry)
        self.ack = Histogram("rewardflow_collect_kafka_ack_seconds", "Time until Kafka acknowledged a request's records.",
                             registry=self.registry, buckets=(.002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10))


def _refuse(metrics: EdgeMetrics, status: int, message: str, headers: dict[str, str] | None = None,
            events: int = 0, reason: str = "") -> JSONResponse:
    metrics.requests.labels(str(status)).inc()
    if events:
        metrics.events.labels(reason or str(status)).inc(events)
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def create_app(settings: Settings, keys: KeyCache, producer: AckingProducer, metrics: EdgeMetrics) -> FastAPI:
    app = FastAPI(title="rewardflow collector", description="The ingestion edge of rewardflow.", version="1")
    limiter = RateLimiter(settings.collect_rate_events_per_s, settings.collect_rate_burst)

    @app.get("/healthz")  # async: served on the loop, never queued behind the thread pool
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "keys_loaded_s_ago": round(time.monotonic() - keys.loaded_at, 1)}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/events", status_code=202)
    async def events(request: Request) -> JSONResponse:
        received_at = int(time.time() * 1000)
        auth = request.headers.get("authorization", "")
        secret = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        found = keys.org_of(secret) if secret else None
        if found is None and secret:  # a key created a moment ago: look again once
            await asyncio.get_running_loop().run_in_executor(keys.miss_executor, keys.refresh_after_miss, time.monotonic())
            found = keys.org_of(secret)
        if found is None:
            return _refuse(metrics, 401, "missing, unknown or revoked key: send Authorization: Bearer rfk_…")
        key_id, org_id = found
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.collect_max_body_bytes:
            return _refuse(metrics, 413, f"body of {int(declared):,} bytes; at most {settings.collect_max_body_bytes:,}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > settings.collect_max_body_bytes:
                return _refuse(metrics, 413, f"body over {settings.collect_max_body_bytes:,} bytes")
        try:
            doc = decode_body(bytes(body), request.headers.get("content-encoding"), settings.collect_max_body_bytes)
            n = len(doc["events"]) if isinstance(doc.get("events"), list) else 0
            wait = limiter.take(key_id, n) if n <= settings.collect_max_events else 0.0
            if wait:
                retry = "60" if math.isinf(wait) else str(max(1, math.ceil(wait)))
                return _refuse(metrics, 429, f"key {key_id} is over its rate of {settings.collect_rate_events_per_s:g} "
                               "events/s", {"Retry-After": retry}, n, "rate_limited")
            judged = admit(doc, org_id, received_at, max_events=settings.collect_max_events,
                           tolerance_ms=settings.collect_clock_tolerance_ms)
        except Refused as exc:
            return _refuse(metrics, exc.status, str(exc))
        for kind, count in judged.redacted.items():
            metrics.redacted.labels(kind).inc(count)
        for r in judged.rejected:  # a client names any field it likes: only the contract's become labels
            metrics.events.labels(f"invalid:{r.field if r.field in _FIELDS else 'other'}").inc()
        if judged.sessions:
            try:
                metrics.ack.observe(await producer.send(judged.sessions))
            except KafkaUnavailable as exc:
                return _refuse(metrics, 503, f"{exc}; retry with the same event ids", {"Retry-After": "2"},
                               judged.accepted, "kafka_unavailable")
        metrics.events.labels("accepted").inc(judged.accepted)
        metrics.requests.labels("202").inc()
        return JSONResponse({"accepted": judged.accepted, "rejected": [asdict(r) for r in judged.rejected],
                             "clock_offset_ms": judged.corrected_ms}, status_code=202)

    return app
