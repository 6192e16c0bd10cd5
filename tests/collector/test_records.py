"""How the edge cuts one session's admitted events into the records the worker takes whole."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rewardflow.collector.records import RecordTooLarge, session_records
from rewardflow.events.wire import decode_record, encode_json
from tests.factories import ev


def _events(n: int, text: int = 0) -> list[dict[str, Any]]:
    return [ev("FollowUp", "r1", "s1", dissatisfied=False, text_redacted="t" * text) for _ in range(n)]


def test_a_session_that_fits_is_one_record_written_as_encode_json_writes_it() -> None:
    for n in (1, 2, 7):
        events = _events(n)
        assert session_records(events, 1_000_000, 500) == [encode_json(events)]


def test_a_session_over_the_event_limit_is_cut_into_runs_of_at_most_that_many_in_order() -> None:
    events = _events(11)
    records = session_records(events, 1_000_000, 4)
    assert [len(decode_record(r)) for r in records] == [4, 4, 3]
    assert [e for r in records for e in decode_record(r)] == events


def test_a_session_over_the_byte_limit_is_cut_into_records_that_each_fit() -> None:
    events = _events(40, text=16_000)  # ~656 KB as one record: over a 100 KB limit
    limit = 100_000
    records = session_records(events, limit, 500)
    assert len(encode_json(events)) > limit and all(len(r) <= limit for r in records)
    assert [e for r in records for e in decode_record(r, max_bytes=limit)] == events
    assert all(len(r) + len(orjson.dumps(events[0])) + 1 > limit for r in records[:-1])  # greedy: each as full as it can be


def test_an_event_that_alone_is_over_the_byte_limit_is_refused_naming_it() -> None:
    events = _events(3) + _events(1, text=2_000)
    with pytest.raises(RecordTooLarge, match=r"event 3 of session 's1' encodes to [\d,]+ bytes; a record holds at most 1,500"):
        session_records(events, 1_500, 500)


def test_a_split_session_is_in_event_time_order_so_no_record_holds_an_event_older_than_an_earlier_ones() -> None:
    events = [ev("FollowUp", "r1", "s1", ts, dissatisfied=False) for ts in (5_000, 1_000, 4_000, 2_000, 3_000, 3_000)]
    events[5]["event_id"] = "second-at-3000"
    records = [decode_record(r) for r in session_records(events, 1_000_000, 2)]
    assert [[e["ts"] for e in r] for r in records] == [[1_000, 2_000], [3_000, 3_000], [4_000, 5_000]]
    assert records[1][1]["event_id"] == "second-at-3000"  # one ts: the request's order
