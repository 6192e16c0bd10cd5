"""A takeover that stalls on purpose: the worker notices, leaves the group, and its next start
restores and processes everything exactly.

The worker processes the first part of the workload, stops, and starts again with a fault hook:
``RF_FAULT_STALL_RECOVERY`` never resumes its changelog partitions, so its recovery waits for
events that never come (as Faust's recoveries sometimes do after a rebalance), or
``RF_FAULT_STALL_RAW`` never resumes its raw partitions, so the records sent meanwhile are never
processed; or ``RF_FAULT_NO_CHANGELOG`` shows it its assignment without the changelog partitions
(as from a group leader whose metadata lacked the changelog topic), and it must process none of
those raw partitions' records from empty state. With ``REWARDFLOW_WORKER_STALL_TIMEOUT_S=5`` it must
stop itself within seconds (at once without the changelog) with exit code 75 (a supervisor such as ``rewardflow run`` starts it again: tests/test_children.py).
Started again (a hook fires once), it restores the state and finishes the stream (started again
as ``rewardflow run`` would, should that start stall of itself); ClickHouse must then hold exactly what
the pure core computes.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from rewardflow.kafka import topics as T
from rewardflow_streams.recovery import EXIT_RECOVERY_STALLED
from tests.fault.pipeline import feed, restart_stalled, wait_drained
from tests.fault.verify import check, collect

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(300)]
SEED = 5_050_505
STALL_S = 5.0


def _first_half_then_stop(d: Any, ch_db: Any, stack: contextlib.ExitStack) -> tuple[Any, Any, Any, list[Any]]:
    """The workload's first half processed, then a clean stop: the join state is in the changelog,
    so the next start restores it."""
    workload, sink, sender = feed(d, ch_db, stack, SEED)
    chunks = workload.chunks(2)
    sender.send(chunks[0])
    d.worker.wait_caught_up(60)
    d.worker.stop()
    return workload, sink, sender, chunks


def _raw_committed(settings: Any) -> list[int]:
    """The worker group's committed offset of each raw partition (negative: none)."""
    c = Consumer({**settings.kafka_client_config(), "group.id": settings.topic("worker"), "enable.auto.commit": False})
    try:
        tps = [TopicPartition(settings.topic(T.RAW), p) for p in range(settings.partitions)]
        return [tp.offset for tp in c.committed(tps, timeout=10)]
    finally:
        c.close()


def _drain(d: Any, sink: Any, restarted: list[str] | None = None) -> float:
    """Seconds until everything sent is stored, the sink and the worker alive throughout. With
    ``restarted``, a worker that leaves a stall (exit 75) is started again, as ``rewardflow run``
    does, and noted there."""
    def healthy() -> None:
        sink.check()
        if restarted is not None:
            restart_stalled([d.worker], restarted)
        assert d.worker.alive, f"the worker exited:\n{d.worker.log_tail(3000)}"

    return wait_drained(d.settings, 180, healthy)


@pytest.mark.parametrize(("hook", "says"), [("RF_FAULT_STALL_RECOVERY", "changelog recovery stalled"),
                                            ("RF_FAULT_STALL_RAW", "have records to process"),
                                            ("RF_FAULT_NO_CHANGELOG", "were assigned without their changelog")])
def test_a_stalled_takeover_is_left_within_its_timeout_and_nothing_is_lost(
        hook: str, says: str, deployment: Any, ch_db: Any, stack: contextlib.ExitStack, record_property: Any) -> None:
    d = deployment(worker_stall_timeout_s=STALL_S)
    workload, sink, sender, chunks = _first_half_then_stop(d, ch_db, stack)
    marker = d.workdir / "stall.marker"
    before = _raw_committed(d.settings)
    d.worker.env[hook] = str(marker)
    started = time.monotonic()
    d.worker.start()
    sender.send(chunks[1])  # records to process while it is stalled
    code = d.worker.wait_exit(STALL_S + 90)
    left_after = time.monotonic() - started
    log = d.worker.log_tail(50_000)
    assert marker.exists(), log[-3000:]
    assert code == EXIT_RECOVERY_STALLED, log[-3000:]
    assert says in log and "exiting 75" in log
    if hook != "RF_FAULT_NO_CHANGELOG":  # the stall lines say what the Kafka client holds as well
        assert re.search(r"; client: buffered (none|from \d+|spent), paused (yes|no), position", log), log[-3000:]
    if hook == "RF_FAULT_STALL_RAW":  # and where the outputs of its last batch stand
        assert re.search(r"outputs: \d+ records unconfirmed, last batch (none sent|acked|waiting)", log), log[-3000:]
    assert _raw_committed(d.settings) == before  # it processed nothing: no record of the second half committed
    d.worker.argv += ["--log-level", "INFO"]  # the recovery's timing is logged at INFO
    d.worker.restart(60)  # the hook fired once: this start restores normally
    sender.finish()
    # Should the fresh start stall of itself (not through a hook), its watch leaves the group and
    # the worker is started again, as `rewardflow run` starts it. The rewards must be exact either way.
    restarts: list[str] = []
    drained_s = _drain(d, sink, restarts)
    log = d.worker.log_tail(200_000)
    last = log.rsplit("===== worker start #", 1)[-1]
    assert "changelog recovery finished in" in last and "exiting 75" not in last, last[-3000:]
    assert len(restarts) <= 2, log[-5000:]
    sink.stop()
    summary = check(collect(ch_db.client), workload, sender, late_ok=False)
    record_property("fault_summary", {**summary, "stalled_worker_exited_after_s": round(left_after, 1),
                                      "drained_s": round(drained_s, 1), "restarts_after_the_hook": len(restarts)})
    print("stalled worker exited after", round(left_after, 1), "s; result", summary)


def test_records_faust_drops_as_read_are_sought_back_in_place(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack, record_property: Any) -> None:
    """Two hooks move Faust's read offset past every record to come right after a seek, as records
    of the previous generation delivered after it do: of the changelog partitions after the
    recovery's seek (the recovery receives nothing), then of the raw partitions after the
    rebalance's seek (their records are fetched and dropped as already read, and nothing later
    shows the hole). The watch must seek both back in place (no exit, no new member) and every
    reward must be exact."""
    d = deployment(worker_stall_timeout_s=STALL_S)
    workload, sink, sender, chunks = _first_half_then_stop(d, ch_db, stack)
    markers = {hook: d.workdir / f"{hook}.marker" for hook in ("RF_FAULT_STALE_CHANGELOG_READ", "RF_FAULT_STALE_READ")}
    d.worker.env.update({hook: str(marker) for hook, marker in markers.items()})
    d.worker.argv += ["--log-level", "INFO"]
    d.worker.start()
    sender.send(chunks[1])
    sender.finish()
    drained_s = _drain(d, sink)
    log = d.worker.log_tail(200_000).rsplit("worker start #2", 1)[-1]
    assert all(m.exists() for m in markers.values()), log[-3000:]
    reseek = log.index("sought back to offset")  # the changelog's, during the recovery
    resume = log.index("resumed their fetching from offset")  # the raw partitions', after it
    assert reseek < resume and log.count("read offset 1099511627776") >= 2, log[-3000:]
    assert "exiting 75" not in log
    sink.stop()
    summary = check(collect(ch_db.client), workload, sender, late_ok=False)
    record_property("fault_summary", {**summary, "drained_s": round(drained_s, 1)})
    print("sought back in place; drained after", round(drained_s, 1), "s; result", summary)
