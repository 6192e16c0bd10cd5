"""The SDK's Avro writers are safe to call from several threads at once (emit() encodes outside its lock)."""

from __future__ import annotations

import threading

from rewardflow.client.encoding import encoder_for
from rewardflow.events.samples import session_events


def test_concurrent_encodes_of_one_event_type_never_mix() -> None:
    encoder = encoder_for("avro")
    events = [e for i in range(8) for e in session_events(200 + i, turns=20) if e.event_type == "PersistenceCheck"]
    expected = {e.event_id: encoder.piece(e) for e in events}
    wrong: list[str] = []

    def hammer(chunk: list) -> None:  # type: ignore[type-arg]
        for _ in range(100):
            for e in chunk:
                if encoder.piece(e) != expected[e.event_id]:
                    wrong.append(e.event_id)

    threads = [threading.Thread(target=hammer, args=(events[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(events) > 50 and not wrong
