"""Render the broker's two config files: KRaft ``server.properties`` and log4j2.

Pure functions of a :class:`BrokerConfig`; nothing here touches the disk or
the network, so the rendering is unit-tested in milliseconds.

A broker is one combined broker+controller (KRaft) bound to 127.0.0.1 only: alone (``node.id=1``,
its own quorum), or one node of a local cluster whose ``voters`` (node id, controller port) form
a static controller quorum. A cluster of three or more replicates every topic three times with
``min.insync.replicas=2``, internal topics included, so it keeps taking acknowledged writes with one
node down. Besides these it uses values that keep a 2-core development box fast: a short initial
rebalance delay (300 ms), few offsets and share-state partitions, small segments and short retention.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"


@dataclass(frozen=True)
class BrokerConfig:
    """What differs between two local brokers: ports, partitions, directories."""

    port: int
    controller_port: int
    partitions: int
    log_dirs: Path
    """Kafka's data (``log.dirs``), formatted by the storage tool."""
    node_id: int = 1
    voters: tuple[tuple[int, int], ...] = ()
    """A cluster's controller quorum: (node id, controller port) of every node; empty when alone."""

    @property
    def replication(self) -> tuple[int, int]:
        """(replication factor, min.insync.replicas) for topics: (3, 2) in a cluster of three or more."""
        return (3, 2) if len(self.voters) >= 3 else (1, 1)

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients, e.g. ``127.0.0.1:19092``."""
        return f"{HOST}:{self.port}"


def new_cluster_id() -> str:
    """A random KRaft cluster id in Kafka's format (22 url-safe base64 chars).

    Like Kafka's ``Uuid.randomUuid`` it never starts with ``-``, which the
    storage tool's argument parser would mistake for an option.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def server_properties(cfg: BrokerConfig) -> dict[str, str]:
    """The broker's settings as an ordered mapping (rendered by :func:`render_properties`)."""
    rf, isr = (str(n) for n in cfg.replication)
    quorum = ({"controller.quorum.voters": ",".join(f"{n}@{HOST}:{p}" for n, p in cfg.voters)} if cfg.voters
              else {"controller.quorum.bootstrap.servers": f"{HOST}:{cfg.controller_port}"})
    return {
        # KRaft: this process is a broker and a controller (the only one, or one of the voters)
        "process.roles": "broker,controller",
        "node.id": str(cfg.node_id),
        **quorum,
        "listeners": f"PLAINTEXT://{HOST}:{cfg.port},CONTROLLER://{HOST}:{cfg.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{cfg.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(cfg.log_dirs),
        # topics
        "num.partitions": str(cfg.partitions),
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        # internal topics: few partitions (faster start on 2 cores)
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "share.coordinator.state.topic.num.partitions": "4",
        # the workers of one `rewardflow run` start within ~0.2 s: they form the group together
        # instead of the second moving partitions from the first (whose uncommitted work is redone)
        "group.initial.rebalance.delay.ms": "300",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        # a development broker keeps a day of data, at most ~1 GiB per partition
        "log.retention.hours": "24",
        "log.retention.bytes": str(1 << 30),
        "log.segment.bytes": str(64 << 20),
        "log.retention.check.interval.ms": "60000",
    }


def render_properties(props: dict[str, str]) -> str:
    """``key=value`` lines; values are paths and numbers, so no escaping is needed."""
    return "".join(f"{key}={value}\n" for key, value in props.items())


def render_log4j2_properties(log_file: Path, level: str = "INFO") -> str:
    """A log4j2 ``.properties`` config: everything to ``log_file``, rolled at 50 MB x 3.

    A ``.properties`` file (unlike Kafka's own ``log4j2.yaml``) needs no
    jackson-yaml support in log4j2. Chatty loggers are raised to WARN.
    """
    return f"""\
status = warn
name = rewardflow-kafka

appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.filePattern = {log_file}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3

rootLogger.level = {level}
rootLogger.appenderRef.file.ref = FILE

logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
"""
