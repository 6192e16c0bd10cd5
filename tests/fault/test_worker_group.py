"""Several stream worker processes in one consumer group give the rewards of one uninterrupted worker.

Three workers share 12 partitions (as ``rewardflow run --workers 3`` or workers on several
machines would; the added ones get the deployment's tick key through ``REWARDFLOW_TICK_KEY``, as
workers on other hosts must, or the ticks that end the stream would be refused as forged on the
partitions they own). Mid-stream a fourth joins and one of the first three is SIGKILLed, so the group
rebalances twice while records flow: partitions move with their changelog state, and records a
killed member had processed but not committed are processed again by their new owner. The
in-process sink runs throughout. After the stream ends, ClickHouse must hold exactly what the pure
core computes over the same records (:mod:`tests.fault.verify`): every final reward and window,
nothing lost, nothing doubled, nothing late. A worker that leaves a stalled takeover (exit 75) is
started again, as ``rewardflow run`` would, and counted.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from rewardflow.kafka import topics as T
from rewardflow.kafka.provision import changelog_topic
from rewardflow.settings import Settings, tick_key
from tests.fault.pipeline import feed, release_admin, restart_stalled, wait_drained
from tests.fault.verify import check, collect
from tests.fault.workload import FAULT_SETTINGS
from tests.streams.kafka_io import LIBRDKAFKA_LOG, stable_members
from tests.streams.worker import WorkerProcess

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(420)]
SEED = 4_404_012
PARTITIONS = 12
STALL_S = 8.0


def assignment(settings: Settings) -> dict[str, set[int]]:
    """member id -> raw partitions it owns, once the group is stable (empty otherwise).

    Members own partitions of the raw topic and the state changelog only: a partition that never
    holds a record, fetched alone, makes the broker hold the fetch (and the raw partitions' next
    one) for the consumer's whole fetch wait."""
    members = stable_members(settings)
    raw = settings.topic(T.RAW)
    topics = {tp.topic for m in members for tp in m.assignment.topic_partitions}
    assert topics <= {raw, changelog_topic(settings)}, f"the workers are assigned partitions of {sorted(topics)}"
    return {m.member_id: {tp.partition for tp in m.assignment.topic_partitions if tp.topic == raw} for m in members}


def wait_group(settings: Settings, members: int, timeout: float, workers: list[WorkerProcess],
               kept_of: set[str] | None = None, kept: int = 0) -> tuple[float, set[str]]:
    """Block until ``members`` members own every raw partition, each exactly once, ``kept`` of them
    from ``kept_of`` (when given); the seconds it took and the member ids."""
    start = time.monotonic()
    while True:
        owned = assignment(settings)
        parts = sorted(p for ps in owned.values() for p in ps)
        ok = kept_of is None or len(set(owned) & kept_of) == kept
        if len(owned) == members and parts == list(range(settings.partitions)) and ok:
            return time.monotonic() - start, set(owned)
        restart_stalled(workers, [])  # (a stall here shows as a later failure to drain, if it recurs)
        dead = [w for w in workers if not w.alive and w.proc is not None and w.proc.returncode != -9]
        assert not dead, f"a worker exited:\n{dead[0].log_tail(3000)}"
        assert time.monotonic() - start < timeout, f"group not {members} stable members within {timeout:.0f}s: {owned}"
        time.sleep(0.5)


def test_three_workers_then_one_added_and_one_killed_give_the_rewards_of_one(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack, tmp_path: Path,
        logs: list[Any], record_property: Any) -> None:
    d = deployment(partitions=PARTITIONS, worker_stall_timeout_s=STALL_S)
    settings = d.settings
    workers = [d.worker]
    key = tick_key(settings).decode()  # the first worker's; workers on other hosts share it through settings

    def add(name: str) -> WorkerProcess:
        workdir = tmp_path / name
        workdir.mkdir()
        w = WorkerProcess(settings.kafka_bootstrap, settings.topic_prefix, workdir,
                          **{**FAULT_SETTINGS, "partitions": PARTITIONS, "tick_key": key, "worker_stall_timeout_s": STALL_S})
        w.argv += ["--log-level", "INFO"]  # takeovers, recoveries and stalls are logged at INFO and above
        stack.callback(lambda: (w.stop(), release_admin(w)))
        logs.append((f"{name} log ({w.log_path})", w.log_tail))
        w.start()
        workers.append(w)
        return w

    add("worker-b")
    add("worker-c")
    took, first = wait_group(settings, 3, 90, workers)
    rebalances = {"3 members": round(took, 1)}
    own = [t for t in AdminClient(settings.kafka_client_config(), logger=LIBRDKAFKA_LOG).list_topics(timeout=10).topics
           if t.startswith(settings.topic("worker"))]
    assert own == [changelog_topic(settings)], f"the workers made topics besides their state changelog: {own}"
    workload, sink, sender = feed(d, ch_db, stack, SEED)

    chunks = workload.chunks(6)
    sender.send(chunks.pop(0))
    sender.send(chunks.pop(0))
    add("worker-d")  # joins while records flow
    sender.send(chunks.pop(0))
    workers[1].kill()  # worker-b, mid-stream: nothing of its uncommitted work is flushed
    sender.send(chunks.pop(0))
    took, _ = wait_group(settings, 3, 120, workers, kept_of=first, kept=2)  # worker-b gone, worker-d in
    rebalances["after join and kill"] = round(took, 1)
    for chunk in chunks:
        sender.send(chunk)
    sender.finish()

    restarted: list[str] = []
    running = workers[2:] + workers[:1]

    def healthy() -> None:
        sink.check()
        restart_stalled(running, restarted)
        for w in running:
            assert w.alive, f"a worker exited:\n{w.log_tail(3000)}"

    drained_s = wait_drained(settings, 240, healthy)
    sink.stop()
    results = collect(ch_db.client)
    summary = check(results, workload, sender, late_ok=False)
    record_property("fault_summary", {**workload.summary, **summary, "rebalances_s": rebalances,
                                      "restarted_after_a_stall": restarted, "drained_s": round(drained_s, 1)})
    print("rebalances", rebalances, "restarted after a stall", restarted, "result", summary)
