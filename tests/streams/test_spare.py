"""A worker holding no partition (a spare, as ``rewardflow run --workers N`` above the partitions makes)
stays in the consumer group: it takes over at once when the worker holding a partition goes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from rewardflow.kafka import topics as T
from rewardflow.kafka.provision import ensure_topics
from rewardflow.settings import Settings
from tests.conftest_kafka import SessionBroker
from tests.streams.kafka_io import stable_members
from tests.streams.worker import WorkerProcess

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]
POLL_INTERVAL_S = 8  # Faust's broker_max_poll_interval, read from the environment (1,000 s by default)


def members(settings: Settings) -> dict[str, set[int]]:
    """Member id -> raw partitions, while the group is stable (empty otherwise)."""
    raw = settings.topic(T.RAW)
    return {m.member_id: {tp.partition for tp in m.assignment.topic_partitions if tp.topic == raw}
            for m in stable_members(settings)}


def wait_for(settings: Settings, check: Callable[[dict[str, set[int]]], bool], timeout: float) -> dict[str, set[int]]:
    deadline = time.monotonic() + timeout
    while True:
        got = members(settings)
        if got and check(got):
            return got
        assert time.monotonic() < deadline, f"group not as expected within {timeout:.0f} s: {got}"
        time.sleep(0.5)


def test_a_spare_stays_in_the_group_past_the_poll_interval_and_takes_over(
        kafka_broker: SessionBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKER_MAX_POLL_INTERVAL", str(POLL_INTERVAL_S))
    prefix = f"t{uuid.uuid4().hex[:10]}."
    workers = [WorkerProcess(kafka_broker.bootstrap, prefix, tmp_path / name, partitions=1) for name in "ab"]
    settings = workers[0].settings
    ensure_topics(settings)
    try:
        workers[0].start()
        (alone,) = wait_for(settings, lambda m: len(m) == 1 and list(m.values()) == [{0}], 90)
        workers[1].start()
        first = wait_for(settings, lambda m: len(m) == 2 and sorted(map(len, m.values())) == [0, 1], 90)
        time.sleep(2.5 * POLL_INTERVAL_S)  # a spare that never fetches left the group after POLL_INTERVAL_S
        assert members(settings) == first, "the spare left the group"
        (spare,) = [m for m, parts in first.items() if not parts]
        workers[1 if spare == alone else 0].kill()  # the one holding the partition
        assert wait_for(settings, lambda m: len(m) == 1, 60) == {spare: {0}}  # the spare took it over
    finally:
        for w in workers:
            w.close()
