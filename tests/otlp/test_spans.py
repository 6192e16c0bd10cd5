"""OTLP exports, protobuf or JSON, read as the same spans; malformed exports are named, not guessed."""

from __future__ import annotations

from typing import Any

import pytest

from rewardflow.otlp.spans import STATUS_ERROR, BadExport, from_json, from_protobuf
from tests.otlp.exports import TRACE, agent_turn, as_json, protobuf

RESOURCE = {"service.name": "agent-backend", "service.version": "2.1.0", "rewardflow.surface": "agent"}


def test_protobuf_and_json_exports_give_the_same_spans() -> None:
    spans = from_protobuf(protobuf(agent_turn(), RESOURCE))
    assert spans == from_json(as_json(agent_turn(), RESOURCE))
    assert [s.span_id for s in spans] == ["00000000000000a1", "00000000000000b1", "00000000000000c1", "00000000000000c2"]
    chat = spans[1]
    assert chat.trace_id == TRACE and chat.attributes["gen_ai.usage.input_tokens"] == 900
    assert chat.attributes["gen_ai.response.time_to_first_chunk"] == 0.25
    assert chat.resource["service.name"] == "agent-backend"
    assert spans[3].status_code == STATUS_ERROR and spans[3].status_message == "3 tests failed"
    assert chat.attr("rewardflow.surface") == "agent"  # from the resource when the span has none


def test_json_accepts_numbers_enum_names_and_nested_values() -> None:
    doc = as_json(agent_turn()[:1], {})
    s = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    s["startTimeUnixNano"], s["status"] = 5, {"code": "STATUS_CODE_ERROR"}
    s["attributes"] += [{"key": "list", "value": {"arrayValue": {"values": [{"intValue": 1}, {"stringValue": "a"}]}}},
                        {"key": "map", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": True}}]}}},
                        {"key": "raw", "value": {"bytesValue": "AAE="}}, {"key": "empty", "value": {}}]
    (span,) = from_json(doc)
    assert span.start_ns == 5 and span.status_code == STATUS_ERROR
    assert span.attributes["list"] == [1, "a"] and span.attributes["map"] == {"k": True}
    assert span.attributes["raw"] == b"\x00\x01" and span.attributes["empty"] is None


def _spans_of(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("change, where", [
    (lambda s: s.update(traceId="xyz"), "spans[0].traceId"),
    (lambda s: s.update(spanId="00ab"), "spans[0].spanId"),
    (lambda s: s.update(endTimeUnixNano="-5"), "spans[0].endTimeUnixNano"),
    (lambda s: s.update(status={"code": 7}), "spans[0].status.code"),
    (lambda s: s["attributes"].append({"key": "k", "value": {"intValue": "1e9"}}), "attributes[2].value"),
    (lambda s: s["attributes"].append({"key": "k", "value": {"stringValue": "a", "intValue": 1}}), "attributes[2].value"),
    (lambda s: s["attributes"].append({"key": 5, "value": {}}), "attributes[2].key"),
])
def test_a_malformed_json_export_is_refused_naming_the_place(change: Any, where: str) -> None:
    doc = as_json(agent_turn()[:1], {})
    change(_spans_of(doc))
    with pytest.raises(BadExport, match=where.replace("[", r"\[").replace("]", r"\]")):
        from_json(doc)


def test_a_deeply_nested_value_is_refused() -> None:
    value: dict[str, Any] = {"stringValue": "x"}
    for _ in range(20):
        value = {"arrayValue": {"values": [value]}}
    doc = as_json(agent_turn()[:1], {})
    _spans_of(doc)["attributes"].append({"key": "deep", "value": value})
    with pytest.raises(BadExport, match="nested deeper"):
        from_json(doc)


def test_bytes_that_are_not_an_export_are_refused() -> None:
    with pytest.raises(BadExport, match="not an OTLP"):
        from_protobuf(b"\xff\xff\xff\xff not protobuf")
    with pytest.raises(BadExport, match="expected an object"):
        from_json([1, 2])


def test_a_json_span_name_or_status_message_of_any_shape_is_kept_as_text() -> None:
    deep: Any = "x"
    for _ in range(1_000):  # str() of this raises RecursionError
        deep = [deep]
    doc = as_json(agent_turn(), {"service.name": "a"})
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["name"], span["status"] = deep, {"code": 2, "message": {"nested": deep}}
    got = from_json(doc)[0]
    assert (got.name, got.status_message) == ("<list>", "<dict>")
