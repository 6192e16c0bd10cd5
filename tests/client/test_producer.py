"""EventProducer against a fake Kafka producer: validation, batching, accounting, errors, lifecycle."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pydantic import SecretStr

from rewardflow.client import (
    BufferFull,
    EventProducer,
    InvalidEvent,
    ProducerClosed,
    ProducerConfig,
    RecordTooLarge,
    UndeliveredEvents,
)
from rewardflow.events.models import FollowUp
from rewardflow.events.samples import sample_events, session_events
from rewardflow.events.validate import validate_event
from rewardflow.events.wire import decode_record
from rewardflow.settings import Settings, load_settings
from tests.client.fakes import FakeError, FakeKafka, factory

TIMEOUT = FakeError("_MSG_TIMED_OUT", "Local: Message timed out")


def make(config: ProducerConfig | None = None, settings: Settings | None = None, **fake: Any) -> tuple[EventProducer, FakeKafka]:
    holder: list[FakeKafka] = []
    producer = EventProducer(settings or load_settings(), config or ProducerConfig(topic="t"), kafka_factory=factory(holder, **fake))
    return producer, holder[0]


def decoded(fake: FakeKafka, max_bytes: int = 1_000_000) -> list[Any]:
    return [validate_event(raw) for _, value, _, headers in fake.records for raw in decode_record(value, headers, max_bytes=max_bytes)]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_events_arrive_keyed_by_session_in_emit_order(fmt: str) -> None:
    events = sample_events(3_000, seed=5)
    producer, fake = make(ProducerConfig(topic="t", wire_format=fmt, max_events=50))  # type: ignore[arg-type]
    with producer:
        for event in events:
            producer.emit(event)
    assert producer.stats.sent == 3_000 and producer.stats.pending == 0 and producer.stats.failed == 0
    for topic, value, key, headers in fake.records:
        assert topic == "t" and dict(headers) == {"rf-format": fmt.encode()}
        assert {raw["session_id"] for raw in decode_record(value, headers)} == {key.decode()}
    out = decoded(fake)
    assert sorted(e.event_id for e in out) == sorted(e.event_id for e in events)
    for session in {e.session_id for e in events}:  # per-session order is emit order
        assert [e for e in out if e.session_id == session] == [e for e in events if e.session_id == session]


def test_dicts_are_validated_before_anything_is_sent() -> None:
    producer, fake = make()
    good = session_events(1, turns=1)[0].model_dump()
    with pytest.raises(InvalidEvent) as info:
        producer.emit({**good, "ts": "yesterday"})
    assert info.value.field == "ts"
    with pytest.raises(InvalidEvent, match="expected an event model or a dict"):
        producer.emit(["not", "an", "event"])  # type: ignore[arg-type]
    producer.emit(good)
    producer.close()
    assert producer.stats.accepted == 1 and decoded(fake) == [validate_event(good)]


def test_unencodable_text_is_an_invalid_event_naming_the_field() -> None:
    producer, fake = make()
    event = next(e for e in sample_events(500) if e.event_type == "FollowUp")
    # pydantic refuses lone surrogates; model_construct skips validation, the encoder still catches it
    broken = FollowUp.model_construct(**{**dict(event.__dict__), "text_redacted": "bad \ud800 surrogate"})
    with pytest.raises(InvalidEvent) as info:
        producer.emit(broken)
    assert info.value.field == "text_redacted"
    assert producer.close().accepted == 0 and fake.records == []



@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_an_unvalidated_model_that_does_not_fit_the_schema_is_refused(fmt: str) -> None:
    producer, fake = make(ProducerConfig(topic="t", wire_format=fmt))  # type: ignore[arg-type]
    base = next(e for e in sample_events(500) if e.event_type == "ToolCall")
    cases: list[dict[str, Any]] = [{"duration_ms": object()}]
    if fmt == "avro":  # JSON checks no enum, type, range or presence
        cases += [{"status": "weird"}, {"duration_ms": "12"}, {"producer": None},
                  # integers outside their Avro type are refused, never wrapped
                  {"ts": 2**64 + base.ts}, {"ts": -(2**63) - 1}, {"duration_ms": 2**31}, {"duration_ms": -(2**31) - 1},
                  {"schema_version": 2**40}]
    bad = [type(base).model_construct(**{**base.__dict__, **changes}) for changes in cases]
    for event in bad:
        with pytest.raises(InvalidEvent):
            producer.emit(event)
    producer.emit(base)
    assert producer.close().accepted == 1 and decoded(fake) == [base]


def test_batches_past_their_delay_leave_while_another_thread_keeps_emitting() -> None:
    """The pump never waits for the emit path's lock; the emitting thread sends what is due."""
    producer, fake = make(ProducerConfig(topic="t", max_delay_ms=20))
    first, *others = sample_events(20_000, seed=3)
    producer.emit(first)
    sent_while_emitting = False
    deadline = time.monotonic() + 2.0
    for event in others:
        if event.session_id != first.session_id:
            producer.emit(event)
        if any(key == first.session_id.encode() for _, _, key, _ in list(fake.records)):
            sent_while_emitting = True
            break
        if time.monotonic() > deadline:
            break
    assert sent_while_emitting
    producer.close()

def test_a_single_oversized_event_is_refused() -> None:
    producer, fake = make(settings=load_settings(max_record_bytes=4_096))
    event = next(e for e in sample_events(500) if e.event_type == "FollowUp")
    big = FollowUp.model_validate({**event.model_dump(), "text_redacted": "x" * 5_000})
    with pytest.raises(RecordTooLarge, match="4096-byte limit"):
        producer.emit(big)
    assert producer.close().accepted == 0 and fake.records == []


def test_session_batches_split_at_the_record_limit() -> None:
    producer, fake = make(settings=load_settings(max_record_bytes=4_096))
    events = session_events(9, turns=20)
    with producer:
        for event in events:
            producer.emit(event)
    assert len(fake.records) > 1 and all(len(value) <= 4_096 for _, value, _, _ in fake.records)
    assert decoded(fake, max_bytes=4_096) == events


def test_max_delay_sends_without_flush() -> None:
    producer, fake = make(ProducerConfig(topic="t", max_delay_ms=20))
    producer.emit(session_events(2, turns=1)[0])
    deadline = time.monotonic() + 5
    while not fake.records and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(fake.records) == 1
    producer.close()


def test_delivery_failures_are_counted_by_reason_and_raised_once() -> None:
    producer, fake = make(fail_with=TIMEOUT)
    events = session_events(3, turns=2)
    for event in events:
        producer.emit(event)
    with pytest.raises(UndeliveredEvents) as info:
        producer.flush(5)
    reason = "_MSG_TIMED_OUT: Local: Message timed out"
    assert info.value.failures == {reason: len(events)}
    assert info.value.stats.failed == len(events) and info.value.stats.pending == 0
    assert f"{len(events)} events failed delivery" in str(info.value)
    assert producer.flush(1).failures == {reason: len(events)}  # reported once; the count stays
    producer.close()


def test_refused_batches_wait_in_order_and_are_not_lost() -> None:
    producer, fake = make(ProducerConfig(topic="t", max_events=2), refuse=3)
    events = session_events(6, turns=2)
    with producer:
        for event in events:
            producer.emit(event)
    assert decoded(fake) == events and producer.stats.sent == len(events)


class Silent(FakeKafka):
    """Never reports deliveries: an unreachable broker."""

    def poll(self, timeout: float = 0) -> int:
        time.sleep(min(timeout, 0.01))
        return 0

    def flush(self, timeout: float = -1) -> int:
        time.sleep(max(0.0, min(timeout, 0.2)))
        return len(self.records)


def test_bound_reached_raises_buffer_full_and_counts_stay_exact() -> None:
    holder: list[FakeKafka] = []
    producer = EventProducer(load_settings(), ProducerConfig(topic="t", max_pending_events=600, max_events=10, block_timeout_s=0.1),
                             kafka_factory=lambda cfg: holder.append(Silent(cfg)) or holder[-1])
    events = sample_events(1_000, seed=8)
    with pytest.raises(BufferFull) as info:
        for event in events:
            producer.emit(event)
    assert info.value.stats.accepted == 600 and info.value.stats.pending == 600
    assert "max_pending_events=600" in str(info.value)
    with pytest.raises(UndeliveredEvents, match="600 events still undelivered"):
        producer.close(timeout=0.2)
    with pytest.raises(ProducerClosed):
        producer.emit(events[0])


def test_context_exit_raises_on_undelivered_but_never_masks_an_error() -> None:
    producer, _ = make(fail_with=TIMEOUT)
    with pytest.raises(UndeliveredEvents):
        with producer:
            producer.emit(session_events(1, turns=1)[0])
    producer, _ = make(fail_with=TIMEOUT)
    with pytest.raises(KeyError) as info:
        with producer:
            producer.emit(session_events(1, turns=1)[0])
            raise KeyError("boom")
    assert any("1 events failed delivery" in note for note in info.value.__notes__)


def test_many_threads_emit_safely() -> None:
    producer, fake = make(ProducerConfig(topic="t", max_events=20))
    chunks = [session_events(100 + i, turns=30) for i in range(4)]
    threads = [threading.Thread(target=lambda c=c: [producer.emit(e) for e in c]) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    producer.close()
    out = decoded(fake)
    for chunk in chunks:
        assert [e for e in out if e.session_id == chunk[0].session_id] == chunk
    assert producer.stats.sent == sum(map(len, chunks))


def test_librdkafka_config_is_safe_and_carries_security_settings() -> None:
    settings = load_settings(kafka_bootstrap="127.0.0.1:9", kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="PLAIN",
                             kafka_sasl_username="u", kafka_sasl_password=SecretStr("p"))
    cfg = ProducerConfig(compression="zstd", linger_ms=7, kafka_overrides={"client.id": "me"}).resolve(settings).kafka
    assert cfg["enable.idempotence"] is True and cfg["acks"] == "all" and cfg["compression.type"] == "zstd"
    assert cfg["sasl.username"] == "u" and cfg["sasl.password"] == "p" and cfg["security.protocol"] == "SASL_PLAINTEXT"
    assert cfg["linger.ms"] == 7 and cfg["client.id"] == "me" and cfg["partitioner"] == "murmur2_random"
    assert cfg["message.max.bytes"] > settings.max_record_bytes


@pytest.mark.parametrize(("config", "message"), [
    (ProducerConfig(max_events=501), "REWARDFLOW_MAX_BATCH_EVENTS"),
    (ProducerConfig(kafka_overrides={"acks": "1"}), "acks"),
    (ProducerConfig(kafka_overrides={"partitioner": "consistent_random"}), "partitioner"),
    (ProducerConfig(max_pending_events=10, max_events=50), "max_pending_events"),
    (ProducerConfig(wire_format="xml"), "wire_format"),  # type: ignore[arg-type]
])
def test_unsafe_configs_fail_at_construction(config: ProducerConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config.resolve(load_settings())
