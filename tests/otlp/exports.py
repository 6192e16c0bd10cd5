"""OTLP trace exports for tests, built with the protobuf classes and as OTLP/JSON (the same spans)."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

T0_NS = 1_764_000_000_000 * 1_000_000
TRACE = "5b8efff798038103d269b633813fc60c"


def span(span_id: str, name: str, attrs: dict[str, Any], start_ms: int = 0, dur_ms: int = 100,
         error: bool = False, message: str = "") -> dict[str, Any]:
    """A span description shared by :func:`protobuf` and :func:`as_json`."""
    return {"span_id": span_id, "name": name, "attrs": attrs, "start": T0_NS + start_ms * 1_000_000,
            "end": T0_NS + (start_ms + dur_ms) * 1_000_000, "error": error, "message": message}


def _any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def protobuf(spans: list[dict[str, Any]], resource: dict[str, Any], trace: str = TRACE) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in resource.items())
    ss = rs.scope_spans.add()
    for d in spans:
        s = ss.spans.add(trace_id=bytes.fromhex(trace), span_id=bytes.fromhex(d["span_id"]), name=d["name"],
                         start_time_unix_nano=d["start"], end_time_unix_nano=d["end"])
        s.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in d["attrs"].items())
        if d["error"]:
            s.status.code, s.status.message = 2, d["message"]
    return req.SerializeToString()


def _json_any(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def as_json(spans: list[dict[str, Any]], resource: dict[str, Any], trace: str = TRACE) -> dict[str, Any]:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": k, "value": _json_any(v)} for k, v in resource.items()]},
        "scopeSpans": [{"scope": {"name": "tests"}, "spans": [{
            "traceId": trace, "spanId": d["span_id"], "name": d["name"], "kind": 3,
            "startTimeUnixNano": str(d["start"]), "endTimeUnixNano": str(d["end"]),
            "attributes": [{"key": k, "value": _json_any(v)} for k, v in d["attrs"].items()],
            "status": {"code": 2, "message": d["message"]} if d["error"] else {},
        } for d in spans]}],
    }]}


def agent_turn(conversation: str = "conv-1") -> list[dict[str, Any]]:
    """One traced agent turn: an invoke_agent root, a chat span, two tool calls (one failing)."""
    common = {"gen_ai.conversation.id": conversation}
    return [
        span("00000000000000a1", "invoke_agent coder", {**common, "gen_ai.operation.name": "invoke_agent"}, 0, 3000),
        span("00000000000000b1", "chat gpt-x", {**common, "gen_ai.operation.name": "chat",
             "gen_ai.request.model": "gpt-x", "gen_ai.response.model": "ckpt-7",
             "gen_ai.usage.input_tokens": 900, "gen_ai.usage.output_tokens": 120,
             "gen_ai.response.time_to_first_chunk": 0.25, "rewardflow.experiment_arm": "cand"}, 10, 1200),
        span("00000000000000c1", "execute_tool read_file", {**common, "gen_ai.operation.name": "execute_tool",
             "gen_ai.tool.name": "read_file", "gen_ai.tool.call.id": "call-1"}, 1300, 40),
        span("00000000000000c2", "execute_tool run_tests", {**common, "gen_ai.operation.name": "execute_tool",
             "gen_ai.tool.name": "run_tests", "gen_ai.tool.call.id": "call-2", "error.type": "TestFailure"},
             1400, 900, error=True, message="3 tests failed"),
    ]
