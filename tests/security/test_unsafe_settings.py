"""Unsafe settings fail at start, with a message naming the variable and the fix.

* A SASL password over ``SASL_PLAINTEXT`` to any non-loopback broker in the
  bootstrap list (clear text on the network) is refused; to loopback it is allowed.
* ``SASL_*`` without mechanism, user and password is refused.
* The CLI turns these into one ``error:`` line and exit code 2, never a traceback.
* What is configured is what every client uses: ``SASL_SSL`` makes the SDK,
  the sink and the Faust worker speak TLS (the worker used to get SASL_PLAINTEXT).
* Input limits stay within their bounds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rewardflow.settings import SettingsError, load_settings

SASL = {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN",
        "kafka_sasl_username": "rf", "kafka_sasl_password": "pw-not-for-the-wire"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in [k for k in __import__("os").environ if k.startswith("REWARDFLOW_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("REWARDFLOW_HOME", str(tmp_path))


@pytest.mark.parametrize("bootstrap", [
    "kafka.example.com:9092", "10.0.0.5:9092", "127.0.0.1:9092,10.0.0.5:9092", "localhost:9092, broker-2:9092",
])
def test_sasl_plaintext_password_to_a_remote_broker_is_refused(bootstrap: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(kafka_bootstrap=bootstrap, **SASL)
    assert "SASL_SSL" in str(err.value) and "REWARDFLOW_KAFKA_SECURITY_PROTOCOL" in str(err.value)
    assert SASL["kafka_sasl_password"] not in str(err.value)


@pytest.mark.parametrize("bootstrap", ["127.0.0.1:9092", "localhost:9092", "[::1]:9092", "127.0.0.1:1,localhost:2"])
def test_sasl_plaintext_to_loopback_is_allowed(bootstrap: str) -> None:
    assert load_settings(kafka_bootstrap=bootstrap, **SASL).kafka_security_protocol == "SASL_PLAINTEXT"


def test_sasl_ssl_to_a_remote_broker_is_allowed() -> None:
    s = load_settings(kafka_bootstrap="kafka.example.com:9093", **{**SASL, "kafka_security_protocol": "SASL_SSL"})
    assert s.kafka_client_config()["security.protocol"] == "SASL_SSL"


@pytest.mark.parametrize("missing", ["kafka_sasl_mechanism", "kafka_sasl_username", "kafka_sasl_password"])
def test_sasl_without_credentials_is_refused(missing: str) -> None:
    with pytest.raises(SettingsError, match="REWARDFLOW_KAFKA_SASL_PASSWORD"):
        load_settings(**{k: v for k, v in SASL.items() if k != missing})


@pytest.mark.parametrize("field, value", [("max_record_bytes", 100), ("max_record_bytes", 10**9),
                                          ("max_batch_events", 0), ("max_batch_events", 10**6)])
def test_input_limits_stay_within_bounds(field: str, value: int) -> None:
    with pytest.raises(SettingsError, match=f"REWARDFLOW_{field.upper()}"):
        load_settings(**{field: value})


def test_the_cli_refuses_an_unsafe_config_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("REWARDFLOW_")}
    env.update({f"REWARDFLOW_{k.upper()}": v for k, v in SASL.items()})
    env.update({"REWARDFLOW_KAFKA_BOOTSTRAP": "kafka.example.com:9092", "REWARDFLOW_HOME": str(tmp_path)})
    exe = shutil.which("rewardflow", path=str(Path(sys.executable).parent)) or "rewardflow"
    for args in (["kafka", "status"], ["run"]):
        proc = subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert proc.stderr.startswith("error:") and "SASL_SSL" in proc.stderr and "Traceback" not in proc.stderr
        assert SASL["kafka_sasl_password"] not in proc.stdout + proc.stderr


@pytest.mark.parametrize("protocol, tls", [("SASL_SSL", True), ("SASL_PLAINTEXT", False)])
def test_the_worker_speaks_the_configured_protocol(protocol: str, tls: bool, tmp_path: Path) -> None:
    from faust.types.auth import AuthProtocol

    from rewardflow_streams.app import JoinWorker

    s = load_settings(kafka_bootstrap="127.0.0.1:9093", **{**SASL, "kafka_security_protocol": protocol})
    creds: Any = JoinWorker(s, web=False).app.conf.broker_credentials
    assert creds.protocol == AuthProtocol(protocol)
    assert (creds.ssl_context is not None) == tls


@pytest.mark.parametrize("dsn, says", [("garbage", "unsupported ClickHouse DSN scheme"),
                                       ("http://u@127.0.0.1:9/db?password=hunter2", "user:password@ part"),
                                       ("http://u:hunter2@[::1:9/db", "malformed"),
                                       ("chdb://relative/path", "absolute path")])
def test_a_bad_dsn_is_one_error_line_naming_the_variable(dsn: str, says: str, tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("REWARDFLOW_")}
    env.update({"REWARDFLOW_HOME": str(tmp_path), "REWARDFLOW_CLICKHOUSE_DSN": dsn})
    exe = shutil.which("rewardflow", path=str(Path(sys.executable).parent)) or "rewardflow"
    proc = subprocess.run([exe, "sql", "SELECT 1"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: invalid configuration: REWARDFLOW_CLICKHOUSE_DSN") and says in proc.stderr
    assert "hunter2" not in proc.stderr and "Traceback" not in proc.stderr


def test_an_unexpected_error_is_one_line_and_the_traceback_is_opt_in(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from rewardflow.cli import main as cli

    def boom() -> None:
        raise TimeoutError("SASL handshake did not complete\nwithin 30 s")

    monkeypatch.setattr(cli, "app", boom)
    monkeypatch.delenv("REWARDFLOW_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err == (
        "error: TimeoutError: SASL handshake did not complete within 30 s (REWARDFLOW_DEBUG=1 shows where)\n")
    monkeypatch.setenv("REWARDFLOW_DEBUG", "1")
    with pytest.raises(TimeoutError):
        cli.main()


@pytest.mark.parametrize("args, taken", [(["run", "--no-sink"], 1), (["run", "--no-worker"], 0)])
def test_a_second_deployment_on_a_taken_port_is_one_error_line(args: list[str], taken: int, tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1] - taken  # the endpoint serves on WEB_PORT, the worker's metrics on the next
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("REWARDFLOW_")}
        env.update({"REWARDFLOW_HOME": str(tmp_path), "REWARDFLOW_WEB_PORT": str(port),
                    "REWARDFLOW_CLICKHOUSE_DSN": f"chdb://{tmp_path / 'ch'}", "REWARDFLOW_KAFKA_BOOTSTRAP": "127.0.0.1:9"})
        exe = shutil.which("rewardflow", path=str(Path(sys.executable).parent)) or "rewardflow"
        proc = subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: port ") and "is taken" in proc.stderr and "REWARDFLOW_WEB_PORT" in proc.stderr
    assert "Traceback" not in proc.stderr
