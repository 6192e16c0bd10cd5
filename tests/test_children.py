"""Supervised worker processes: ``rewardflow run --workers N`` and :class:`WorkerSupervisor`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from rewardflow.children import WorkerSupervisor, default_worker_count, settings_env, worker_metrics_ports
from rewardflow.kafka_local.ports import free_ports, port_is_free
from rewardflow.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(x) for x in out.split()]


def test_a_worker_that_keeps_exiting_is_restarted_then_given_up(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, web_port=free_ports(1)[0])
    sup = WorkerSupervisor(settings, 2, max_restarts=3, restart_window_s=60,
                           argv=[sys.executable, "-c", "import os, sys; sys.exit(int(os.environ['REWARDFLOW_WORKER_METRICS_PORT']) % 2 + 3)"])
    sup.start()
    try:
        deadline = time.monotonic() + 30
        message = None
        while message is None and time.monotonic() < deadline:
            message = sup.check()
            time.sleep(0.1)
        assert message is not None, "the supervisor never gave up"
        assert "4 worker exits within 60 s" in message and "not restarted again" in message
        assert "exited with code 3" in message or "exited with code 4" in message
    finally:
        assert sup.stop(timeout=5) in (3, 4)


def test_settings_reach_the_workers_with_their_own_metrics_port(tmp_path: Path) -> None:
    out = tmp_path / "env"
    settings = Settings(home=tmp_path, web_port=free_ports(1)[0], partitions=5)
    script = (f"import os; open({str(out)!r} + os.environ['REWARDFLOW_WORKER_METRICS_PORT'], 'w')"
              ".write(os.environ['REWARDFLOW_PARTITIONS'])")
    sup = WorkerSupervisor(settings, 2, argv=[sys.executable, "-c", script]).start()
    for p in sup.procs:
        assert p is not None and p.wait(10) == 0
    assert sup.stop() == 0
    for port in worker_metrics_ports(settings, 2):
        assert (tmp_path / f"env{port}").read_text() == "5"
    assert settings_env(settings)["REWARDFLOW_PARTITIONS"] == "5"


def test_worker_metrics_ports_follow_the_web_port_and_skip_the_edge(tmp_path: Path) -> None:
    """With the default ports, `rewardflow run --collect` and two workers fit: worker 1 does not take the edge's port."""
    settings = Settings(home=tmp_path)
    assert (settings.web_port, settings.collect_port) == (16066, 16068)
    assert worker_metrics_ports(settings, 3) == [16067, 16069, 16070]
    assert worker_metrics_ports(Settings(home=tmp_path, web_port=20000), 2) == [20001, 20002]
    assert worker_metrics_ports(Settings(home=tmp_path, web_port=65533, collect_port=65534), 1) == [65535]
    with pytest.raises(ValueError, match="lower it"):
        worker_metrics_ports(Settings(home=tmp_path, web_port=65533, collect_port=65534), 2)


def test_run_starts_a_worker_per_core_bounded_by_the_partitions(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    assert default_worker_count(Settings(home=tmp_path, partitions=1)) == 1
    assert default_worker_count(Settings(home=tmp_path, partitions=1024)) == cores
    assert default_worker_count(Settings(home=tmp_path, partitions=2)) == min(2, cores)


@pytest.mark.kafka
@pytest.mark.clickhouse
@pytest.mark.timeout(300)
def test_run_with_two_workers_restarts_a_killed_one_and_stops_cleanly(kafka_broker: Any, tmp_path: Path) -> None:
    port = next(p for p in iter(lambda: free_ports(1)[0], None) if all(port_is_free(p + i) for i in range(1, 3)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    env.update(REWARDFLOW_HOME=str(tmp_path), REWARDFLOW_KAFKA_BOOTSTRAP=kafka_broker.bootstrap,
               REWARDFLOW_TOPIC_PREFIX=f"t{uuid.uuid4().hex[:8]}.", REWARDFLOW_WEB_PORT=str(port),
               REWARDFLOW_CLICKHOUSE_DSN=f"chdb://{tmp_path / 'chdb'}", REWARDFLOW_PARTITIONS="4")
    cmd = [sys.executable, "-c", "from rewardflow.cli.main import main; main()", "run", "--workers", "2",
           "--status-interval", "0", "--monitor-interval", "0", "--log-level", "WARNING"]
    log = (tmp_path / "run.log").open("wb")
    run = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        metrics = [f"http://127.0.0.1:{port + 1 + i}/metrics" for i in range(2)]
        _wait(lambda: all(_answers(u) for u in metrics), 120, run, tmp_path)
        first = _children(run.pid)
        workers = [pid for pid in first if "rewardflow_streams.main" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(workers) == 2, first
        os.kill(workers[0], signal.SIGKILL)
        _wait(lambda: len([p for p in _children(run.pid) if p not in workers]) >= 1, 30, run, tmp_path)
        _wait(lambda: all(_answers(u) for u in metrics), 120, run, tmp_path)
        run.send_signal(signal.SIGTERM)
        assert run.wait(90) == 0, (tmp_path / "run.log").read_text()[-3000:]
        assert not [p for p in workers[1:] if Path(f"/proc/{p}").exists()]
        assert "restarting it" in (tmp_path / "run.log").read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
        log.close()


def _wait(cond: Any, timeout: float, run: subprocess.Popen[bytes], tmp_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert run.poll() is None, f"rewardflow run exited {run.returncode}:\n" + (tmp_path / "run.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "timed out:\n" + (tmp_path / "run.log").read_text()[-3000:]
        time.sleep(0.5)
