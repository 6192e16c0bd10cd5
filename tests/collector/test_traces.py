"""OTLP/HTTP trace exports into a real collector, broker and chDB: the OpenTelemetry SDK's own
exporter, OTLP/JSON, and the refusals."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

from rewardflow.collector.keys import IngestKeys
from rewardflow.collector.server import Collector, keys_from_client
from rewardflow.events.wire import decode_record
from rewardflow.kafka.provision import ensure_topics
from tests.collector.test_collector import Edge
from tests.conftest_clickhouse import ChDatabase
from tests.conftest_kafka import SessionBroker
from tests.core.feed import Feed
from tests.otlp.exports import agent_turn, as_json, protobuf
from tests.streams.kafka_io import read_raw

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse]


@pytest.fixture
def edge(kafka_broker: SessionBroker, ch_db: ChDatabase, unique_group: str) -> Iterator[Edge]:
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"{unique_group}.", partitions=2,
                              collect_ack_timeout_s=5.0)
    ensure_topics(settings)
    keys = IngestKeys(ch_db.client)
    _, secret = keys.create("org-otel", "tests")
    with Collector(settings, keys_from_client(ch_db.client), port=0) as collector:
        yield Edge(settings, collector.url, secret, keys)


def _landed(edge: Edge) -> list[dict[str, Any]]:
    return [e for rs in read_raw(edge.settings).values() for r in rs for e in decode_record(r.value, r.headers)]


def _final_rewards(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    feed = Feed()
    feed.send(*sorted(events, key=lambda e: (e["session_id"], e["ts"])))
    feed.tick(max(e["ts"] for e in events) + 10 * 3_600_000)
    return feed.final()


def _post(url: str, key: str | None, body: bytes, content_type: str) -> tuple[int, bytes]:
    headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(f"{url}/v1/traces", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_turn_traced_by_the_opentelemetry_sdk_ends_as_one_reward(edge: Edge) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{edge.url}/v1/traces", headers={"Authorization": f"Bearer {edge.key}"})
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-backend",
                                                        "rewardflow.experiment_arm": "cand"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.agent")
    conversation = {"gen_ai.conversation.id": "conv-sdk"}
    with tracer.start_as_current_span("invoke_agent coder", attributes={**conversation, "gen_ai.operation.name": "invoke_agent"}):
        with tracer.start_as_current_span("chat ckpt-7", attributes={
                **conversation, "gen_ai.operation.name": "chat", "gen_ai.request.model": "ckpt-7",
                "gen_ai.usage.input_tokens": 800, "gen_ai.usage.output_tokens": 60}):
            time.sleep(0.02)
        with tracer.start_as_current_span("execute_tool read_file", attributes={
                **conversation, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read_file"}):
            pass
        with tracer.start_as_current_span("execute_tool run_tests", attributes={
                **conversation, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "run_tests"}) as failing:
            failing.set_attribute("error.type", "TestFailure")
            failing.set_status(Status(StatusCode.ERROR, "3 tests failed"))
    assert provider.force_flush(30_000)
    provider.shutdown()

    landed = _landed(edge)
    assert sorted(e["event_type"] for e in landed) == ["InferenceServed", "ToolCall", "ToolCall"]
    assert {e["org_id"] for e in landed} == {"org-otel"}  # the key's org
    (reward,) = _final_rewards(landed)
    assert (reward["n_tool_calls"], reward["n_tool_error"], reward["n_tool_broken"]) == (2, 1, 0)
    assert (reward["checkpoint_id"], reward["experiment_arm"]) == ("ckpt-7", "cand")
    metrics = urllib.request.urlopen(f"{edge.url}/metrics").read().decode()
    assert 'rewardflow_collect_spans_total{outcome="mapped"} 3.0' in metrics
    assert 'rewardflow_collect_spans_total{outcome="operation:invoke_agent"} 1.0' in metrics


def test_otlp_json_lands_and_reports_what_it_left_out(edge: Edge) -> None:
    trace = "0af7651916cd43dd8448eb211c80319c"
    body = orjson.dumps(as_json(agent_turn("conv-json"), {"service.name": "agent-backend"}, trace=trace))
    status, answer = _post(edge.url, edge.key, body, "application/json")
    assert status == 200, answer
    partial = orjson.loads(answer)["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 1 and "operation:invoke_agent 1" in partial["errorMessage"]
    assert _post(edge.url, edge.key, body, "application/json")[0] == 200  # an exporter's retry
    landed = _landed(edge)
    assert len(landed) == 6 and len({e["event_id"] for e in landed}) == 3  # the pipeline dedupes by event_id
    (reward,) = _final_rewards(list({e["event_id"]: e for e in landed}.values()))
    assert (reward["n_tool_calls"], reward["n_tool_error"]) == (2, 1)


def test_a_protobuf_export_gets_a_protobuf_answer(edge: Edge) -> None:
    status, answer = _post(edge.url, edge.key, protobuf(agent_turn()[1:], {}), "application/x-protobuf")
    assert status == 200
    response = ExportTraceServiceResponse.FromString(answer)
    assert response.partial_success.rejected_spans == 0


def test_refusals_say_why(edge: Edge) -> None:
    body = protobuf(agent_turn(), {})
    status, answer = _post(edge.url, None, body, "application/x-protobuf")
    assert status == 401 and b"Bearer" in answer
    status, answer = _post(edge.url, edge.key, body, "text/plain")
    assert status == 415 and b"application/x-protobuf" in answer
    status, answer = _post(edge.url, edge.key, b"\xff\xfe garbage", "application/x-protobuf")
    assert status == 400 and b"not an OTLP" in answer
    status, answer = _post(edge.url, edge.key, b'{"resourceSpans": 5}', "application/json")
    assert status == 400 and b"resourceSpans" in answer
    assert _landed(edge) == []


def test_limits_count_spans(kafka_broker: SessionBroker, ch_db: ChDatabase, unique_group: str) -> None:
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"{unique_group}.", partitions=2,
                              collect_max_spans=6, collect_rate_events_per_s=1.0, collect_rate_burst=10)
    ensure_topics(settings)
    _, key = IngestKeys(ch_db.client).create("org-otel")
    not_genai = [{**s, "attrs": {"http.method": "GET"}} for s in agent_turn()]
    with Collector(settings, keys_from_client(ch_db.client), port=0) as collector:
        status, answer = _post(collector.url, key, protobuf(agent_turn() + agent_turn()[:3], {}), "application/x-protobuf")
        assert status == 413 and b"7 spans" in answer
        assert _post(collector.url, key, protobuf(not_genai, {}), "application/x-protobuf")[0] == 200
        assert _post(collector.url, key, protobuf(not_genai, {}), "application/x-protobuf")[0] == 200
        req = urllib.request.Request(f"{collector.url}/v1/traces", data=protobuf(not_genai, {}), method="POST",
                                     headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {key}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=30)
        assert refused.value.code == 429 and int(refused.value.headers["Retry-After"]) >= 1  # spans it ignores count too
