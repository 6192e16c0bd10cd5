"""The two wire formats of a Kafka record, decoded by one function.

* ``avro``: Confluent framing — magic byte ``0``, a 4-byte big-endian schema
  id from the local catalogue, then Avro binary of one event or of an
  ``EventBatch`` (several events of one session).
* ``json``: UTF-8 JSON via orjson — one event object, or ``{"events": [...]}``.

The ``rf-format`` record header names the format. Without it the first byte
decides (``0`` → avro, ``{`` → json).

Contract: :func:`decode_record` is pure; it returns the plain event dicts (not yet
validated) of one session, at least one, or raises
:class:`~rewardflow.events.errors.DecodeError` with a stable ``code``. Encoders raise ``ValueError`` for data that does not fit the
schema; they never truncate.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Mapping, Sequence
from types import EllipsisType
from typing import Any, cast

import orjson
from fastavro import schemaless_reader, schemaless_writer

from rewardflow.events.catalogue import BATCH, NAMESPACE, Catalogue, default_catalogue
from rewardflow.events.errors import DecodeError

FORMAT_HEADER = "rf-format"
AVRO = "avro"
JSON = "json"
DEFAULT_MAX_RECORD_BYTES = 1_000_000
DEFAULT_MAX_BATCH_EVENTS = 500
_FRAME = struct.Struct(">bI")
_Pairs = Sequence[tuple[str, bytes | None]]


def record_format(headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes] | None) -> str | None:
    """The ``rf-format`` header of a record, or None."""
    if not headers:
        return None
    items: Iterable[tuple[str, bytes | None]]
    # a record's headers are a list of pairs: its type is tested first, as the ABC check costs more
    if type(headers) in (list, tuple) or not isinstance(headers, Mapping):
        items = cast(_Pairs, headers)
    else:
        items = headers.items()
    for key, value in items:
        if key == FORMAT_HEADER and value is not None:
            return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return None


def decode_record(
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes] | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    max_batch_events: int = DEFAULT_MAX_BATCH_EVENTS,
    catalogue: Catalogue | None = None,
    fmt: str | None | EllipsisType = ...,
) -> list[dict[str, Any]]:
    """Decode one record value into its event dicts, in order.

    ``fmt`` is the record's ``rf-format`` header when the caller read it already
    (:func:`record_format`; ``...``: read it from ``headers``). Raises ``DecodeError`` when the
    record as a whole cannot be read; a batch longer than ``max_batch_events`` is ``batch_too_large``.
    """
    if value is None or len(value) == 0:
        raise DecodeError("empty record value", code="not_an_event")
    if len(value) > max_bytes:
        raise DecodeError(f"record of {len(value)} bytes exceeds the {max_bytes}-byte limit", code="too_large")
    if fmt is ...:
        fmt = record_format(headers)
    if fmt is None:
        fmt = AVRO if value[0] == 0 else JSON if value[:1] in (b"{", b"[") else None
    batch_sid = None
    if fmt == AVRO:
        events, batch_sid = _decode_avro(value, catalogue or default_catalogue())
    elif fmt == JSON:
        events = _decode_json(value)
    else:
        raise DecodeError(f"unknown wire format {fmt!r} (header {FORMAT_HEADER} must be avro or json)", code="unknown_format")
    if len(events) > max_batch_events:
        raise DecodeError(f"batch of {len(events)} events exceeds the limit of {max_batch_events}", code="batch_too_large")
    if not events:
        raise DecodeError("the batch holds no event", code="empty_batch")
    first = batch_sid  # (a session id that is not a string is the event's own validation error)
    for e in events:
        sid = e.get("session_id") if type(e) is dict else None
        if type(sid) is str:
            if first is None:
                first = sid
            elif sid != first:
                if batch_sid is not None:
                    raise DecodeError(f"the EventBatch's session_id {batch_sid[:128]!r} differs from its events'",
                                      code="batch_session_mismatch")
                raise DecodeError("a record carries the events of one session; this one mixes session ids",
                                  code="mixed_sessions")
    return events


def _decode_avro(value: bytes, cat: Catalogue) -> tuple[list[dict[str, Any]], str | None]:
    """Frame, schema id, then the body, read by fastavro (with the current schema as reader when the writer's
    is older). Returns the events and, for an ``EventBatch``, the session id it names."""
    if len(value) < 5:
        raise DecodeError(f"avro frame of {len(value)} bytes is shorter than its 5-byte header", code="truncated_avro")
    magic, sid = _FRAME.unpack_from(value)
    if magic != 0:
        raise DecodeError(f"avro magic byte is {magic}, expected 0", code="bad_magic")
    entry = cat.by_id.get(sid)
    if entry is None:
        raise DecodeError(f"schema id {sid} is not in the local catalogue", code="unknown_schema_id")
    reader = cat.current[entry.name].parsed
    buf = io.BytesIO(value)
    buf.seek(5)
    try:
        obj = schemaless_reader(buf, entry.parsed, reader if reader is not entry.parsed else None, return_record_name=True)
    except UnicodeDecodeError as exc:  # a string cut short by the body's end, or one that is not UTF-8
        if exc.reason == "unexpected end of data" and buf.tell() >= len(value):
            raise DecodeError("avro body ends early (in a string)", code="truncated_avro") from None
        raise DecodeError(f"avro body holds a string that is not UTF-8 ({exc.reason}, byte {exc.start} of a "
                          f"{len(exc.object)}-byte string)", code="bad_avro") from None
    except (EOFError, StopIteration) as exc:
        raise DecodeError(f"avro body ends early ({exc.__class__.__name__})", code="truncated_avro") from None
    except Exception as exc:  # fastavro raises assorted errors on garbage
        if buf.tell() >= len(value):  # a short read of a fixed-size value (double, boolean) at the end
            raise DecodeError(f"avro body ends early ({exc.__class__.__name__})", code="truncated_avro") from None
        raise DecodeError(f"avro body unreadable: {exc.__class__.__name__}: {exc}"[:300], code="bad_avro") from None
    if buf.tell() != len(value):
        raise DecodeError(f"{len(value) - buf.tell()} trailing bytes after the avro body", code="bad_avro")
    if entry.name == BATCH:
        assert isinstance(obj, dict)
        out = []
        short_names: dict[str, str] = {}  # record full name -> short name (a batch holds few distinct types)
        for item in obj["events"]:
            if isinstance(item, tuple):  # (full name, record): the union's named branches
                name, record = item
                short = short_names.get(name)
                if short is None:
                    short = short_names[name] = name.rsplit(".", 1)[-1]
                if record.get("event_type") != short:
                    record = {**record, "event_type": short + "!" + str(record.get("event_type"))}
            else:
                record = item
            out.append(record)
        return out, obj.get("session_id")
    assert isinstance(obj, dict)
    if obj.get("event_type") != entry.name:
        obj["event_type"] = f"{entry.name}!{obj.get('event_type')}"
    return [obj], None


def _decode_json(value: bytes) -> list[dict[str, Any]]:
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc}"[:300], code="bad_json") from None
    if isinstance(obj, dict) and "events" in obj and "event_type" not in obj:
        obj = obj["events"]
    if isinstance(obj, dict):
        return [obj]
    if isinstance(obj, list) and all(isinstance(e, dict) for e in obj):
        return obj
    raise DecodeError("JSON must be an event object, a list of events or {\"events\": [...]}", code="not_an_event")


def encode_avro(events: Sequence[Mapping[str, Any]], *, batch_id: str | None = None, catalogue: Catalogue | None = None) -> bytes:
    """Frame one event (``len(events) == 1`` and no ``batch_id``) or a session batch as Avro."""
    cat = catalogue or default_catalogue()
    buf = io.BytesIO()
    if len(events) == 1 and batch_id is None:
        event = events[0]
        entry = cat.writer(str(event["event_type"]))
        buf.write(_FRAME.pack(0, entry.schema_id))
        schemaless_writer(buf, entry.parsed, event)
    else:
        entry = cat.writer(BATCH)
        buf.write(_FRAME.pack(0, entry.schema_id))
        record = {
            "batch_id": batch_id or str(events[0]["event_id"]),
            "session_id": str(events[0]["session_id"]),
            "events": [(f"{NAMESPACE}.{e['event_type']}", e) for e in events],
        }
        schemaless_writer(buf, entry.parsed, record)
    return buf.getvalue()


def encode_json(events: Sequence[Mapping[str, Any]]) -> bytes:
    """One event as an object, several as ``{"events": [...]}``."""
    if len(events) == 1:
        return orjson.dumps(events[0])
    return orjson.dumps({"events": list(events)})
