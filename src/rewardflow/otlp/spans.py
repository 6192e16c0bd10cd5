"""OTLP trace exports, protobuf or JSON, as plain :class:`Span` values.

Both encodings of ``ExportTraceServiceRequest`` (OTLP/HTTP: ``application/x-protobuf`` and
``application/json``) become the same list of spans, each with its resource's attributes beside
its own, so the mapping to events (:mod:`rewardflow.otlp.mapping`) never sees the wire.

JSON follows the OTLP/JSON rules: ``traceId`` / ``spanId`` are hex strings, 64-bit integers may
be strings, enums are integers (their names are accepted too), attribute values are ``AnyValue``
objects (``stringValue``, ``intValue``, ``doubleValue``, ``boolValue``, ``arrayValue``,
``kvlistValue``, ``bytesValue``).

Contract: pure, no I/O. :func:`from_protobuf` and :func:`from_json` raise :class:`BadExport`
naming what is malformed; they never return a partly read export.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from rewardflow.events.validate import shown

Attributes = dict[str, Any]  # str, int, float, bool, bytes, or lists / dicts of them

STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2
_TEXT = 1_024  # a JSON span's name and status message are kept as at most this many characters, whatever they are
_STATUS_NAMES = {"STATUS_CODE_UNSET": STATUS_UNSET, "STATUS_CODE_OK": STATUS_OK, "STATUS_CODE_ERROR": STATUS_ERROR}


class BadExport(ValueError):
    """The body is not an OTLP trace export; ``str()`` says where."""


@dataclass(frozen=True, slots=True)
class Span:
    """One span as the mapping needs it (ids in lowercase hex, times in Unix nanoseconds)."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    end_ns: int
    status_code: int = STATUS_UNSET
    status_message: str = ""
    attributes: Attributes = field(default_factory=dict)
    resource: Attributes = field(default_factory=dict)

    def attr(self, *names: str) -> Any:
        """The first of ``names`` set on the span, else on its resource; None when none is."""
        for source in (self.attributes, self.resource):
            for name in names:
                value = source.get(name)
                if value is not None:
                    return value
        return None


def from_protobuf(body: bytes) -> list[Span]:
    """The spans of a protobuf ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise BadExport(f"body: not an OTLP ExportTraceServiceRequest ({exc})") from None
    spans: list[Span] = []
    for rs in request.resource_spans:
        resource = _pb_attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                if len(s.trace_id) != 16 or len(s.span_id) != 8:
                    raise BadExport(f"span {s.name[:64]!r}: trace_id must be 16 bytes and span_id 8")
                spans.append(Span(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), name=s.name,
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    status_code=int(s.status.code), status_message=s.status.message,
                    attributes=_pb_attributes(s.attributes), resource=resource,
                ))
    return spans


def _pb_attributes(kvs: Iterable[KeyValue]) -> Attributes:
    return {kv.key: _pb_value(kv.value) for kv in kvs}


def _pb_value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_pb_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _pb_attributes(v.kvlist_value.values)
    return None if kind is None else getattr(v, kind)


def from_json(doc: Any) -> list[Span]:
    """The spans of a decoded OTLP/JSON ``ExportTraceServiceRequest``."""
    if not isinstance(doc, dict):
        raise BadExport('body: expected an object {"resourceSpans": […]}')
    spans: list[Span] = []
    for i, rs in enumerate(_list(doc, "resourceSpans", "body")):
        where = f"resourceSpans[{i}]"
        resource = _json_attributes(_obj(_obj(rs, where).get("resource", {}), f"{where}.resource"), f"{where}.resource")
        for j, ss in enumerate(_list(rs, "scopeSpans", where)):
            for k, s in enumerate(_list(_obj(ss, f"{where}.scopeSpans[{j}]"), "spans", f"{where}.scopeSpans[{j}]")):
                at = f"{where}.scopeSpans[{j}].spans[{k}]"
                s = _obj(s, at)
                status = _obj(s.get("status", {}), f"{at}.status")
                spans.append(Span(
                    trace_id=_hex_id(s.get("traceId"), f"{at}.traceId", 16),
                    span_id=_hex_id(s.get("spanId"), f"{at}.spanId", 8),
                    name=shown(s.get("name", ""), _TEXT), start_ns=_int(s.get("startTimeUnixNano", 0), f"{at}.startTimeUnixNano"),
                    end_ns=_int(s.get("endTimeUnixNano", 0), f"{at}.endTimeUnixNano"),
                    status_code=_status(status.get("code", 0), f"{at}.status.code"),
                    status_message=shown(status.get("message", ""), _TEXT),
                    attributes=_json_attributes(s, at), resource=resource,
                ))
    return spans


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadExport(f"{where}: expected an object")
    return value


def _list(parent: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = parent.get(key, [])
    if not isinstance(value, list):
        raise BadExport(f"{where}.{key}: expected a list")
    return value


def _int(value: Any, where: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= 20:
        return int(value)
    raise BadExport(f"{where}: expected an unsigned integer (a number or a decimal string)")


def _hex_id(value: Any, where: str, size: int) -> str:
    if not isinstance(value, str) or len(value) != 2 * size:
        raise BadExport(f"{where}: expected a hex id of {size} bytes")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise BadExport(f"{where}: expected a hex id of {size} bytes") from None
    return value.lower()


def _status(value: Any, where: str) -> int:
    if isinstance(value, str) and value in _STATUS_NAMES:
        return _STATUS_NAMES[value]
    code = _int(value, where)
    if code not in (STATUS_UNSET, STATUS_OK, STATUS_ERROR):
        raise BadExport(f"{where}: expected 0, 1 or 2")
    return code


def _json_attributes(holder: Mapping[str, Any], where: str, key: str = "attributes", depth: int = 0) -> Attributes:
    out: Attributes = {}
    for i, kv in enumerate(_list(holder, key, where)):
        kv = _obj(kv, f"{where}.{key}[{i}]")
        name = kv.get("key")
        if not isinstance(name, str):
            raise BadExport(f"{where}.{key}[{i}].key: expected a string")
        out[name] = _json_value(kv.get("value", {}), f"{where}.{key}[{i}].value", depth)
    return out


def _json_value(v: Any, where: str, depth: int) -> Any:
    if depth > 8:
        raise BadExport(f"{where}: nested deeper than 8")
    if not isinstance(v, dict) or len(v) > 1:
        raise BadExport(f"{where}: expected an AnyValue object with one field")
    if not v:
        return None
    (kind, value), = v.items()
    if kind == "stringValue" and isinstance(value, str):
        return value
    if kind == "boolValue" and isinstance(value, bool):
        return value
    if kind == "intValue" and (type(value) is int or (isinstance(value, str) and len(value) <= 20)):
        try:
            number = int(value)
        except ValueError:
            return _fail(where)
        return number if -2**63 <= number < 2**63 else _fail(where)
    if kind == "doubleValue" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "bytesValue" and isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            return _fail(where)
    if kind == "arrayValue" and isinstance(value, dict):
        return [_json_value(x, f"{where}.arrayValue", depth + 1) for x in _list(value, "values", where)]
    if kind == "kvlistValue" and isinstance(value, dict):
        return _json_attributes(value, f"{where}.kvlistValue", "values", depth + 1)
    return _fail(where)


def _fail(where: str) -> Any:
    raise BadExport(f"{where}: not a valid AnyValue")
