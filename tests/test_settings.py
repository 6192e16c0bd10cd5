"""Settings: the local broker follows a loopback bootstrap; conflicting ports fail fast. Pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from rewardflow.settings import Settings, SettingsError, load_settings


@pytest.mark.parametrize(
    ("bootstrap", "port", "controller"),
    [("127.0.0.1:19092", 19092, 19093), ("localhost:29092", 29092, 29093), ("[::1]:39092", 39092, 39093),
     ("kafka.internal:9092", 19092, 19093), ("127.0.0.1:9092,kafka.internal:9094", 19092, 19093),
     ("127.0.0.1:29500,127.0.0.1:29502,127.0.0.1:29504", 29500, 29501)],  # (as `kafka up --brokers 3` prints it)
)
def test_the_local_broker_listens_where_a_loopback_bootstrap_points(bootstrap: str, port: int, controller: int) -> None:
    s = Settings(kafka_bootstrap=bootstrap)
    assert (s.local_broker_port, s.local_broker_controller_port) == (port, controller)


def test_explicit_local_ports_win() -> None:
    s = Settings(kafka_bootstrap="127.0.0.1:29092", local_kafka_port=31000, local_kafka_controller_port=31005)
    assert (s.local_broker_port, s.local_broker_controller_port) == (31000, 31005)


def test_equal_local_ports_fail_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWARDFLOW_KAFKA_BOOTSTRAP", "127.0.0.1:29092")
    monkeypatch.setenv("REWARDFLOW_LOCAL_KAFKA_CONTROLLER_PORT", "29092")
    with pytest.raises(SettingsError, match="client and controller ports must differ"):
        load_settings()


def test_librdkafka_logs_through_python_logging_never_raw_to_the_terminal() -> None:
    import re
    import subprocess
    import sys

    script = (
        "import time\n"
        "from confluent_kafka import Producer\n"
        "from rewardflow.settings import load_settings\n"
        "p = Producer(load_settings(kafka_bootstrap='127.0.0.1:9').kafka_client_config())\n"
        "p.produce('t', b'x'); end = time.time() + 1.5\n"
        "while time.time() < end: p.poll(0.1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Connect to ipv4#127.0.0.1:9 failed" in proc.stderr  # a real error still reaches the log
    assert not re.search(r"^%\d\|", proc.stderr, re.M), proc.stderr[:500]


def test_worker_and_sink_take_the_group_session_timeout() -> None:
    from rewardflow.sink.config import consumer_config
    from rewardflow_streams.app import JoinWorker

    s = Settings(group_session_timeout_s=12.0)
    conf = JoinWorker(s, web=False).app.conf
    assert (conf.broker_session_timeout, conf.broker_heartbeat_interval) == (12.0, 1.0)  # heartbeats every second: a rebalance is noticed within one
    assert consumer_config(s, "g")["session.timeout.ms"] == 12_000


def test_the_worker_fetches_as_many_bytes_a_partition_as_set() -> None:
    from rewardflow_streams.app import JoinWorker

    assert JoinWorker(Settings(), web=False).app.conf.consumer_max_fetch_size == 4 * 1024 * 1024
    assert JoinWorker(Settings(worker_fetch_bytes=1 << 20), web=False).app.conf.consumer_max_fetch_size == 1 << 20
    with pytest.raises(ValueError, match="worker_fetch_bytes"):
        Settings(worker_fetch_bytes=1024)


def test_min_insync_above_the_replication_factor_fails_fast() -> None:
    with pytest.raises(ValueError, match="REWARDFLOW_TOPIC_MIN_INSYNC_REPLICAS .2. cannot exceed "
                                         "REWARDFLOW_TOPIC_REPLICATION_FACTOR .1."):
        Settings(topic_replication_factor=1, topic_min_insync_replicas=2)
    assert Settings(topic_min_insync_replicas=2).topic_replication_factor is None  # (the cluster's default)
    ok = Settings(topic_replication_factor=3, topic_min_insync_replicas=2, table_standby_replicas=1)
    assert (ok.topic_replication_factor, ok.topic_min_insync_replicas, ok.table_standby_replicas) == (3, 2, 1)


def test_the_worker_keeps_its_files_under_the_home_not_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rewardflow_streams.app import JoinWorker

    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    s = Settings(home=home, topic_prefix="t1.")
    conf = JoinWorker(s, web=False).app.conf
    assert Path(conf.datadir) == home / "worker-data" / "t1.worker"
    assert Path(conf.datadir).parent.is_dir() and list(cwd.iterdir()) == []


def test_a_config_file_takes_settings_by_name_or_by_variable_and_refuses_an_unknown_key(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REWARDFLOW_WEB_PORT", raising=False)
    monkeypatch.delenv("REWARDFLOW_GRACE_MS", raising=False)
    cfg = tmp_path / "rewardflow.toml"
    monkeypatch.setenv("REWARDFLOW_CONFIG_FILE", str(cfg))
    cfg.write_text("REWARDFLOW_WEB_PORT = 23001\ngrace_ms = 61000\n")
    got = load_settings()
    assert (got.web_port, got.grace_ms) == (23001, 61000)
    monkeypatch.setenv("REWARDFLOW_WEB_PORT", "23002")  # a variable wins over the file
    assert load_settings().web_port == 23002
    cfg.write_text("colect_port = 23003\n")
    with pytest.raises(SettingsError, match=r"unknown setting\(s\) 'colect_port' \(did you mean collect_port\?\)"):
        load_settings()


def test_a_variable_that_is_no_setting_is_told_once(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("REWARDFLOW_CONFIG_FILE", raising=False)
    monkeypatch.setenv("REWARDFLOW_COLECT_PORT_T", "23003")
    monkeypatch.setenv("REWARDFLOW_SCHEMA_DIR", str(Path(__file__).parents[1] / "schemas"))  # read, not a setting
    load_settings()
    load_settings()
    told = [r.getMessage() for r in caplog.records if "REWARDFLOW_" in r.getMessage()]
    assert told == ["REWARDFLOW_COLECT_PORT_T is not a rewardflow setting and is ignored "
                    "(did you mean REWARDFLOW_COLLECT_PORT?)"]
