"""``rewardflow simulate`` against a real broker: what lands on the topic reconciles with the truth."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer
from typer.testing import CliRunner

from rewardflow.cli.main import app
from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import PartitionProcessor
from rewardflow.events.wire import FORMAT_HEADER
from rewardflow.kafka_local.admin import create_topics, delete_topics
from rewardflow.kafka_local.errors import KafkaLocalError
from rewardflow.sim import ab_config, ground_truth
from rewardflow.sim.replay import FINAL_WATERMARK, default_specs

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _consume(bootstrap: str, topic: str, idle_s: float = 4.0, timeout: float = 60.0) -> list[Any]:
    """Every record of ``topic``: read until nothing arrives for ``idle_s`` seconds."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"sim-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline, last = time.monotonic() + timeout, time.monotonic()
    try:
        while time.monotonic() < deadline and time.monotonic() - last < idle_s:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(msg)
                last = time.monotonic()
    finally:
        consumer.close()
    return out


CORRECTION_MS = 300_000  # planted late signals come 2-15 min after their deadline: some correct, some are late


def _seed_with_every_fault() -> int:
    """The first seed whose small noisy run plants every fault, late signals within the correction window
    and past it included (deterministic)."""
    for seed in range(200):
        t = ground_truth(ab_config(sessions=25, turns_per_session=4, seed=seed, noise=True, start_ms=1_800_000_000_000,
                                   correction_ms=CORRECTION_MS))
        if t.late and t.corrected and t.malformed and t.duplicates and t.orphan_turns:
            return seed
    raise AssertionError("no seed plants every fault")


@pytest.mark.parametrize("wire", ["avro", "json"])
def test_simulated_traffic_reconciles_through_kafka(kafka_broker: object, tmp_path: Path, wire: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap = kafka_broker.bootstrap  # type: ignore[attr-defined]
    prefix = f"test.sim.{uuid.uuid4().hex[:10]}."
    topic = prefix + "events.raw"
    create_topics(bootstrap, {topic: 2})
    monkeypatch.setenv("REWARDFLOW_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("REWARDFLOW_HOME", str(tmp_path / "home"))  # (no pipeline database: nothing to warn of)
    monkeypatch.delenv("REWARDFLOW_CLICKHOUSE_DSN", raising=False)
    monkeypatch.setenv("REWARDFLOW_CORRECTION_WINDOW_MS", str(CORRECTION_MS))
    truth_path = tmp_path / "truth.json"
    seed = _seed_with_every_fault()
    try:
        result = CliRunner().invoke(app, [
            "simulate", "--sessions", "25", "--turns-per-session", "4", "--seed", str(seed), "--noise",
            "--start-ms", "1800000000000", "--bootstrap", bootstrap, "--format", wire, "--truth-out", str(truth_path),
        ])
        assert result.exit_code == 0, result.output
        truth = orjson.loads(truth_path.read_bytes())
        records = _consume(bootstrap, topic)
    finally:
        with contextlib.suppress(KafkaLocalError):
            delete_topics(bootstrap, [topic], timeout=10)
    cfg = JoinConfig(correction_ms=CORRECTION_MS)
    procs = {p: PartitionProcessor(cfg, default_specs(), DictStore(), topic, p) for p in (0, 1)}
    out = Outputs()
    for msg in sorted(records, key=lambda m: (m.partition(), m.offset())):
        out.extend(procs[msg.partition()].process(msg.value(), msg.headers(), msg.offset(), 0))
    for p, proc in procs.items():
        out.extend(proc.process(orjson.dumps({"wm": FINAL_WATERMARK}), [(FORMAT_HEADER, b"tick")], 10**9, 0))
    excluded = Counter(e["reason"] for e in out.excluded)
    assert len(out.dead) == truth["malformed"] > 0
    assert len(out.valid) == truth["valid_events"]
    assert len(out.late) == truth["late"] > 0
    assert len({r["sample_id"] for r in out.rewards if r["revision"]}) == truth["corrected"] > 0
    assert excluded["duplicate"] == truth["duplicates"]
    assert excluded["orphan"] == truth["orphan_turns"]
    final = Counter(r["checkpoint_id"] for r in out.rewards if not r["provisional"] and not r["revision"]
                    and r["spec_version"] == "v1")
    assert final == truth["turns_per_checkpoint"]
