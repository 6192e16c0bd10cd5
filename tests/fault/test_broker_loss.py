"""A broker of a three-broker cluster SIGKILLed mid-stream: nothing acknowledged is lost; then the
same cluster through ``rewardflow kafka status / up / down``.

The cluster is the project's own (``rewardflow kafka up --brokers 3``: KRaft, every node a
controller, replication 3, ``min.insync.replicas`` 2). rewardflow's topics get the same by default
(its replication factor unset: the cluster's ``default.replication.factor``), with
``REWARDFLOW_TOPIC_MIN_INSYNC_REPLICAS=2``. While the workload
flows, the broker that coordinates the workers' group is killed; the group's coordinator and its
partitions' leadership move to the others, which hold every acknowledged record, and producers,
the worker and the sink fail over (the worker asks the new coordinator for the group's offsets). Afterwards ClickHouse must hold exactly what the pure core computes
(:mod:`tests.fault.verify`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from rewardflow.kafka import topics as T
from rewardflow.kafka_local.cluster import LocalCluster
from rewardflow.kafka_local.ports import free_ports
from tests.fault.pipeline import feed, wait_drained
from tests.fault.verify import check, collect
from tests.streams.kafka_io import LIBRDKAFKA_LOG

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(480)]
SEED = 3_303_003


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Started as ``rewardflow kafka up --brokers 3`` would (its own home), and ended with the tests."""
    base = free_ports(6)[0]  # node i listens on base + 2i, its controller on base + 2i + 1
    c = LocalCluster(tmp_path_factory.mktemp("cluster-home"), base, 3, partitions=4, die_with_parent=True)
    c.up(timeout=180)
    try:
        yield c
    finally:
        c.down()


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    md = AdminClient({"bootstrap.servers": bootstrap}, logger=LIBRDKAFKA_LOG).list_topics(topic, timeout=10)
    return {p: m.leader for p, m in md.topics[topic].partitions.items()}


def coordinator(bootstrap: str, group: str) -> int:
    """The broker id of ``group``'s coordinator."""
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=LIBRDKAFKA_LOG)
    return int(admin.describe_consumer_groups([group])[group].result(timeout=10).coordinator.id)


def test_one_broker_of_three_killed_mid_stream_loses_and_duplicates_nothing(
        cluster: LocalCluster, deployment: Any, ch_db: Any, stack: contextlib.ExitStack, record_property: Any) -> None:
    d = deployment(cluster.bootstrap, topic_min_insync_replicas=2)
    settings = d.settings
    raw = settings.topic(T.RAW)
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}, logger=LIBRDKAFKA_LOG).list_topics(timeout=10)
    ours = [t for t in md.topics if t.startswith(settings.topic_prefix)]
    assert len(ours) >= 9 and all(len(p.replicas) == 3 for t in ours for p in md.topics[t].partitions.values())
    workload, sink, sender = feed(d, ch_db, stack, SEED)

    chunks = workload.chunks(6)
    for chunk in chunks[:3]:
        sender.send(chunk)
    victim_id = coordinator(cluster.bootstrap, settings.topic("worker"))  # the group moves, and partitions with it
    victim = cluster.brokers[victim_id - 1]
    pid = victim.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # no clean shutdown: leadership moves only after the controllers notice
    killed_at = time.monotonic()
    for chunk in chunks[3:]:
        sender.send(chunk)
    sender.finish()
    moved = leaders(cluster.bootstrap, raw)
    assert victim_id not in moved.values(), moved

    def healthy() -> None:
        sink.check()
        assert d.worker.alive, f"the worker exited:\n{d.worker.log_tail(3000)}"

    drained_s = wait_drained(settings, 300, healthy)
    sink.stop()
    results = collect(ch_db.client)
    summary = check(results, workload, sender, late_ok=False)
    record_property("fault_summary", {**workload.summary, **summary, "killed_broker": victim_id,
                                      "drained_after_kill_s": round(time.monotonic() - killed_at, 1),
                                      "drained_s": round(drained_s, 1)})
    print("killed broker", victim_id, "result", summary)


def test_the_cli_finds_the_cluster_restarts_the_lost_broker_and_stops_it(cluster: LocalCluster) -> None:
    """Runs after the broker loss above: one node is down until ``up`` starts it again."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    env["REWARDFLOW_HOME"] = str(cluster.home)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", "from rewardflow.cli.main import main; main()", "kafka", *args,
                               "--port", str(cluster.port)], env=env, capture_output=True, text=True, timeout=300,
                              check=False)

    status = cli("status")
    assert status.returncode == 1 and "2 of 3 brokers running" in status.stdout, status.stdout + status.stderr
    up = cli("up", "--brokers", "3")
    assert up.returncode == 0 and "cluster of 3 is up (1 started" in up.stdout, up.stdout + up.stderr
    assert f"REWARDFLOW_KAFKA_BOOTSTRAP={cluster.bootstrap}" in up.stdout
    assert sorted(AdminClient({"bootstrap.servers": cluster.bootstrap}, logger=LIBRDKAFKA_LOG)
                  .list_topics(timeout=10).brokers) == [1, 2, 3]
    assert cli("status").returncode == 0
    down = cli("down")
    assert down.returncode == 0 and "3 of 3 brokers were running" in down.stdout, down.stdout + down.stderr
    assert "0 of 3 brokers running" in cli("status").stdout
