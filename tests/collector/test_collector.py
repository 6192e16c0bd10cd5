"""The edge against a real broker and chDB: refusals, partial batches, tenancy, skewed clocks, redaction."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rewardflow.collector.keys import IngestKeys
from rewardflow.collector.server import Collector, keys_from_client
from rewardflow.events.wire import decode_record
from rewardflow.kafka.provision import ensure_topics
from rewardflow.settings import Settings
from tests.collector.http import post_events
from tests.conftest_clickhouse import ChDatabase
from tests.conftest_kafka import SessionBroker
from tests.core.feed import Feed
from tests.factories import ev, turn
from tests.slowclients import closed_now, trickle
from tests.streams.kafka_io import read_raw

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse]


@dataclass
class Edge:
    settings: Settings
    url: str
    key: str
    keys: IngestKeys


@pytest.fixture
def edge(kafka_broker: SessionBroker, ch_db: ChDatabase, unique_group: str) -> Iterator[Edge]:
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"{unique_group}.", partitions=2,
                              collect_key_refresh_s=0.5, collect_rate_events_per_s=5.0, collect_rate_burst=200,
                              collect_max_body_bytes=64 * 1024, collect_ack_timeout_s=5.0)
    ensure_topics(settings)
    keys = IngestKeys(ch_db.client)
    _, secret = keys.create("org", "tests")
    with Collector(settings, keys_from_client(ch_db.client), port=0) as collector:
        yield Edge(settings, collector.url, secret, keys)


def _produced(settings: Settings) -> list[dict[str, Any]]:
    """Every event on the raw topic, decoded."""
    out = []
    for records in read_raw(settings).values():
        for r in records:
            out.extend(decode_record(r.value, r.headers))
    return out


def test_refusals_say_why(edge: Edge) -> None:
    events = turn("r1", horizons=(30,))
    status, body, _ = post_events(edge.url, None, events)
    assert status == 401 and "Bearer" in body["error"]
    assert post_events(edge.url, "rfk_000000000000_" + "x" * 43, events)[0] == 401
    status, body, _ = post_events(edge.url, edge.key, [ev("FollowUp", "r1", org_id="someone-else")])
    assert status == 403 and "org_id" in body["error"]
    status, body, _ = post_events(edge.url, edge.key, [], body=b"{" + b" " * 70_000 + b"}")
    assert status == 413 and "bytes" in body["error"]
    assert post_events(edge.url, edge.key, events)[0] == 202
    status, body, headers = post_events(edge.url, edge.key, [ev("FollowUp", "r1")] * 199)
    assert status == 429 and "rate" in body["error"] and int(headers["retry-after"]) >= 1


def test_a_key_opening_sessions_faster_than_its_session_rate_gets_429(kafka_broker: SessionBroker, ch_db: ChDatabase,
                                                                        unique_group: str) -> None:
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"{unique_group}.", partitions=2,
                              collect_new_sessions_per_s=0.01, collect_new_sessions_burst=5)
    ensure_topics(settings)
    _, secret = IngestKeys(ch_db.client).create("org", "tests")
    with Collector(settings, keys_from_client(ch_db.client), port=0) as collector:
        assert post_events(collector.url, secret, [ev("FollowUp", f"r{i}", f"s{i}") for i in range(5)])[0] == 202
        assert post_events(collector.url, secret, [ev("FollowUp", "r9", "s1")])[0] == 202  # a session it opened
        status, body, headers = post_events(collector.url, secret, [ev("FollowUp", "r5", "s1"), ev("FollowUp", "r6", "s6")])
        assert status == 429 and "new sessions/s" in body["error"] and int(headers["retry-after"]) >= 1
    assert sorted(e["request_id"] for e in _produced(settings)) == ["r0", "r1", "r2", "r3", "r4", "r9"]


def test_a_key_sending_free_text_faster_than_its_text_rate_gets_429_and_another_key_does_not(
        kafka_broker: SessionBroker, ch_db: ChDatabase, unique_group: str) -> None:
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"{unique_group}.", partitions=2,
                              collect_rate_text_chars_per_s=1.0, collect_rate_text_burst=20_000,
                              collect_rate_events_per_s=0.01, collect_rate_burst=4)
    ensure_topics(settings)
    keys = IngestKeys(ch_db.client)
    (_, greedy), (_, other) = keys.create("org", "greedy"), keys.create("org", "other")
    text = "the fix broke the build again " * 500  # 15,000 characters
    with Collector(settings, keys_from_client(ch_db.client), port=0) as collector:
        assert post_events(collector.url, greedy, [ev("FollowUp", "r1", text_redacted=text)])[0] == 202
        status, body, headers = post_events(collector.url, greedy, [ev("FollowUp", "r2", text_redacted=text)])
        assert status == 429 and "REWARDFLOW_COLLECT_RATE_TEXT_CHARS_PER_S" in body["error"]
        assert int(headers["retry-after"]) >= 1
        # events without text pass, and the refused request spent none of the key's 4 events
        assert [post_events(collector.url, greedy, [ev("FollowUp", f"r3{i}")])[0] for i in range(3)] == [202] * 3
        assert post_events(collector.url, other, [ev("FollowUp", "r4", text_redacted=text)])[0] == 202
        status, body, _ = post_events(collector.url, other, [ev("FollowUp", f"r{i}", text_redacted=text) for i in (5, 6)])
        assert status == 413 and "REWARDFLOW_COLLECT_RATE_TEXT_BURST" in body["error"]
    assert sorted(e["request_id"] for e in _produced(settings)) == ["r1", "r30", "r31", "r32", "r4"]


def test_the_edge_serves_others_while_a_request_is_judged(edge: Edge, monkeypatch: pytest.MonkeyPatch) -> None:
    """Judging a request with much free text (scrubbing it) runs off the edge's event loop: while one such
    request's judgement is held, /healthz and another key's request are answered."""
    import rewardflow.collector.app as app

    held, release = threading.Event(), threading.Event()
    real = app.admit

    def slow_admit(doc: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if any(e.get("request_id") == "held" for e in doc["events"]):
            held.set()
            release.wait(30)
        return real(doc, *args, **kwargs)

    monkeypatch.setattr(app, "admit", slow_admit)
    answers: list[int] = []
    first = threading.Thread(target=lambda: answers.append(post_events(edge.url, edge.key, [ev("FollowUp", "held", text_redacted="the tests fail again " * 200)])[0]))
    first.start()
    try:
        assert held.wait(10)
        with urllib.request.urlopen(f"{edge.url}/healthz", timeout=10) as resp:
            assert resp.status == 200
        assert post_events(edge.url, edge.key, [ev("FollowUp", "other")], timeout=10)[0] == 202
        assert answers == []
    finally:
        release.set()
        first.join(30)
    assert answers == [202]


def test_a_session_sent_through_the_sdk_and_through_the_edge_lands_on_one_partition(edge: Edge) -> None:
    """A backend may send a turn's InferenceServed with the SDK while the editor sends its signals through
    the edge: both producers hash a session's key alike, so one processor joins the whole turn."""
    from rewardflow.client import EventProducer, ProducerConfig

    settings = edge.settings.model_copy(update={"partitions": 4, "topic_prefix": edge.settings.topic_prefix + "split."})
    ensure_topics(settings)
    sessions = [f"sess-{i}" for i in range(24)]
    with Collector(settings, keys_from_client(edge.keys.client), port=0) as collector:
        with EventProducer(settings, ProducerConfig()) as sdk:
            for sid in sessions:
                sdk.emit(ev("InferenceServed", f"r-{sid}", sid))
            sdk.flush()
        for sid in sessions:
            assert post_events(collector.url, edge.key, [ev("FollowUp", f"r-{sid}", sid)])[0] == 202
    where: dict[str, set[int]] = {}
    for partition, records in read_raw(settings).items():
        for r in records:
            for e in decode_record(r.value, r.headers):
                where.setdefault(e["session_id"], set()).add(partition)
    assert sorted(where) == sorted(sessions)
    assert {sid: ps for sid, ps in where.items() if len(ps) > 1} == {}
    assert len(set().union(*where.values())) > 1  # the sessions spread over partitions


def test_a_revoked_key_stops_working_within_seconds(edge: Edge) -> None:
    assert post_events(edge.url, edge.key, [ev("FollowUp", "r1")])[0] == 202
    key_id = edge.key.split("_")[1]
    assert edge.keys.revoke(key_id) is not None
    deadline = time.monotonic() + 5
    while post_events(edge.url, edge.key, [ev("FollowUp", "r2")])[0] != 401:
        assert time.monotonic() < deadline, "the revoked key still works"
        time.sleep(0.1)
    assert [k.revoked for k in edge.keys.all() if k.key_id == key_id] == [True]


def test_only_the_valid_events_of_a_partly_bad_batch_reach_kafka(edge: Edge) -> None:
    good = turn("r1", horizons=(30, 120))
    bad = [ev("ToolCall", "r1", status="exploded"), ev("AgentEdit", "r1", lines_added=-3)]
    status, body, _ = post_events(edge.url, edge.key, [bad[0], *good, bad[1]], gzipped=True)
    assert status == 202 and body["accepted"] == len(good)
    assert [(r["index"], r["field"]) for r in body["rejected"]] == [(0, "status"), (len(good) + 1, "lines_added")]
    produced = _produced(edge.settings)
    assert sorted(e["event_id"] for e in produced) == sorted(e["event_id"] for e in good)


def _rewards_through_edge(edge: Edge, skew_ms: int, rid: str) -> list[float]:
    """Send one turn as a client whose clock is ``skew_ms`` off, then score what reached Kafka."""
    start = int(time.time() * 1000) - 20 * 60_000  # a turn of 20 minutes ago, every horizon checked since
    events = [{**e, "ts": e["ts"] + skew_ms} for e in turn(rid, session_id=f"s-{rid}", ts=start)]
    status, body, _ = post_events(edge.url, edge.key, events, sent_at=int(time.time() * 1000) + skew_ms)
    assert status == 202 and body["accepted"] == len(events), body
    mine = [e for e in _produced(edge.settings) if e["request_id"] == rid]
    feed = Feed()
    feed.send(*sorted(mine, key=lambda e: e["ts"]))
    feed.tick(max(e["ts"] for e in mine) + 10 * 3_600_000)
    return [r["reward"] for r in feed.final()]


def test_skewed_client_clocks_give_the_rewards_of_a_correct_one(edge: Edge) -> None:
    honest = _rewards_through_edge(edge, 0, "honest")
    assert len(honest) == 1
    assert _rewards_through_edge(edge, 3 * 3_600_000, "ahead") == honest
    assert _rewards_through_edge(edge, -3 * 3_600_000, "behind") == honest


def test_a_secret_pasted_into_a_follow_up_never_reaches_kafka_or_clickhouse(edge: Edge, ch_db: ChDatabase) -> None:
    secret = "ghp_" + "Zq8" * 12
    status, _, _ = post_events(edge.url, edge.key, [ev("FollowUp", "r1", text_redacted=f"try again, token {secret}")])
    assert status == 202
    raw = b"".join(r.value or b"" for rs in read_raw(edge.settings).values() for r in rs)
    assert secret.encode() not in raw and b"[REDACTED:GitHub Token]" in raw
    feed = Feed()
    for rs in read_raw(edge.settings).values():
        for r in rs:
            feed.record(r.value, r.headers)
    from rewardflow.clickhouse.tables import EVENTS

    names = list(EVENTS.record_columns)
    ch_db.client.insert("events", [[row[n] for n in names] for row in feed.total.valid], column_names=names)
    stored = ch_db.client.query("SELECT payload FROM events").result_rows
    assert stored and all(secret not in p for (p,) in stored)
    metrics = __import__("urllib.request").request.urlopen(f"{edge.url}/metrics").read().decode()
    assert 'rewardflow_collect_redacted_total{kind="GitHub Token"} 1.0' in metrics


def test_rejections_are_counted_under_contract_fields_only(edge: Edge) -> None:
    events = [ev("ToolCall", "r1", status="exploded"), {**ev("FollowUp", "r1"), "attacker-label-1": 1}]
    assert post_events(edge.url, edge.key, events)[0] == 202
    metrics = __import__("urllib.request").request.urlopen(f"{edge.url}/metrics").read().decode()
    assert 'outcome="invalid:status"} 1.0' in metrics and 'outcome="invalid:other"} 1.0' in metrics
    assert "attacker-label-1" not in metrics


def test_a_session_too_large_for_one_record_reaches_kafka_as_records_the_worker_takes(
        kafka_broker: SessionBroker, ch_db: ChDatabase, unique_group: str) -> None:
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"{unique_group}.", partitions=2,
                              collect_max_body_bytes=64 * 1024, collect_ack_timeout_s=5.0,
                              max_record_bytes=4_096, max_batch_events=3)
    ensure_topics(settings)
    keys = IngestKeys(ch_db.client)
    _, secret = keys.create("org", "tests")
    events = [ev("FollowUp", "r1", "s1", text_redacted="t" * 1_000, dissatisfied=False) for _ in range(10)]
    with Collector(settings, keys_from_client(ch_db.client), port=0) as collector:
        status, body, _ = post_events(collector.url, secret, events)
        assert status == 202 and body["accepted"] == 10
        big = [ev("FollowUp", "r2", "s2", text_redacted="t" * 5_000), ev("FollowUp", "r2", "s3", dissatisfied=True)]
        status, body, _ = post_events(collector.url, secret, big)
        assert status == 202 and body["accepted"] == 1
        assert [(r["index"], r["field"]) for r in body["rejected"]] == [(0, "<event>")]
        assert "REWARDFLOW_MAX_RECORD_BYTES" in body["rejected"][0]["reason"]
    records = [r for rs in read_raw(settings).values() for r in rs]
    assert all(len(r.value) <= 4_096 for r in records) and len(records) >= 4
    landed = [e for r in records for e in decode_record(r.value, r.headers, max_bytes=4_096, max_batch_events=3)]
    assert [e["event_id"] for e in landed if e["session_id"] == "s1"] == [e["event_id"] for e in events]  # in order
    assert {e["session_id"] for e in landed} == {"s1", "s3"}  # and not the oversized s2 event


def _edge_of(kafka_broker: SessionBroker, ch_db: ChDatabase, unique_group: str, **overrides: Any) -> Collector:
    settings = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"{unique_group}.", partitions=2,
                              **overrides)
    ensure_topics(settings)
    return Collector(settings, keys_from_client(ch_db.client), port=0)


@pytest.mark.parametrize("part", ["head", "body", "blank lines"])
def test_a_request_sent_a_byte_at_a_time_is_closed_at_its_deadline_without_a_key(
        kafka_broker: SessionBroker, ch_db: ChDatabase, unique_group: str, part: str) -> None:
    """A client that sends a byte now and then, never finishing its request, holds a connection (an open
    file of the process the edge shares with its Kafka clients) only until the request's deadline."""
    with _edge_of(kafka_broker, ch_db, unique_group, collect_idle_timeout_s=1.0,
                  collect_request_timeout_s=2.5) as collector:
        host, port = collector.url.rsplit("/", 1)[-1].rsplit(":", 1)
        start = {"head": b"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-a: ", "blank lines": b"\r\n",
                 "body": b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"}[part]
        sockets = [socket.create_connection((host, int(port)), timeout=5) for _ in range(8)]
        # (blank lines before a request are skipped by the parser: each one must still count as a head begun)
        still_open = trickle(sockets, start, 10.0, drip=b"\r\n" if part == "blank lines" else b"a")
        assert not still_open, f"{len(still_open)} slow requests still open after 10 s"
        for sock in sockets:
            sock.close()
        assert post_events(collector.url, None, [ev("FollowUp")])[0] == 401  # still serving


@pytest.mark.parametrize("head", ["many headers", "a long target"])
def test_a_request_head_over_16_kib_in_one_read_is_refused(kafka_broker: SessionBroker, ch_db: ChDatabase,
                                                          unique_group: str, head: str) -> None:
    """The head is counted as the parser reads it, not by the reads that carry it: a head sent whole in one
    large write is refused as one sent a byte at a time."""
    with _edge_of(kafka_broker, ch_db, unique_group) as collector:
        host, port = collector.url.rsplit("/", 1)[-1].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5)
        if head == "many headers":
            request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(5_000))
        else:
            request = b"GET /healthz?" + b"a" * 40_000 + b" HTTP/1.1\r\nHost: x\r\n"
        try:
            sock.sendall(request + b"\r\n")
        except OSError:
            pass  # refused and closed before all of it was sent
        answer = b""
        try:
            answer = sock.recv(1024)
        except OSError:
            pass
        sock.close()
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:80]
        with urllib.request.urlopen(f"{collector.url}/healthz", timeout=5) as resp:  # a head within the limit
            assert resp.status == 200


def test_a_request_head_over_its_limit_is_refused_and_connections_over_the_edges_are_answered_503(
        kafka_broker: SessionBroker, ch_db: ChDatabase, unique_group: str) -> None:
    with _edge_of(kafka_broker, ch_db, unique_group, collect_max_connections=16, collect_max_client_connections=64,
                  collect_idle_timeout_s=30.0) as collector:
        host, port = collector.url.rsplit("/", 1)[-1].rsplit(":", 1)
        flood = socket.create_connection((host, int(port)), timeout=5)
        flood.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nX-a: ")
        sent = 0
        try:
            for _ in range(64):  # 4 MiB of one header line, at most
                flood.sendall(b"a" * 65_536)
                sent += 65_536
        except OSError:
            pass
        answer = b""
        try:
            answer = flood.recv(1024)
        except OSError:
            pass
        assert sent < 4 * 1024 * 1024 or answer.startswith(b"HTTP/1.1 400") or closed_now(flood)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:80]
        flood.close()
        held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(16)]
        time.sleep(0.3)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{collector.url}/healthz", timeout=5)
        assert refused.value.code == 503
        for sock in held:
            sock.close()
        time.sleep(0.3)
        assert post_events(collector.url, None, [ev("FollowUp")])[0] == 401  # a free slot again
