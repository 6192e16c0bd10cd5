"""``rewardflow kafka lag`` against the real broker: what the workers and the sink have not committed yet."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from rewardflow.cli.main import app
from rewardflow.core.ticks import TICK_HEADERS
from rewardflow.kafka import topics as T
from rewardflow.kafka.provision import ensure_topics
from rewardflow.settings import Settings

pytestmark = pytest.mark.kafka


def test_lag_reports_the_records_no_worker_committed_and_exits_by_whether_the_pipeline_drained(
        kafka_broker: Any, tmp_path: Path) -> None:
    prefix = f"p{uuid.uuid4().hex[:8]}."
    settings = Settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=prefix, home=tmp_path, partitions=2)
    ensure_topics(settings)
    env = {"REWARDFLOW_KAFKA_BOOTSTRAP": kafka_broker.bootstrap, "REWARDFLOW_TOPIC_PREFIX": prefix,
           "REWARDFLOW_HOME": str(tmp_path), "REWARDFLOW_PARTITIONS": "2"}
    runner = CliRunner()
    res = runner.invoke(app, ["kafka", "lag", "--timeout", "30"], env=env)
    assert res.exit_code == 0, res.output
    assert "workers  0 records behind" in res.stdout and "sink     0 records behind" in res.stdout
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for p in range(2):  # the ticks workers write to idle partitions are not records to drain
        producer.produce(settings.topic(T.RAW), b"{}", partition=p, headers=TICK_HEADERS)
    assert producer.flush(30) == 0
    res = runner.invoke(app, ["kafka", "lag", "--timeout", "30"], env=env)
    assert res.exit_code == 0 and "workers  0 records behind" in res.stdout, res.output
    for i in range(3):
        producer.produce(settings.topic(T.RAW), b"{}", f"s{i}".encode())
    producer.produce(settings.topic(T.RAW), b"{}", partition=0, headers=TICK_HEADERS)
    assert producer.flush(30) == 0
    res = runner.invoke(app, ["kafka", "lag", "--wait", "1", "--timeout", "30"], env=env)
    assert res.exit_code == 1 and "workers  3 records behind" in res.stdout, res.output


def test_lag_exits_2_when_kafka_does_not_answer(tmp_path: Path) -> None:
    env = {"REWARDFLOW_KAFKA_BOOTSTRAP": "127.0.0.1:9", "REWARDFLOW_HOME": str(tmp_path)}
    res = CliRunner().invoke(app, ["kafka", "lag", "--timeout", "0.5"], env=env)
    assert res.exit_code == 2 and "did not answer" in res.output
