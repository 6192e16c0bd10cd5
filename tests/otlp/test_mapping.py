"""GenAI spans as events: the documented mapping, field by field, and every other span counted by reason."""

from __future__ import annotations

from typing import Any

import pytest

from rewardflow.events.validate import validate_event
from rewardflow.otlp.mapping import REASONS, map_span, map_spans
from rewardflow.otlp.spans import STATUS_ERROR, Span, from_protobuf
from tests.otlp.exports import T0_NS, TRACE, agent_turn, protobuf

RESOURCE = {"service.name": "agent-backend", "service.version": "2.1.0"}


def _turn() -> list[Span]:
    return from_protobuf(protobuf(agent_turn(), RESOURCE))


def _span(attrs: dict[str, Any], **kw: Any) -> Span:
    return Span(trace_id=TRACE, span_id="00000000000000f1", name="s", start_ns=T0_NS, end_ns=T0_NS + 500_000_000,
                attributes=attrs, resource=kw.pop("resource", RESOURCE), **kw)


def test_an_agent_turn_becomes_one_inference_and_two_tool_calls() -> None:
    mapped = map_spans(_turn())
    assert mapped.unmapped == {"operation:invoke_agent": 1}
    served, ok, failed = (validate_event({**e, "org_id": "org"}) for e in mapped.events)
    assert served.event_type == "InferenceServed"
    assert (served.checkpoint_id, served.experiment_arm, served.surface) == ("ckpt-7", "cand", "agent")
    assert (served.latency_ms, served.ttft_ms, served.prompt_tokens, served.completion_tokens) == (1200, 250, 900, 120)
    assert served.ts == (T0_NS // 1_000_000) + 10 + 1200  # the span's end
    assert {e.session_id for e in (served, ok, failed)} == {"conv-1"}
    assert {e.request_id for e in (served, ok, failed)} == {TRACE}  # one trace, one turn
    assert served.producer.name == "agent-backend" and served.producer.version == "2.1.0"
    assert (ok.tool, ok.call_id, ok.status, ok.duration_ms, ok.error_kind) == ("read_file", "call-1", "ok", 40, None)
    assert (failed.tool, failed.status, failed.error_kind) == ("run_tests", "error", "TestFailure")
    assert served.event_id == f"otel-{TRACE}-00000000000000b1"  # stable: an exporter's retry deduplicates


def test_the_same_spans_always_give_the_same_events() -> None:
    assert map_spans(_turn()).events == map_spans(_turn()).events


@pytest.mark.parametrize("attrs, status", [
    ({"error.type": "malformed_tool_call"}, "broken"),
    ({"error.type": "unknown_tool"}, "broken"),
    ({"error.type": "Timeout"}, "error"),
    ({"rewardflow.tool_status": "broken"}, "broken"),
    ({}, "ok"),
])
def test_a_tool_call_status_follows_its_span(attrs: dict[str, Any], status: str) -> None:
    event = map_span(_span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "edit", **attrs}))
    assert isinstance(event, dict) and event["status"] == status
    validate_event({**event, "org_id": "org"})


def test_an_error_status_without_error_type_is_an_error_with_the_status_message() -> None:
    event = map_span(_span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "edit"},
                           status_code=STATUS_ERROR, status_message="x" * 300))
    assert isinstance(event, dict) and event["status"] == "error" and event["error_kind"] == "x" * 128


def test_rewardflow_attributes_fill_what_the_conventions_lack_span_first() -> None:
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "rewardflow.checkpoint_id": "ck-9",
             "rewardflow.session_id": "sess", "rewardflow.request_id": "turn-4", "rewardflow.ttft_ms": 30}
    event = map_span(_span(attrs, resource={**RESOURCE, "rewardflow.experiment_arm": "arm-b", "rewardflow.surface": "chat"}))
    assert isinstance(event, dict)
    assert (event["checkpoint_id"], event["experiment_arm"], event["surface"]) == ("ck-9", "arm-b", "chat")
    assert (event["session_id"], event["request_id"], event["ttft_ms"]) == ("sess", "turn-4", 30)
    assert event["prompt_tokens"] == 0 and event["completion_tokens"] == 0  # no usage reported
    bare = map_span(_span({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}))
    assert isinstance(bare, dict)
    assert (bare["experiment_arm"], bare["surface"], bare["ttft_ms"]) == ("default", "agent", 500)  # ttft unknown
    assert bare["session_id"] == TRACE


@pytest.mark.parametrize("attrs, reason", [
    ({"http.method": "GET"}, "not_genai"),
    ({"gen_ai.operation.name": "embeddings"}, "operation:embeddings"),
    ({"gen_ai.operation.name": "x" * 500}, "operation:other"),
    ({"gen_ai.operation.name": "chat"}, "no_model"),
    ({"gen_ai.operation.name": "execute_tool"}, "no_tool_name"),
])
def test_a_span_that_cannot_be_mapped_is_counted_by_reason(attrs: dict[str, Any], reason: str) -> None:
    assert reason in REASONS
    mapped = map_spans([_span(attrs)])
    assert mapped.events == [] and mapped.unmapped == {reason: 1}


def test_a_span_ending_before_it_starts_is_counted() -> None:
    span = Span(trace_id=TRACE, span_id="00000000000000f1", name="s", start_ns=T0_NS, end_ns=T0_NS - 1,
                attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"})
    assert map_spans([span]).unmapped == {"bad_times": 1}


@pytest.mark.parametrize("attrs", [
    {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "edit", "error.type": ["malformed_tool_call"]},
    {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "edit", "error.type": {"k": "v"}},
    {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "rewardflow.ttft_ms": float("nan")},
    {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "rewardflow.ttft_ms": float("inf")},
    {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.response.time_to_first_chunk": 1e306},
])
def test_an_attribute_of_an_odd_shape_or_value_is_mapped_or_refused_by_the_contract_never_raised(
        attrs: dict[str, Any]) -> None:
    mapped = map_spans([_span(attrs, status_code=STATUS_ERROR)])
    assert sum(mapped.unmapped.values()) + len(mapped.events) == 1
    for event in mapped.events:
        if event["event_type"] == "ToolCall":
            assert event["status"] == "error"  # a list is no malformed-call name
        else:
            assert event["ttft_ms"] == event["latency_ms"]  # no finite time to first token: the whole span


def test_a_span_the_mapping_cannot_read_is_counted_unmappable_and_the_others_are_kept() -> None:
    class Hostile(dict):  # type: ignore[type-arg]
        def get(self, *_: Any) -> Any:
            raise RecursionError("what str() of a deeply nested value raises")

    bad = _span({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}, resource=Hostile())
    mapped = map_spans([bad, *_turn()])
    assert mapped.unmapped == {"unmappable": 1, "operation:invoke_agent": 1} and len(mapped.events) == 3
