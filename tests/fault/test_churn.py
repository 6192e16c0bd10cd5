"""Membership churn while traffic flows: workers join, leave cleanly and are SIGKILLed, one change
after another, on 12 partitions.

After every change a chunk of the workload is sent, and every raw partition must be processed
again (the group has committed every record sent so far) within :data:`BOUND_S`: a takeover that
stalls in changelog recovery fails the test instead of waiting for a later rebalance by chance.
At the end ClickHouse must hold exactly what the pure core computes (one uninterrupted worker).
A worker that leaves a stalled recovery (exit 75) is started again, as ``rewardflow run`` would,
and counted. The time from each change to caught-up is reported (p50 / p99 / max).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from rewardflow.kafka import topics as T
from rewardflow.settings import Settings, tick_key
from tests.fault.pipeline import feed, release_admin, restart_stalled, wait_drained
from tests.fault.verify import check, collect
from tests.fault.workload import FAULT_SETTINGS
from tests.streams.kafka_io import LIBRDKAFKA_LOG
from tests.streams.worker import WorkerProcess

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(600)]
SEED = 6_060_606
PARTITIONS = 12
BOUND_S = 30.0
STALL_S = 8.0  # a stalled takeover is resumed, or left and restarted, well within BOUND_S
CHANGES = ("join", "join", "kill", "join", "leave", "join", "kill", "join", "leave", "kill")  # 1 to 3 members


def caught_up_after(settings: Settings, started: float, bound: float, supervise: Any) -> float:
    """Seconds from ``started`` until the group has committed every raw record that exists now
    (``supervise()`` is called while waiting)."""
    raw = settings.topic(T.RAW)
    parts = [TopicPartition(raw, p) for p in range(settings.partitions)]
    c = Consumer({**settings.kafka_client_config(), "group.id": settings.topic("worker")}, logger=LIBRDKAFKA_LOG)
    try:
        ends = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        while True:
            committed = [tp.offset for tp in c.committed(parts, timeout=10)]
            if all(e == 0 or got >= e for got, e in zip(committed, ends, strict=True)):
                return time.monotonic() - started
            behind = {p: e - max(got, 0) for p, (got, e) in enumerate(zip(committed, ends, strict=True)) if got < e}
            assert time.monotonic() - started < bound, f"partitions not processed again within {bound:.0f} s: {behind}"
            supervise()
            time.sleep(0.25)
    finally:
        c.close()


def test_workers_joining_leaving_and_killed_while_traffic_flows(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack, tmp_path: Path,
        logs: list[Any], record_property: Any) -> None:
    d = deployment(partitions=PARTITIONS, worker_stall_timeout_s=STALL_S)
    settings = d.settings
    key = tick_key(settings).decode()
    live: list[WorkerProcess] = [d.worker]
    everyone = list(live)
    workload, sink, sender = feed(d, ch_db, stack, SEED)
    chunks = workload.chunks(len(CHANGES) + 1)
    sender.send(chunks[0])

    def join(name: str) -> None:
        workdir = tmp_path / name
        workdir.mkdir()
        w = WorkerProcess(settings.kafka_bootstrap, settings.topic_prefix, workdir,
                          **{**FAULT_SETTINGS, "partitions": PARTITIONS, "tick_key": key,
                             "worker_stall_timeout_s": STALL_S})
        w.argv += ["--log-level", "INFO"]  # the recovery's progress and timing are logged at INFO
        stack.callback(lambda: (w.stop(), release_admin(w)))
        logs.append((f"{name} log", w.log_tail))
        w.start()
        live.append(w)
        everyone.append(w)

    restarted: list[str] = []

    def supervise() -> None:
        restart_stalled(live, restarted)

    took: list[tuple[str, float]] = []
    for i, change in enumerate(CHANGES):
        started = time.monotonic()
        if change == "join":
            join(f"worker-{i}")
        else:
            gone = live.pop(0)  # the oldest member: it holds the most state
            gone.kill() if change == "kill" else gone.stop()
        sender.send(chunks[i + 1])  # traffic flows through the rebalance
        took.append((change, round(caught_up_after(settings, started, BOUND_S, supervise), 1)))
        sink.check()
    sender.finish()

    def healthy() -> None:
        sink.check()
        supervise()
        for w in live:
            assert w.alive, f"a worker exited:\n{w.log_tail(3000)}"

    drained_s = wait_drained(settings, 180, healthy)
    sink.stop()
    summary = check(collect(ch_db.client), workload, sender, late_ok=False)
    seconds = sorted(s for _, s in took)
    figures = {"p50_s": statistics.median(seconds), "p99_s": seconds[min(len(seconds) - 1, int(0.99 * len(seconds)))],
               "max_s": seconds[-1], "changes": took}
    figures["restarted_after_a_stall"] = restarted
    figures["stalls_resumed"] = sum(w.log_tail(10**8).count("resumed their fetching") for w in everyone)
    record_property("fault_summary", {**summary, "caught_up": figures, "drained_s": round(drained_s, 1)})
    print("caught up after each change", figures, "result", summary)
