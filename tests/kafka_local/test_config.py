from __future__ import annotations

import re
from pathlib import Path

from rewardflow.kafka_local.config import (
    BrokerConfig,
    new_cluster_id,
    render_log4j2_properties,
    render_properties,
    server_properties,
)

CFG = BrokerConfig(port=29092, controller_port=29093, partitions=3, log_dirs=Path("/data/kraft"))


def parse(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_single_node_kraft_minimum_is_present() -> None:
    props = parse(render_properties(server_properties(CFG)))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:29093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    assert props["log.dirs"] == "/data/kraft"
    assert props["num.partitions"] == "3"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "300"  # workers started together form the group once


def test_binds_loopback_only() -> None:
    props = server_properties(CFG)
    endpoints = props["listeners"].split(",") + props["advertised.listeners"].split(",")
    assert all("//127.0.0.1:" in e for e in endpoints)
    assert "0.0.0.0" not in render_properties(props)


def test_bootstrap() -> None:
    assert CFG.bootstrap == "127.0.0.1:29092"


def test_cluster_id_has_kafka_uuid_shape() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{22}", i) and not i.startswith("-") for i in ids)


def test_log4j2_properties_write_to_the_log_file() -> None:
    text = render_log4j2_properties(Path("/x/logs/server.log"), level="WARN")
    props = {k.strip(): v.strip() for k, v in (ln.split("=", 1) for ln in text.splitlines() if "=" in ln)}
    assert props["appender.file.fileName"] == "/x/logs/server.log"
    assert props["rootLogger.level"] == "WARN"
    assert props["rootLogger.appenderRef.file.ref"] == props["appender.file.name"]


def test_a_cluster_node_joins_a_static_quorum_and_replicates_three_times() -> None:
    voters = ((1, 29093), (2, 29095), (3, 29097))
    node = BrokerConfig(port=29094, controller_port=29095, partitions=3, log_dirs=Path("/d2"), node_id=2, voters=voters)
    props = parse(render_properties(server_properties(node)))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29093,2@127.0.0.1:29095,3@127.0.0.1:29097"
    assert "controller.quorum.bootstrap.servers" not in props
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29094,CONTROLLER://127.0.0.1:29095"
    for key in ("default.replication.factor", "offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    pair = BrokerConfig(port=1, controller_port=2, partitions=1, log_dirs=Path("/x"), voters=((1, 2), (2, 4)))
    assert pair.replication == (1, 1)  # two nodes: a majority needs both, so no replication is promised
