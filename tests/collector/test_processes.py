"""``rewardflow collect --processes 2``: two processes on one port, keys through the chDB owner's endpoint;
SIGTERM stops both cleanly. With chDB and no owner it refuses in one line."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rewardflow.kafka_local.ports import free_ports
from tests.collector.http import post_events
from tests.conftest_kafka import SessionBroker
from tests.factories import ev

EXE = shutil.which("rewardflow", path=str(Path(sys.executable).parent)) or "rewardflow"


def _env(tmp: Path, bootstrap: str) -> dict[str, str]:
    web, collect = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    env.update({"REWARDFLOW_HOME": str(tmp / "home"), "REWARDFLOW_CLICKHOUSE_DSN": f"chdb://{tmp / 'chdb'}",
                "REWARDFLOW_KAFKA_BOOTSTRAP": bootstrap, "REWARDFLOW_TOPIC_PREFIX": f"procs{web}.",
                "REWARDFLOW_WEB_PORT": str(web), "REWARDFLOW_COLLECT_PORT": str(collect), "REWARDFLOW_PARTITIONS": "1"})
    return env


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)


def test_without_an_owner_several_processes_are_refused(tmp_path: Path) -> None:
    env = _env(tmp_path, "127.0.0.1:9")
    proc = subprocess.run([EXE, "collect", "--processes", "2"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "needs the process that owns it" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.kafka
def test_two_processes_serve_one_port_and_stop_on_sigterm(kafka_broker: SessionBroker, tmp_path: Path) -> None:
    env = _env(tmp_path, kafka_broker.bootstrap)
    (tmp_path / "home").mkdir()
    logs = [tmp_path / "owner.log", tmp_path / "collect.log"]
    owner = subprocess.Popen([EXE, "run", "--no-worker", "--status-interval", "0", "--monitor-interval", "0"], env=env,
                             cwd=tmp_path, stdout=logs[0].open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    collect = None
    try:
        _wait(f"http://127.0.0.1:{env['REWARDFLOW_WEB_PORT']}/health", owner, logs[0])
        key = subprocess.run([EXE, "keys", "create", "--org", "org"], env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout.strip()
        collect = subprocess.Popen([EXE, "collect", "--processes", "2"], env=env, cwd=tmp_path,
                                   stdout=logs[1].open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{env['REWARDFLOW_COLLECT_PORT']}"
        _wait(f"{url}/healthz", collect, logs[1])
        statuses = [post_events(url, key, [ev("FollowUp", f"r{i}", event_id=f"e{i}")])[0] for i in range(20)]
        assert statuses == [202] * 20
        collect.send_signal(signal.SIGTERM)
        assert collect.wait(timeout=60) == 0, logs[1].read_text()[-3000:]
    finally:
        for proc in (collect, owner):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
