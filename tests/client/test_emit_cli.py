"""``rewardflow emit`` on the sample file: valid lines reach the topic, the invalid one is reported."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from rewardflow.cli.main import app
from tests.client.test_produce_roundtrip import consume_events

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-events.jsonl"
runner = CliRunner()


def sample_lines() -> list[bytes]:
    return [line for line in SAMPLE.read_bytes().splitlines() if line.strip()]


def test_sample_file_is_realistic() -> None:
    events = [orjson.loads(line) for line in sample_lines()]
    kinds = {e.get("event_type") for e in events}
    assert kinds == {"InferenceServed", "AgentEdit", "ToolCall", "PersistenceCheck", "UserAction", "FollowUp", "ClarifyingQuestion"}
    assert {e["horizon_s"] for e in events if e.get("event_type") == "PersistenceCheck"} == {30, 120, 300, 600, 900}
    assert "broken" in {e.get("status") for e in events} and len({e["session_id"] for e in events}) >= 3


@pytest.mark.kafka
@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_emit_sample_file(fmt: str, kafka_broker: Any, unique_topic: Callable[..., str], unique_group: str) -> None:
    topic = unique_topic(f"cli-emit-{fmt}")
    result = runner.invoke(app, ["emit", str(SAMPLE), "--format", fmt, "--topic", topic, "--bootstrap", kafka_broker.bootstrap])
    valid = len(sample_lines()) - 1
    assert result.exit_code == 0, result.output
    assert f"│ sent     │ {valid}" in result.output and "│ rejected │ 1" in result.output and "│ failed   │ 0" in result.output
    assert "rejected line 43: producer.version: Field required" in result.output
    back = consume_events(kafka_broker.bootstrap, topic, unique_group, valid, timeout=20)
    assert len(back) == valid and "bad-line-example" not in {e["event_id"] for e in back}


def test_an_unreachable_broker_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lines = tmp_path / "few.jsonl"
    lines.write_bytes(b"\n".join(sample_lines()[:5]) + b"\n")
    result = runner.invoke(app, ["emit", str(lines), "--bootstrap", f"127.0.0.1:{port}", "--timeout", "1"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"error: Kafka at 127.0.0.1:{port} does not answer; start it (`rewardflow kafka up`)"


@pytest.mark.kafka
@pytest.mark.timeout(60)
def test_strict_exits_1_on_a_rejected_line(tmp_path: Path, kafka_broker: Any, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic("cli-emit-strict")
    lines = tmp_path / "few.jsonl"
    lines.write_bytes(b"\n".join(sample_lines()[:5]) + b"\nnot json\n")
    args = ["emit", str(lines), "--topic", topic, "--bootstrap", kafka_broker.bootstrap]
    lenient = runner.invoke(app, args)
    assert lenient.exit_code == 0, lenient.output
    assert "rejected line 6: <line>: not JSON" in lenient.output and "│ sent     │ 5" in lenient.output
    assert runner.invoke(app, [*args, "--strict"]).exit_code == 1


def test_missing_file_is_a_usage_error() -> None:
    result = runner.invoke(app, ["emit", "/nonexistent/events.jsonl"])
    assert result.exit_code == 2


@pytest.mark.kafka
@pytest.mark.clickhouse
@pytest.mark.timeout(120)
def test_a_file_older_than_the_pipelines_events_is_warned_of(kafka_broker: Any, unique_topic: Callable[..., str],
                                                            ch_db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from rewardflow.clickhouse.tables import EVENTS
    from tests.clickhouse.rows import event_row

    monkeypatch.setenv("REWARDFLOW_CLICKHOUSE_DSN", ch_db.dsn.secret)
    first = min(orjson.loads(line)["ts"] for line in sample_lines())
    row = event_row(0, ts=first + 48 * 3_600_000)
    ch_db.client.insert("events", [[row[n] for n in EVENTS.record_columns]],
                        column_names=list(EVENTS.record_columns))
    result = runner.invoke(app, ["emit", str(SAMPLE), "--topic", unique_topic("cli-emit-late"),
                                 "--bootstrap", kafka_broker.bootstrap])
    assert result.exit_code == 0, result.output
    assert "48.0 h after the file's earliest event" in " ".join(result.stderr.split()), result.stderr
