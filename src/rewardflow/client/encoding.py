"""Per-event encoding and record framing of the two wire formats, for the producer's hot path.

Each event is encoded exactly once, when it is emitted, into the *piece* it
occupies inside a session batch record; a record is the batch's *head*
(built once when the batch opens) + the pieces + a tail. The bytes equal what
:func:`rewardflow.events.wire.encode_avro` (``batch_id`` given) and
:func:`~rewardflow.events.wire.encode_json` produce, so
:func:`~rewardflow.events.wire.decode_record` reads them:

* avro: piece = the event's branch index in the ``EventBatch`` union + the
  event's Avro body, written by the C extension's writer run from the
  event's schema (:mod:`rewardflow.client.speedups`, when built), else by a
  writer compiled to Python from the schema
  (:mod:`rewardflow.client.avro_compiler`; the C writer's fallback too), or by
  fastavro itself (``writer="fastavro"``, also the fallback for a schema the
  compilers do not handle). All write fastavro's bytes. head = magic 0,
  schema id, ``batch_id``, ``session_id``; then the array block count, the
  pieces, and the end-of-array byte.
* json: piece = ``orjson.dumps(event.__dict__)`` (nested models by their
  ``__dict__``), written by the C extension's JSON writer when built (the
  same bytes); record = ``{"batch_id":…,"session_id":…,"events":[piece,piece,…]}``.

Contract: encoders are pure and take *validated* event models. ``piece``
raises ``ValueError`` or ``TypeError`` for data that does not fit the schema
(the producer turns that into ``InvalidEvent``); it never truncates.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import IO, Any, Literal, Protocol, cast

import orjson
from fastavro import schemaless_writer
from pydantic import BaseModel

from rewardflow.client import speedups
from rewardflow.client.avro_compiler import Unsupported, compile_writer, varint
from rewardflow.events.catalogue import BATCH, EVENT_TYPES, Catalogue, default_catalogue
from rewardflow.events.models import Envelope, Producer
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


ENVELOPE_RUN = ("org_id", "session_id", "request_id", "producer")
"""Envelope fields that repeat for every event of a turn, consecutive in every event schema: memoised."""


class AvroBatchEncoder:
    """Pieces and ``EventBatch`` records in the Confluent-framed Avro format."""

    format = AVRO
    separator = b""
    tail = MAX_VARINT + 1

    def __init__(self, catalogue: Catalogue | None = None, writer: Literal["compiled", "fastavro"] = "compiled") -> None:
        cat = catalogue or default_catalogue()
        batch = cat.writer(BATCH)
        items = next(f for f in batch.parsed["fields"] if f["name"] == "events")["type"]["items"]
        names = [(i["name"] if isinstance(i, dict) else str(i)).rsplit(".", 1)[-1] for i in items]
        self.writers: dict[str, Writer] = {name: _piece_writer(cat.writer(name).parsed, varint(i), name, writer) for i, name in enumerate(names)}
        self._frame = _FRAME.pack(0, batch.schema_id)
        self.headers: Headers = [(FORMAT_HEADER, AVRO.encode())]

    def piece(self, event: Envelope) -> bytes:
        fields = event.__dict__
        return self.writers[fields["event_type"]](fields)

    def head(self, batch_id: str, session_id: str) -> bytes:
        return self._frame + avro_string(batch_id) + avro_string(session_id)

    def record(self, head: bytes, pieces: Sequence[bytes]) -> bytes:
        return b"".join((head, varint(len(pieces)), *pieces, b"\x00"))


def _piece_writer(parsed: Any, branch: bytes, name: str, writer: str) -> Writer:
    """The C writer (pure-Python fallback: the compiled Python one), else the compiled Python writer, else fastavro's.

    ``event_type`` is compiled as the constant ``name``: the encoder picks this
    writer by the event's ``event_type``, so the value is known.
    """
    if writer == "fastavro":
        return _fastavro_piece(parsed, branch)
    pure = _python_piece(parsed, branch, name)
    try:
        fast = speedups.avro_writer(parsed, pure, prefix=branch, constants={"event_type": name})
    except Unsupported:
        return pure
    return pure if fast is None else fast


def _python_piece(parsed: Any, branch: bytes, name: str) -> Writer:
    """The writer compiled to Python (with the envelope memo if the schema allows), else fastavro's."""
    for memo in (ENVELOPE_RUN, ()):
        try:
            return compile_writer(parsed, prefix=branch, memo=memo, constants={"event_type": name})
        except Unsupported:
            continue
    return _fastavro_piece(parsed, branch)


def _fastavro_piece(parsed: Any, branch: bytes) -> Writer:
    """fastavro's writer for one event type, with the union branch index in front."""

    class Capture:  # file-like: fastavro writes each datum with one .write() call
        data: bytes | bytearray = b""

        def write(self, data: bytes | bytearray) -> None:
            self.data = data

    capture = Capture()
    sink = cast(IO[Any], capture)

    def piece(fields: dict[str, Any]) -> bytes:
        schemaless_writer(sink, parsed, fields_of(fields))
        return branch + capture.data

    return piece


class JsonBatchEncoder:
    """Pieces and ``{"events": [...]}`` records in the JSON format (orjson)."""

    format = JSON
    separator = b","
    tail = 2

    def __init__(self) -> None:
        self.headers: Headers = [(FORMAT_HEADER, JSON.encode())]
        write = speedups.json_writer(_json_piece, (Producer,)) or _json_piece
        self.writers: dict[str, Writer] = {name: write for name in EVENT_TYPES}

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
        return value.__dict__  # type: ignore[no-any-return]
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def encoder_for(wire_format: str, catalogue: Catalogue | None = None,
                avro_writer: Literal["compiled", "fastavro"] = "compiled") -> EventEncoder:
    """The encoder of ``avro`` or ``json``; ``ValueError`` for anything else."""
    if wire_format == AVRO:
        return AvroBatchEncoder(catalogue, avro_writer)
    if wire_format == JSON:
        return JsonBatchEncoder()
    raise ValueError(f"unknown wire format {wire_format!r}: use 'avro' or 'json'")
