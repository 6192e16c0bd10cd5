"""A takeover restores its state from a changelog the broker has compacted, and the rewards stay exact.

Faust's tables restore from compacted changelog topics; upstream reports recoveries that hang or
restore wrong state once segments were cleaned. Here the changelog is made to compact within
seconds (segments roll every second, any dirty ratio is cleanable), so the broker's log cleaner
drops superseded session states, leaving holes in the offsets. Then a second worker joins (it
restores half the partitions) and the first is SIGKILLed (the second restores the rest). Every
partition must be processed again within the bound, and ClickHouse must hold exactly what the pure
core computes.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from rewardflow.kafka.provision import changelog_topic
from rewardflow.settings import Settings, tick_key
from tests.fault.pipeline import caught_up_after, feed, release_admin, wait_drained
from tests.fault.verify import check, collect
from tests.fault.workload import FAULT_SETTINGS
from tests.streams.kafka_io import LIBRDKAFKA_LOG
from tests.streams.worker import WorkerProcess

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(420)]
SEED = 8_282_828
PARTITIONS = 4
BOUND_S = 30.0
STALL_S = 8.0
COMPACT_SOON = {"segment.ms": "1000", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}


def compact_soon(settings: Settings, topic: str) -> None:
    admin = AdminClient(settings.kafka_client_config(), logger=LIBRDKAFKA_LOG)
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in COMPACT_SOON.items()])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=10)


def holes(settings: Settings, topic: str) -> dict[int, int]:
    """Per partition of ``topic``: offsets between its log start and end that hold no record."""
    c = Consumer({**settings.kafka_client_config(), "group.id": f"holes-{time.monotonic_ns()}",
                  "enable.auto.commit": False}, logger=LIBRDKAFKA_LOG)
    try:
        out = {}
        for p in range(settings.partitions):
            tp = TopicPartition(topic, p)
            low, high = c.get_watermark_offsets(tp, timeout=10)
            if high <= low:
                out[p] = 0
                continue
            c.assign([TopicPartition(topic, p, low)])
            n, last = 0, low - 1
            while last < high - 1:
                batch = c.consume(1000, timeout=5)
                if not batch:
                    break
                n += sum(1 for m in batch if m.error() is None)
                last = max([last, *(m.offset() for m in batch if m.error() is None)])
            out[p] = (high - low) - n
        return out
    finally:
        c.close()


def test_a_takeover_restores_a_compacted_changelog_exactly(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack, tmp_path: Path,
        logs: list[Any], record_property: Any) -> None:
    d = deployment(partitions=PARTITIONS, worker_stall_timeout_s=STALL_S)
    settings, first = d.settings, d.worker
    changelog = changelog_topic(settings)
    compact_soon(settings, changelog)
    workload, sink, sender = feed(d, ch_db, stack, SEED)
    chunks = workload.chunks(6)
    for chunk in chunks[:4]:  # a second apart: each chunk's state writes land in a segment of their own
        sender.send(chunk)
        first.wait_caught_up(60)
        time.sleep(1.2)
    sender.send(chunks[4][:1])  # one more write rolls the last of those segments, so it can be cleaned
    first.wait_caught_up(60)
    deadline = time.monotonic() + 120
    while not any((found := holes(settings, changelog)).values()):
        assert time.monotonic() < deadline, "the broker never compacted the changelog: the test proves nothing"
        sink.check()
        time.sleep(2)

    second = WorkerProcess(settings.kafka_bootstrap, settings.topic_prefix, tmp_path / "second",
                           **{**FAULT_SETTINGS, "partitions": PARTITIONS, "tick_key": tick_key(settings).decode(),
                              "worker_stall_timeout_s": STALL_S})
    second.argv += ["--log-level", "INFO"]  # the recoveries are logged at INFO
    stack.callback(lambda: (second.stop(), release_admin(second)))
    logs.append(("second worker log", second.log_tail))
    started = time.monotonic()
    second.start()
    sender.send(chunks[4][1:])
    joined_s = caught_up_after(settings, started, BOUND_S, 2, sink.check)
    started = time.monotonic()
    first.kill()
    sender.send(chunks[5])
    taken_over_s = caught_up_after(settings, started, BOUND_S, 1, sink.check)
    sender.finish()

    def healthy() -> None:
        sink.check()
        assert second.alive, f"the second worker exited:\n{second.log_tail(3000)}"

    wait_drained(settings, 120, healthy)
    sink.stop()
    summary = check(collect(ch_db.client), workload, sender, late_ok=False)
    recoveries = second.log_tail(10**8).count("changelog recovery finished")
    assert recoveries >= 2, "the second worker did not restore twice (at its join and at the takeover)"
    record_property("fault_summary", {**summary, "holes": found, "joined_s": round(joined_s, 1),
                                      "taken_over_s": round(taken_over_s, 1)})
    print("changelog holes", found, "caught up after the join", round(joined_s, 1), "s and the kill",
          round(taken_over_s, 1), "s; result", summary)
