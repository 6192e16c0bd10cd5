"""Kafka stops while clients post and retry: a 202 means the event is in Kafka, the rest were told 503,
and their retries land. The pipeline then holds every acknowledged event exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rewardflow.collector.keys import IngestKeys
from rewardflow.collector.server import Collector, keys_from_client
from rewardflow.events.wire import decode_record
from rewardflow.kafka.provision import ensure_topics
from rewardflow.kafka_local import LocalBroker
from rewardflow.kafka_local.ports import free_ports
from rewardflow.settings import load_settings
from tests.collector.http import post_events
from tests.conftest_clickhouse import ChDatabase
from tests.core.feed import Feed
from tests.factories import ev
from tests.streams.kafka_io import read_raw

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse]


def test_every_acknowledged_event_lands_once_across_a_kafka_outage(ch_db: ChDatabase, tmp_path: Path) -> None:
    port, controller = free_ports(2)
    broker = LocalBroker(load_settings().home, port, controller, partitions=2, data_dir=tmp_path / "kafka",
                         die_with_parent=True)
    broker.up(timeout=120)
    try:
        settings = ch_db.settings(kafka_bootstrap=broker.bootstrap, partitions=2, collect_ack_timeout_s=2.0,
                                  collect_rate_events_per_s=1e6, collect_rate_burst=1_000_000)
        ensure_topics(settings)
        _, key = IngestKeys(ch_db.client).create("org")
        acked: list[str] = []
        told_503 = 0
        stop = threading.Event()

        def client(n: int) -> None:
            nonlocal told_503
            i = 0
            while not stop.is_set():
                batch = [ev("FollowUp", f"r{n}-{i}", f"s{n}", event_id=f"e{n}-{i}-{j}") for j in range(5)]
                while True:  # a client retries the same events until they are acknowledged
                    status, _, _ = post_events(collector.url, key, batch, timeout=30)
                    if status == 202:
                        acked.extend(e["event_id"] for e in batch)
                        break
                    assert status == 503, status
                    told_503 += 1
                    time.sleep(0.2)
                i += 1

        with Collector(settings, keys_from_client(ch_db.client), port=0) as collector:
            threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
            for t in threads:
                t.start()
            time.sleep(2)
            broker.down(timeout=30)
            time.sleep(4)
            broker.up(timeout=120)
            time.sleep(3)
            stop.set()
            for t in threads:
                t.join(timeout=120)
        assert told_503 > 0, "the outage was not noticed"
        assert len(acked) == len(set(acked)) > 40
        feed = Feed(partition=0)
        raw = [r for rs in read_raw(settings, timeout=60).values() for r in rs]
        produced = [e["event_id"] for r in raw for e in decode_record(r.value, r.headers)]
        assert set(acked) <= set(produced)  # nothing acknowledged was lost
        for r in raw:
            feed.record(r.value, r.headers)
        stored = [row["event_id"] for row in feed.total.valid]
        assert sorted(stored) == sorted(set(produced)) and set(acked) <= set(stored)  # each once; retries deduplicated
    finally:
        broker.down(timeout=30)
