"""What the edge does with one request body, as pure functions: decode, admit, correct, redact.

A request is ``{"sent_at": <client clock at send, epoch ms>, "events": [<event>, …]}`` (JSON,
optionally gzip), each event in the contract of ``schemas/``. :func:`inflate` undoes gzip and
:func:`decode_json` parses the document; both raise :class:`Refused` (400 malformed, 413 too large,
415 another encoding). :func:`admit` judges each event with the contract's own validator and
returns the events to produce, grouped by session in request order, and the rejected ones by
index with field and reason; valid events of a partly bad request are kept.

Tenancy: the key decides the org. An event without ``org_id`` gets the key's; an event naming
another org makes the whole request :class:`Refused` (403): a client that mixes tenants is
misconfigured or hostile, and nothing of it is produced.

Clock correction: when the client's ``sent_at`` is more than ``tolerance_ms`` away from the
edge's ``received_at``, every event's time becomes ``received_at − (sent_at − ts)`` and the
client's ``ts`` is kept as ``client_ts``. A laptop whose clock is hours off still lands its
events at the right time; an honest clock's events are left exactly as sent.

Contract: pure, no I/O; deterministic given its arguments.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from pydantic import TypeAdapter, ValidationError

from rewardflow.collector.redact import redact
from rewardflow.events.errors import InvalidEvent
from rewardflow.events.models import Envelope, FollowUp
from rewardflow.events.validate import max_length, shown, validate_event

_EPOCH_MS: TypeAdapter[int] = TypeAdapter(Annotated[int, *Envelope.model_fields["ts"].metadata])  # the schema's ts rule
_TEXT_MAX = max_length(FollowUp, "text_redacted")  # a scrubbed text stays within the schema's limit


def _epoch_ms(value: Any) -> bool:
    """Whether ``value`` is a time the contract accepts as ``ts`` (the same rule, from schemas/)."""
    try:
        _EPOCH_MS.validate_python(value)
    except ValidationError:
        return False
    return True


class Refused(Exception):
    """The whole request is refused with ``status``; ``str()`` says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Rejection:
    """One event the edge refused: its index in the request, the field and the reason."""

    index: int
    field: str
    reason: str


@dataclass
class Admitted:
    """The outcome of :func:`admit`."""

    sessions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # session -> events, request order
    rejected: list[Rejection] = field(default_factory=list)
    redacted: Counter[str] = field(default_factory=Counter)
    corrected_ms: int = 0  # the clock offset applied (0 = none)

    @property
    def accepted(self) -> int:
        return sum(len(v) for v in self.sessions.values())


EVENTS_SHAPE = '{"sent_at": …, "events": […]}'


def inflate(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The body as sent before ``Content-Encoding``; gzip is inflated up to ``max_bytes`` (a bomb is
    refused, not inflated)."""
    if encoding not in (None, "", "identity", "gzip"):
        raise Refused(415, f"Content-Encoding {shown(encoding, 32)!r}: send identity or gzip")
    if len(body) > max_bytes:
        raise Refused(413, f"body of {len(body):,} bytes; at most {max_bytes:,}")
    if encoding == "gzip":
        inflater = zlib.decompressobj(wbits=31)
        try:
            body = inflater.decompress(body, max_bytes + 1)
        except zlib.error as exc:
            raise Refused(400, f"body: not valid gzip ({exc})") from None
        if len(body) > max_bytes or inflater.unconsumed_tail:
            raise Refused(413, f"body inflates beyond {max_bytes:,} bytes")
    return body


def decode_json(body: bytes, shape: str = "{…}") -> dict[str, Any]:
    """A JSON object, or :class:`Refused` (400) naming the ``shape`` expected."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Refused(400, f"body: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise Refused(400, f"body: expected an object {shape}")
    return doc


def admit(doc: dict[str, Any], org_id: str, received_at: int, *, max_events: int, tolerance_ms: int,
          max_record_bytes: int | None = None) -> Admitted:
    """Judge every event of ``doc`` for a key of ``org_id``; raises :class:`Refused` for the whole request.
    An event that, as the edge produces it, alone encodes to more than ``max_record_bytes`` (a record the
    worker takes) is rejected with field ``<event>``; the request's other events are kept."""
    events, sent_at = doc.get("events"), doc.get("sent_at")
    unknown = set(doc) - {"events", "sent_at"}
    if unknown:
        raise Refused(400, f"{sorted(unknown)[0]}: unknown field; a request has sent_at and events")
    if not isinstance(events, list) or not events:
        raise Refused(400, "events: expected a non-empty list of events")
    if len(events) > max_events:
        raise Refused(413, f"events: {len(events):,} in one request; at most {max_events:,}")
    if "sent_at" not in doc:
        raise Refused(400, "sent_at: missing; the client's clock at send time in epoch milliseconds")
    if not _epoch_ms(sent_at) or type(sent_at) is not int:  # (the second test tells mypy what the first did)
        raise Refused(400, f"sent_at: expected the client's clock at send time in epoch milliseconds, got {shown(sent_at, 32)}")
    foreign = [i for i, e in enumerate(events) if isinstance(e, dict) and e.get("org_id", org_id) != org_id]
    if foreign:
        listed = ", ".join(map(str, foreign[:10])) + (" …" if len(foreign) > 10 else "")
        raise Refused(403, f"events [{listed}] name an org_id other than this key's ({org_id}); nothing was accepted")
    offset = sent_at - received_at if abs(sent_at - received_at) > tolerance_ms else 0
    out = Admitted(corrected_ms=offset)
    for i, raw in enumerate(events):
        try:
            event = _admit_one(raw, i, org_id, offset, out.redacted)
        except InvalidEvent as exc:
            out.rejected.append(Rejection(i, exc.field, str(exc).split(": ", 1)[-1]))
            continue
        if max_record_bytes is not None and (size := len(orjson.dumps(event))) > max_record_bytes:
            out.rejected.append(Rejection(i, "<event>", f"encodes to {size:,} bytes; a record holds at most "
                                                        f"{max_record_bytes:,} (REWARDFLOW_MAX_RECORD_BYTES)"))
            continue
        out.sessions.setdefault(event["session_id"], []).append(event)
    return out


def free_text_chars(events: list[Any]) -> int:
    """Characters of free text (``text_redacted``, what :func:`admit` scrubs) in a request's events as sent."""
    total = 0
    for e in events:
        text = e.get("text_redacted") if isinstance(e, dict) else None
        if isinstance(text, str):
            total += len(text)
    return total


def _admit_one(raw: Any, i: int, org_id: str, offset: int, redacted: Counter[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidEvent("<event>", f"expected an object, got {type(raw).__name__}", index=i)
    if raw.get("client_ts") is not None:
        raise InvalidEvent("client_ts", "set by the edge, not by clients", index=i)
    event = {**raw, "org_id": org_id} if "org_id" not in raw else dict(raw)
    event.pop("client_ts", None)
    validate_event(event, i)  # the event as sent is what goes on (the worker validates it again)
    if offset:
        corrected = event["ts"] - offset
        if not _epoch_ms(corrected):
            raise InvalidEvent("ts", "out of range once corrected for the client's clock (check sent_at)", index=i)
        event["client_ts"], event["ts"] = event["ts"], corrected
    text = event.get("text_redacted")
    if isinstance(text, str) and text:
        event["text_redacted"], found = redact(text, _TEXT_MAX)
        redacted.update(found)
    return event
