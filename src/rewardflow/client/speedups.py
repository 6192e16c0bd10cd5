"""The compiled per-event writers (C extension ``_speedups``) when built, else the pure-Python ones.

``pip install -e .`` compiles ``_speedups.c`` (``setup.py``: an *optional*
extension; without a C compiler the install still succeeds). This module
wraps it:

* :func:`avro_writer` turns an Avro record schema into an op tree
  (:func:`avro_program`) that the extension's ``AvroWriter`` runs in C;
* :func:`json_writer` returns the extension's ``JsonWriter`` (orjson's bytes
  for an event's ``__dict__``, written in C without the ``default`` callback);
* :func:`lock_and_batch_type` and :func:`emit_core` give the producer the
  extension's ``Lock``, ``Batch`` and ``EmitCore``: the common case of
  ``emit`` (encode, append to the session's open batch) in one C call.

Both take the pure-Python writer as ``fallback``: the C code hands it every
value it does not handle exactly like the pure writer (wrong or subclassed
types, nested values of types not registered with ``add_models``, ints
beyond 64 bits, unknown enum symbols, unencodable text, floats whose text
needs an exponent), so the bytes, and the exceptions, never differ (``tests/client/test_speedups.py`` proves it for every event type).

Without the extension (not built, or ``REWARDFLOW_PURE_PYTHON=1``) the
writers are ``None`` (the caller keeps its pure-Python writer), the lock is
``threading.Lock`` and the emit state an :class:`EmitState`; a notice is
logged once per process (WARNING, logger ``rewardflow.client.speedups``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rewardflow.client.avro_codegen import FIXED, Codegen, Unsupported, varint
from rewardflow.client.avro_compiler import encode_constant
from rewardflow.extensions import load_extension

if TYPE_CHECKING:
    from rewardflow.client.batching import SessionBatch

log = logging.getLogger(__name__)

Writer = Callable[[dict[str, Any]], bytes]

OP_CONST, OP_STRING, OP_BYTES, OP_LONG, OP_BOOLEAN, OP_DOUBLE, OP_FLOAT, OP_ENUM, OP_RECORD, OP_OPTIONAL, OP_NULL, OP_INT = range(12)
"""Op codes of the extension's program (``_speedups.c``)."""

MAX_FIELDS = 128
"""The most fields of a compiled record (``_speedups.c``)."""

Op = tuple[int, str | None, Any, tuple[Any, ...], int]
"""``(code, key, data, subops, null_index)``: key = the field read from the record's ``__dict__`` (None: the value
itself). A constant (``OP_CONST``, data = its bytes) may name its field: the value is never read for the bytes, but
the emit core checks the ``event_type`` it names."""

_SIMPLE = {"string": OP_STRING, "bytes": OP_BYTES, "int": OP_INT, "long": OP_LONG,
           "boolean": OP_BOOLEAN, "double": OP_DOUBLE, "float": OP_FLOAT, "null": OP_NULL}
assert set(FIXED) <= set(_SIMPLE)


_ext, _why = load_extension("rewardflow.client._speedups")
AVAILABLE: bool = _ext is not None
"""True when the compiled writers are in use."""
_noticed = False
if _ext is not None:  # the event models keep their values in a plain instance dict: read it directly (see add_models)
    from rewardflow.events.models import EVENT_MODELS, Producer

    _ext.add_models((*EVENT_MODELS.values(), Producer))


def _notice() -> None:
    global _noticed
    if not _noticed:
        _noticed = True
        log.warning("rewardflow producer: %s; using the pure-Python event writers (several times slower per event). "
                    "Reinstall with a C compiler and Python headers (pip install -e .) to build it.", _why)


def status() -> str:
    """One line: which writers the producer uses, and why."""
    return "compiled (C extension)" if AVAILABLE else f"pure Python: {_why}"


def avro_program(schema: Any, prefix: bytes = b"", constants: Mapping[str, Any] | None = None) -> Op:
    """The op tree of a (fastavro-parsed) record schema: ``prefix``, then the fields in order.

    ``constants`` maps top-level field names to the value they always hold
    (encoded once here, written, never read). Raises :class:`Unsupported` like the
    Python compiler (maps, arrays, unions other than ``[null, X]``, fixed).
    """
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise Unsupported("only record schemas are compiled")
    named = dict(schema.get("__named_schemas", {}))
    gen = Codegen(named)
    if len(schema["fields"]) + 1 > MAX_FIELDS:  # (+1: the prefix)
        raise Unsupported(f"records of more than {MAX_FIELDS} fields are not compiled")
    constants = constants or {}
    ops: list[Op] = [(OP_CONST, None, prefix, (), 0)] if prefix else []
    for field in schema["fields"]:
        name = field["name"]
        if name in constants:
            ops.append((OP_CONST, name, encode_constant(field["type"], constants[name], named), (), 0))
        else:
            ops.append(_op(gen, field["type"], name))
    return (OP_RECORD, None, None, tuple(_merge(ops)), 0)


def _op(gen: Codegen, schema: Any, key: str | None) -> Op:
    schema = gen.resolve(schema)
    if isinstance(schema, list):
        kinds = [_kind(gen.resolve(b)) for b in schema]
        if len(schema) != 2 or "null" not in kinds or kinds == ["null", "null"]:
            raise Unsupported("only two-branch unions with null are compiled")
        null_at = kinds.index("null")
        return (OP_OPTIONAL, key, None, (_op(gen, schema[1 - null_at], None),), null_at)
    kind = _kind(schema)
    if kind in _SIMPLE:
        return (_SIMPLE[kind], key, None, (), 0)
    if kind == "enum":
        return (OP_ENUM, key, {sym: varint(i) for i, sym in enumerate(schema["symbols"])}, (), 0)
    if kind == "record":
        if len(schema["fields"]) > MAX_FIELDS:
            raise Unsupported(f"records of more than {MAX_FIELDS} fields are not compiled")
        return (OP_RECORD, key, None, tuple(_op(gen, f["type"], f["name"]) for f in schema["fields"]), 0)
    raise Unsupported(f"Avro type {kind!r} is not compiled")


def _kind(schema: Any) -> str:
    return "union" if isinstance(schema, list) else schema if isinstance(schema, str) else str(schema["type"])


def _merge(ops: list[Op]) -> list[Op]:
    """Adjacent constants without a field name as one."""
    out: list[Op] = []
    for op in ops:
        if out and op[0] == OP_CONST and out[-1][0] == OP_CONST and op[1] is None and out[-1][1] is None:
            out[-1] = (OP_CONST, None, out[-1][2] + op[2], (), 0)
        else:
            out.append(op)
    return out


def avro_writer(schema: Any, fallback: Writer, prefix: bytes = b"",
                constants: Mapping[str, Any] | None = None) -> Writer | None:
    """The compiled writer of ``schema`` (``prefix`` + Avro binary), or None without the extension.

    Raises :class:`Unsupported` for a schema the program cannot express.
    """
    program = avro_program(schema, prefix, constants)
    if _ext is None:
        _notice()
        return None
    encode: Writer = _ext.AvroWriter(program, fallback).encode
    return encode


class EmitState:
    """The counts and flags the producer's emit path shares with the pump; pure-Python twin of ``_speedups.EmitCore``.

    ``emit`` always answers False: the producer's Python path does everything.
    """

    __slots__ = ("accepted", "limit", "closed", "due")

    def __init__(self, limit: int) -> None:
        self.accepted = 0
        self.limit = limit
        self.closed = False
        self.due = False

    def emit(self, event: object) -> bytes | bool | None:
        """Nothing done here (False): see ``EmitCore.emit`` for what the C core does."""
        return False


def lock_and_batch_type() -> tuple[Any, type[SessionBatch]]:
    """The producer's lock and batch type: the extension's ``Lock`` and ``Batch``, else ``threading.Lock()`` and ``SessionBatch``.

    ``Lock`` has threading.Lock's interface (``acquire(blocking=True)``,
    ``release``, ``locked``, ``with``); ``Batch`` is
    :class:`~rewardflow.client.batching.SessionBatch` in C. The emit core
    works on them without Python calls.
    """
    from rewardflow.client.batching import SessionBatch  # (batching imports encoding, which imports this module)

    if _ext is None:
        _notice()
        return threading.Lock(), SessionBatch
    return _ext.Lock(), _ext.Batch


def emit_core(models: Mapping[str, type], writers: dict[str, Writer], open_batches: dict[str, Any], lock: Any,
              separator: int, limit: int) -> EmitState:
    """The extension's ``EmitCore`` (the common case of ``emit`` in one call), else an :class:`EmitState`.

    ``models``: event type name -> model class (instances are taken as
    validated); ``writers``: event type name -> writer. The core appends an
    event to its session's open batch (``open_batches``, a ``Batch``) only
    while no other thread holds ``lock`` (the extension's ``Lock``), and
    hands every other case back to the producer's Python path: see
    ``EmitCore`` in ``_speedups.c``.
    """
    if _ext is None or type(lock) is not _ext.Lock:
        return EmitState(limit)
    compiled = (_ext.AvroWriter, _ext.JsonWriter)
    direct = {name: w.__self__ if type(getattr(w, "__self__", None)) in compiled else w  # type: ignore[attr-defined]
              for name, w in writers.items()}
    by_type = {model: direct[name] for name, model in models.items() if name in direct}
    core: EmitState = _ext.EmitCore(by_type, direct, open_batches, lock, separator, limit)
    return core


def json_writer(fallback: Writer, nested_types: tuple[type, ...]) -> Writer | None:
    """The compiled JSON writer (orjson's bytes; models of ``nested_types`` as objects), or None without the extension."""
    if _ext is None:
        _notice()
        return None
    encode: Writer = _ext.JsonWriter(nested_types, fallback).encode
    return encode
