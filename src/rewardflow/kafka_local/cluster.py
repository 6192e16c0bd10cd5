"""A local KRaft cluster of N brokers on 127.0.0.1, for failover tests and trying replication.

Node i (from 1) is a :class:`~rewardflow.kafka_local.broker.LocalBroker` on client port
``port + 2(i-1)`` and controller port one above, with its data in ``<home>/kafka/data-<its port>``.
All nodes are controllers of one static quorum and share one cluster id; with three or more,
topics get three replicas and ``min.insync.replicas=2`` (see :mod:`rewardflow.kafka_local.config`),
so the cluster keeps taking acknowledged writes with one node down.

The layout is kept in ``<home>/kafka/cluster-<port>.json`` so ``down`` and ``status`` find every
node from the first port alone.

Contract: :meth:`LocalCluster.up` starts every node before waiting for any (a node answers only
once a majority of the quorum runs) and blocks until all answer, or raises like
:meth:`LocalBroker.up`, stopping the nodes it started. :meth:`down` stops every node it knows,
all at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass, replace
from pathlib import Path

from rewardflow.kafka_local.broker import BrokerInfo, LocalBroker
from rewardflow.kafka_local.config import new_cluster_id
from rewardflow.kafka_local.maven import Progress, ensure_kafka_jars
from rewardflow.kafka_local.tools import find_java


@dataclass(frozen=True)
class ClusterInfo:
    nodes: list[BrokerInfo]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def running(self) -> int:
        return sum(1 for n in self.nodes if n.running)


class LocalCluster:
    def __init__(self, home: Path, port: int, size: int, partitions: int, *, die_with_parent: bool = False,
                 data_root: Path | None = None) -> None:
        """``data_root``: where the nodes' data and the layout file go (default ``<home>/kafka``;
        ``home`` still holds the jar cache)."""
        if size < 1:
            raise ValueError("a cluster needs at least one broker")
        self.home, self.port, self.size = home.expanduser(), port, size
        root = data_root or self.home / "kafka"
        self.layout_file = root / f"cluster-{port}.json"
        known = self._known_id()
        self.cluster_id = known or new_cluster_id()
        voters = tuple((i + 1, port + 2 * i + 1) for i in range(size))
        self.brokers = [LocalBroker(self.home, port + 2 * i, port + 2 * i + 1, partitions,
                                    data_root / f"data-{port + 2 * i}" if data_root else None, node_id=i + 1,
                                    voters=voters, cluster_id=self.cluster_id, die_with_parent=die_with_parent)
                        for i in range(size)]

    @classmethod
    def find(cls, home: Path, port: int) -> LocalCluster | None:
        """The cluster whose first node listens on ``port``, if ``up`` made one there."""
        path = home.expanduser() / "kafka" / f"cluster-{port}.json"
        if not path.exists():
            return None
        doc = json.loads(path.read_text())
        return cls(home, port, int(doc["size"]), int(doc["partitions"]))

    def _known_id(self) -> str | None:
        if self.layout_file.exists():
            return str(json.loads(self.layout_file.read_text())["cluster_id"])
        return None

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def status(self) -> ClusterInfo:
        return ClusterInfo([b.status() for b in self.brokers])

    def up(self, timeout: float = 120.0, progress: Progress | None = None) -> ClusterInfo:
        """Start the nodes that do not run, then wait until every node answers."""
        java, libs = find_java(), ensure_kafka_jars(self.home, progress)
        self.layout_file.parent.mkdir(parents=True, exist_ok=True)
        self.layout_file.write_text(json.dumps({"size": self.size, "partitions": self.brokers[0].config.partitions,
                                                "cluster_id": self.cluster_id}))
        started: list[tuple[LocalBroker, int]] = []
        try:
            for b in self.brokers:
                if not b.status().running:
                    started.append((b, b.launch(java, libs)))
            for b, pid in started:
                b.wait_ready(pid, timeout)
        except BaseException:
            for b, _ in started:
                b.down()
            raise
        return ClusterInfo([replace(b.status(), started=any(b is s for s, _ in started)) for b in self.brokers])

    def down(self, timeout: float = 30.0) -> list[int]:
        """Stop every node; the PIDs stopped. Every node gets SIGTERM first: stopped one by one, the
        last ones would have lost their quorum and wait out ``timeout`` before being killed."""
        running = [pid for b in self.brokers if (pid := b.status().pid) is not None]
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for b in self.brokers:
            b.down(timeout)  # waits for its node (SIGKILL after timeout) and removes its PID file
        return running
