"""Session batches close on count, split on size, expire on delay, and keep emit order."""

from __future__ import annotations

import pytest

from rewardflow.client.batching import SessionBatcher
from rewardflow.client.encoding import encoder_for
from rewardflow.client.errors import RecordTooLarge
from rewardflow.events.errors import EventError
from rewardflow.events.wire import decode_record


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(max_events: int = 3, max_bytes: int = 10_000, delay: float = 1.0, fmt: str = "avro") -> tuple[SessionBatcher, Clock]:
    clock = Clock()
    return SessionBatcher(encoder_for(fmt), max_events, max_bytes, delay, clock), clock


def test_closes_when_full_and_counts_buffered() -> None:
    batcher, _ = make(max_events=3)
    assert batcher.add("s", "e1", b"a") == ()
    assert batcher.add("s", "e2", b"b") == ()
    assert batcher.buffered == 2
    [batch] = batcher.add("s", "e3", b"c")
    assert (batch.count, batch.pieces, batch.session_id) == (3, [b"a", b"b", b"c"], "s")
    assert batcher.buffered == 0 and len(batcher) == 0


def test_sessions_batch_separately() -> None:
    batcher, _ = make(max_events=2)
    batcher.add("a", "1", b"a1")
    batcher.add("b", "2", b"b1")
    [a] = batcher.add("a", "3", b"a2")
    assert a.pieces == [b"a1", b"a2"] and len(batcher) == 1


def test_split_when_the_next_piece_would_exceed_the_record_limit() -> None:
    batcher, _ = make(max_events=100, max_bytes=200)
    encoder = encoder_for("avro")
    room = 200 - len(encoder.head("0123456789ab-0", "s")) - encoder.tail
    piece = b"x" * (room // 2)
    assert batcher.add("s", "1", piece) == ()
    assert batcher.add("s", "2", piece) == ()
    [first] = batcher.add("s", "3", piece)  # the third does not fit: the first two leave together
    assert first.count == 2 and batcher.buffered == 1


def test_event_too_large_alone_is_refused_without_side_effects() -> None:
    batcher, _ = make(max_events=100, max_bytes=1_024)
    batcher.add("s", "1", b"small")
    with pytest.raises(RecordTooLarge) as info:
        batcher.add("s", "big", b"x" * 1_024)
    assert isinstance(info.value, EventError) and info.value.code == "too_large"
    assert "REWARDFLOW_MAX_RECORD_BYTES" in str(info.value) and info.value.limit == 1_024
    assert batcher.buffered == 1 and [b.count for b in batcher.drain()] == [1]


def test_expired_closes_oldest_first_and_only_the_due() -> None:
    batcher, clock = make(delay=1.0)
    batcher.add("a", "1", b"a")
    clock.now += 0.6
    batcher.add("b", "2", b"b")
    clock.now += 0.5  # a is 1.1 s old, b 0.5 s
    assert [b.session_id for b in batcher.expired()] == ["a"]
    batcher.add("a", "3", b"a")  # reopens a, now the youngest
    clock.now += 0.6
    assert [b.session_id for b in batcher.expired()] == ["b"]
    assert [b.session_id for b in batcher.drain()] == ["a"]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_batched_records_respect_the_limit_and_decode(fmt: str) -> None:
    from rewardflow.events.samples import session_events

    encoder = encoder_for(fmt)
    batcher, _ = make(max_events=500, max_bytes=2_048, fmt=fmt)
    events = session_events(4, turns=10)
    closed = []
    for event in events:
        closed += batcher.add(event.session_id, event.event_id, encoder.piece(event))
    closed += batcher.drain()
    values = [encoder.record(b.head, b.pieces) for b in closed]
    assert len(values) > 1 and all(len(v) <= 2_048 for v in values)
    decoded = [d["event_id"] for v in values for d in decode_record(v, encoder.headers, max_bytes=2_048)]  # type: ignore[arg-type]
    assert decoded == [e.event_id for e in events]
    assert len({b.head for b in closed}) == len(closed)  # distinct batch ids
