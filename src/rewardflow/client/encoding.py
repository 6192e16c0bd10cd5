"""Per-event encoding and record framing of the two wire formats, for the producer's hot path.

Each event is encoded exactly once, when it is emitted, into the *piece* it
occupies inside a session batch record; a record is the batch's *head*
(built once when the batch opens) + the pieces + a tail. The bytes equal what
:func:`rewardflow.events.wire.encode_avro` (``batch_id`` given) and
:func:`~rewardflow.events.wire.encode_json` produce, so
:func:`~rewardflow.events.wire.decode_record` reads them:

* avro: piece = the event's branch index in the ``EventBatch`` union + the
  event's Avro body, written by fastavro from the event's schema. head = magic
  0, schema id, ``batch_id``, ``session_id``; then the array block count, the
  pieces, and the end-of-array byte.
* json: piece = ``orjson.dumps(event.__dict__)`` (nested models by their
  ``__dict__``); record = ``{"batch_id":…,"session_id":…,"events":[piece,piece,…]}``.

Contract: encoders are pure and take *validated* event models. ``piece``
raises ``ValueError``, ``TypeError`` or ``OverflowError`` for data that does not
fit the schema (an integer outside its Avro type included; the producer turns
that into ``InvalidEvent``); it never truncates or wraps.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import IO, Any, Protocol, cast

import orjson
from fastavro import schemaless_writer
from pydantic import BaseModel

from rewardflow.events.catalogue import BATCH, EVENT_TYPES, Catalogue, default_catalogue
from rewardflow.events.models import Envelope
from rewardflow.events.wire import AVRO, FORMAT_HEADER, JSON

_FRAME = struct.Struct(">bI")
MAX_VARINT = 10
Headers = list[tuple[str, str | bytes | None]]


Writer = Callable[[dict[str, Any]], bytes]
"""Encodes one event given its model's ``__dict__`` (cheaper to read than pydantic attributes)."""


def fields_of(event: Envelope | dict[str, Any]) -> dict[str, Any]:
    """The event (a model or its ``__dict__``) as a plain dict, equal to ``model_dump()`` at a fraction of its cost.

    A validated frozen model keeps its field values in ``__dict__``; only the
    nested ``producer`` model needs converting.
    """
    fields = dict(event if isinstance(event, dict) else event.__dict__)
    fields["producer"] = fields["producer"].__dict__
    return fields


def varint(n: int) -> bytes:
    """Zigzag varint of an Avro long (a length or a count here)."""
    if not -(1 << 63) <= n < 1 << 63:
        raise OverflowError(f"{n} does not fit an Avro long (64 bits)")
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def avro_string(text: str) -> bytes:
    data = text.encode()
    return varint(len(data)) + data


class EventEncoder(Protocol):
    """What the producer needs from a wire format."""

    format: str
    headers: Headers
    separator: bytes
    """Bytes between two pieces (the batcher counts one per piece against the record limit)."""
    tail: int
    """Upper bound of a record's bytes besides its head, its pieces and their separators."""
    writers: dict[str, Writer]
    """By event type: the function that turns a model's ``__dict__`` into its piece."""

    def piece(self, event: Envelope) -> bytes:
        """One event as it sits inside a batch record (``writers`` by its type, on its ``__dict__``)."""

    def head(self, batch_id: str, session_id: str) -> bytes:
        """The bytes a batch's record starts with."""

    def record(self, head: bytes, pieces: Sequence[bytes]) -> bytes:
        """The record value of a batch."""


class AvroBatchEncoder:
    """Pieces and ``EventBatch`` records in the Confluent-framed Avro format."""

    format = AVRO
    separator = b""
    tail = MAX_VARINT + 1

    def __init__(self, catalogue: Catalogue | None = None) -> None:
        cat = catalogue or default_catalogue()
        batch = cat.writer(BATCH)
        items = next(f for f in batch.parsed["fields"] if f["name"] == "events")["type"]["items"]
        names = [(i["name"] if isinstance(i, dict) else str(i)).rsplit(".", 1)[-1] for i in items]
        self.writers: dict[str, Writer] = {name: _fastavro_piece(cat.writer(name).parsed, varint(i))
                                           for i, name in enumerate(names)}
        self._frame = _FRAME.pack(0, batch.schema_id)
        self.headers: Headers = [(FORMAT_HEADER, AVRO.encode())]

    def piece(self, event: Envelope) -> bytes:
        fields = event.__dict__
        return self.writers[fields["event_type"]](fields)

    def head(self, batch_id: str, session_id: str) -> bytes:
        return self._frame + avro_string(batch_id) + avro_string(session_id)

    def record(self, head: bytes, pieces: Sequence[bytes]) -> bytes:
        return b"".join((head, varint(len(pieces)), *pieces, b"\x00"))


def _fastavro_piece(parsed: Any, branch: bytes) -> Writer:
    """fastavro's writer for one event type, with the union branch index in front.

    fastavro writes an ``int`` field's value whatever its size (a reader then sees another
    number); the range of each ``int`` field is checked here, so nothing is ever wrapped.
    """

    class Capture:  # file-like: fastavro writes each datum with one .write() call
        __slots__ = ("data",)

        def __init__(self) -> None:
            self.data: bytes | bytearray = b""

        def write(self, data: bytes | bytearray) -> None:
            self.data = data

    ints = _int_fields(parsed)

    def piece(fields: dict[str, Any]) -> bytes:
        for name in ints:
            value = fields.get(name)
            if type(value) is int and not _INT_MIN <= value <= _INT_MAX:
                raise OverflowError(f"{name}={value} does not fit an Avro int (32 bits)")
        capture = Capture()  # one per call: emit() encodes outside the producer's lock, from any thread
        schemaless_writer(cast(IO[Any], capture), parsed, fields_of(fields))
        return branch + capture.data

    return piece


_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


def _int_fields(parsed: Any) -> tuple[str, ...]:
    """The fields of a record schema typed ``int`` or ``["null", "int"]``."""
    out = []
    for f in parsed["fields"]:
        types = f["type"] if isinstance(f["type"], list) else [f["type"]]
        if "int" in types:
            out.append(f["name"])
    return tuple(out)


class JsonBatchEncoder:
    """Pieces and ``{"events": [...]}`` records in the JSON format (orjson)."""

    format = JSON
    separator = b","
    tail = 2

    def __init__(self) -> None:
        self.headers: Headers = [(FORMAT_HEADER, JSON.encode())]
        self.writers: dict[str, Writer] = dict.fromkeys(EVENT_TYPES, _json_piece)

    def piece(self, event: Envelope) -> bytes:
        fields = event.__dict__
        return self.writers[fields["event_type"]](fields)

    def head(self, batch_id: str, session_id: str) -> bytes:
        return b'{"batch_id":%s,"session_id":%s,"events":[' % (orjson.dumps(batch_id), orjson.dumps(session_id))

    def record(self, head: bytes, pieces: Sequence[bytes]) -> bytes:
        return b"".join((head, b",".join(pieces), b"]}"))


def _json_piece(fields: dict[str, Any]) -> bytes:
    """orjson writes the ``__dict__`` as is and asks :func:`_nested` for the nested ``producer`` model (no copy)."""
    return orjson.dumps(fields, default=_nested)


def _nested(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.__dict__
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def encoder_for(wire_format: str, catalogue: Catalogue | None = None) -> EventEncoder:
    """The encoder of ``avro`` or ``json``; ``ValueError`` for anything else."""
    if wire_format == AVRO:
        return AvroBatchEncoder(catalogue)
    if wire_format == JSON:
        return JsonBatchEncoder()
    raise ValueError(f"unknown wire format {wire_format!r}: use 'avro' or 'json'")
