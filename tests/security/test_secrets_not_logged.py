"""A configured Kafka SASL password and a ClickHouse DSN password never reach output or logs.

Checked where they could leak: ``--help`` and status output of the CLI,
one-line CLI errors (unreachable Kafka or ClickHouse), ``Settings``' repr,
str, JSON dump and validation errors, the sink's "ClickHouse unavailable"
warning, and the stream worker's startup logging (in-process at DEBUG, and the
real ``python -m rewardflow_streams.main`` process).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rewardflow.clickhouse.dsn import parse_dsn
from rewardflow.settings import Settings, SettingsError, load_settings

KAFKA_SECRET = f"kafka-pw-{uuid.uuid4().hex}"
CH_SECRET = f"ch-pw-{uuid.uuid4().hex}"
SECRETS = (KAFKA_SECRET, CH_SECRET)


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def secret_env(home: Path, **extra: str) -> dict[str, str]:
    """Every credential configured, Kafka and ClickHouse both unreachable on loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    env.update({
        "REWARDFLOW_HOME": str(home),
        "REWARDFLOW_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed_port()}",
        "REWARDFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "REWARDFLOW_KAFKA_SASL_MECHANISM": "PLAIN",
        "REWARDFLOW_KAFKA_SASL_USERNAME": "rf-user",
        "REWARDFLOW_KAFKA_SASL_PASSWORD": KAFKA_SECRET,
        "REWARDFLOW_CLICKHOUSE_DSN": f"http://rf-user:{CH_SECRET}@127.0.0.1:{closed_port()}/rf",
        **extra,
    })
    return env


def assert_clean(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a password appears in {where}:\n{text[-2000:]}"


def rewardflow(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("rewardflow", path=str(Path(sys.executable).parent)) or "rewardflow"
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("args", [
    ["--help"], ["run", "--help"], ["sql", "--help"], ["kafka", "--help"], ["kafka", "status"],
    ["db", "--help"], ["emit", "--help"], ["export", "--help"],
])
def test_help_and_status_output_never_show_a_password(args: list[str], tmp_path: Path) -> None:
    proc = rewardflow(args, secret_env(tmp_path))
    assert proc.returncode in (0, 1), proc.stderr  # kafka status: 1 = not running
    assert_clean(proc.stdout + proc.stderr, f"`rewardflow {' '.join(args)}`")


@pytest.mark.parametrize("args, says", [
    (["sql", "SELECT 1"], "cannot connect to ClickHouse"),
    (["db", "migrate"], "rf-user:***@127.0.0.1"),  # the DSN is shown, masked
    (["run", "--status-interval", "0"], "does not answer"),  # Kafka unreachable: one line, exit 2
])
def test_cli_errors_name_the_target_but_not_the_password(args: list[str], says: str, tmp_path: Path) -> None:
    proc = rewardflow(args, secret_env(tmp_path))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert_clean(proc.stdout + proc.stderr, f"`rewardflow {' '.join(args)}`")


@pytest.mark.kafka
def test_run_startup_with_clickhouse_unreachable_never_shows_the_password(kafka_broker: Any, tmp_path: Path) -> None:
    env = secret_env(tmp_path, REWARDFLOW_KAFKA_BOOTSTRAP=kafka_broker.bootstrap,
                     REWARDFLOW_KAFKA_SECURITY_PROTOCOL="PLAINTEXT", REWARDFLOW_TOPIC_PREFIX=f"sec{uuid.uuid4().hex[:8]}.")
    del env["REWARDFLOW_KAFKA_SASL_PASSWORD"]
    proc = rewardflow(["run", "--no-worker", "--status-interval", "0"], env, timeout=120)
    assert proc.returncode != 0
    assert_clean(proc.stdout + proc.stderr, "`rewardflow run` with ClickHouse unreachable")


def test_settings_repr_str_dump_and_errors_never_show_a_password(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key, value in secret_env(tmp_path).items():
        if key.startswith("REWARDFLOW_"):
            monkeypatch.setenv(key, value)
    s = load_settings()
    assert s.kafka_sasl_password is not None and s.kafka_sasl_password.get_secret_value() == KAFKA_SECRET
    for text in (repr(s), str(s), s.model_dump_json(), str(s.model_dump()), repr(parse_dsn(s.dsn)), str(parse_dsn(s.dsn))):
        assert_clean(text, "settings / DSN rendering")
    assert "rf-user:***@127.0.0.1" in str(parse_dsn(s.dsn))
    # an unsafe combination fails; neither load_settings nor a direct Settings() quotes the input
    monkeypatch.setenv("REWARDFLOW_KAFKA_BOOTSTRAP", "kafka.example.com:9092")
    with pytest.raises(SettingsError) as loaded:
        load_settings()
    assert_clean(str(loaded.value), "a SettingsError")
    with pytest.raises(ValidationError) as direct:
        Settings()
    assert_clean(str(direct.value), "a pydantic ValidationError of Settings()")


@pytest.mark.kafka
@pytest.mark.clickhouse
def test_sink_warns_clickhouse_unavailable_with_the_dsn_masked(
        kafka_broker: Any, unique_topic: Any, unique_group: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import Producer

    from rewardflow.sink.route import RewardSink

    caplog.set_level(logging.DEBUG)
    topic = unique_topic("rewards")
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    p.produce(topic, b'[{"reward_id": "r1"}]')
    assert p.flush(10) == 0
    settings = Settings(home=tmp_path, kafka_bootstrap=kafka_broker.bootstrap, sink_batch_seconds=0.1,
                        clickhouse_dsn=f"http://rf-user:{CH_SECRET}@127.0.0.1:{closed_port()}/rf")
    sink = RewardSink(settings, topics={topic: "rewards"}, group_id=unique_group)
    try:
        deadline = time.monotonic() + 30
        while sink.metrics.retries < 1 and time.monotonic() < deadline:
            sink.poll_once(0.2)
    finally:
        sink.close(timeout=1)
    assert sink.metrics.retries >= 1
    assert "ClickHouse unavailable" in caplog.text and "rf-user:***@127.0.0.1" in caplog.text, caplog.text
    out, err = capfd.readouterr()
    assert_clean(caplog.text + out + err, "the sink's log")


def test_worker_startup_logging_never_shows_the_sasl_password(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    from rewardflow_streams.app import JoinWorker

    caplog.set_level(logging.DEBUG)
    env = secret_env(tmp_path)
    settings = Settings(**{k[len("REWARDFLOW_"):].lower(): v for k, v in env.items()
                           if k.startswith("REWARDFLOW_") and k != "REWARDFLOW_HOME"}, home=tmp_path)
    join = JoinWorker(settings, web=False)
    conf = join.app.conf
    assert conf.broker_credentials is not None
    rendered = f"{conf.broker_credentials!r} {conf.broker_credentials!s} {conf.broker!r}"
    out, err = capfd.readouterr()
    assert_clean(caplog.text + out + err + rendered, "the worker's configuration and startup logging")
    # the real worker process, for a few seconds against an unreachable SASL broker
    proc = subprocess.Popen([sys.executable, "-m", "rewardflow_streams.main"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate(timeout=10)
    assert output.strip(), "the worker logged nothing"
    assert_clean(output, "the worker process's output")
