"""``POST /v1/traces``: OTLP/HTTP trace exports in, GenAI spans produced as events.

The request is an ``ExportTraceServiceRequest``, ``Content-Type: application/x-protobuf`` or
``application/json`` (gzip accepted), with ``Authorization: Bearer rfk_…``. Spans are mapped by
:mod:`rewardflow.otlp.mapping`, validated with the contract's own code and produced like the
events of ``POST /v1/events``: the key decides the org, the key's rate counts every span, and
the answer comes only once Kafka acknowledged.

* 200 with an ``ExportTraceServiceResponse`` in the request's encoding; when spans were left out,
  ``partial_success`` holds their number and, in ``error_message``, the count of each reason.
* 401, 413, 415, 429 and 503 (``Retry-After``) as for events, 400 for a body that is not an export;
  their body is ``{"error": "<why>"}``.

Contract: never raises to the server; every span is either produced or counted, in the answer and in
``rewardflow_collect_spans{outcome}``.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from rewardflow.collector.edge import Admitted, Refused, admit, decode_json
from rewardflow.collector.limits import contract_field
from rewardflow.otlp.mapping import map_spans
from rewardflow.otlp.spans import BadExport, from_json, from_protobuf

if TYPE_CHECKING:
    from rewardflow.collector.app import Answer, Ingest, ReadBody

PROTOBUF, JSON = "application/x-protobuf", "application/json"
_TYPES = {PROTOBUF: PROTOBUF, "application/protobuf": PROTOBUF, JSON: JSON}


async def traces(ingest: Ingest, headers: dict[bytes, bytes], read_body: ReadBody) -> Answer:
    """Judge, map and produce one OTLP trace export."""
    received_at = int(time.time() * 1000)
    s = ingest.settings
    found = await ingest.key(headers)
    if found is None:
        return ingest.no_key()
    key_id, org_id = found
    declared = headers.get(b"content-type", b"").split(b";")[0].strip().lower().decode("latin-1")
    kind = _TYPES.get(declared)
    if kind is None:
        return ingest.refuse(415, f"Content-Type {declared[:64]!r}: send {PROTOBUF} or {JSON} (OTLP/HTTP)")
    body = await ingest.body(headers, read_body)
    if not isinstance(body, bytes):
        return body
    try:
        spans = from_protobuf(body) if kind == PROTOBUF else from_json(decode_json(body, '{"resourceSpans": […]}'))
    except (BadExport, Refused) as exc:
        return ingest.refuse(exc.status if isinstance(exc, Refused) else 400, str(exc))
    if len(spans) > s.collect_max_spans:
        return ingest.refuse(413, f"{len(spans):,} spans in one export; at most {s.collect_max_spans:,}")
    if spans and (refused := ingest.admit_rate(key_id, len(spans))) is not None:
        return refused  # every span costs, mapped or not: a key cannot flood the edge with spans it ignores
    mapped = map_spans(spans)
    judged = Admitted()
    if mapped.events:
        try:
            judged = admit({"sent_at": received_at, "events": mapped.events}, org_id, received_at,
                           max_events=len(mapped.events), tolerance_ms=s.collect_clock_tolerance_ms,
                           max_record_bytes=s.max_record_bytes)
        except Refused as exc:
            return ingest.refuse(exc.status, str(exc))
    left_out = mapped.unmapped + Counter(f"invalid:{contract_field(r.field)}" for r in judged.rejected)
    if (failed := await ingest.produce(key_id, judged)) is not None:
        return failed
    ingest.metrics.spans.labels("mapped").inc(judged.accepted)
    for reason, count in left_out.items():
        ingest.metrics.spans.labels(reason).inc(count)
    ingest.metrics.requests.labels("200").inc()
    response = ExportTraceServiceResponse()
    if left_out:
        response.partial_success.rejected_spans = sum(left_out.values())
        response.partial_success.error_message = "spans not mapped to events: " + ", ".join(
            f"{reason} {count}" for reason, count in sorted(left_out.items()))
    if kind == PROTOBUF:
        return 200, response.SerializeToString(), {"Content-Type": PROTOBUF}
    return 200, json_format.MessageToJson(response, indent=None).encode(), {"Content-Type": JSON}
