"""``rewardflow run``: what it starts, and what it leaves behind when it cannot start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest


def _processes_with(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.kafka
def test_a_clickhouse_it_cannot_prepare_is_one_error_line_and_no_worker_is_left(kafka_broker: Any,
                                                                                tmp_path: Path) -> None:
    """The workers start while the sink prepares ClickHouse; when that fails, they are stopped too."""
    home = tmp_path / f"home-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    env.update({"REWARDFLOW_HOME": str(home), "REWARDFLOW_KAFKA_BOOTSTRAP": kafka_broker.bootstrap,
                "REWARDFLOW_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:10]}",
                "REWARDFLOW_CLICKHOUSE_DSN": "http://default:@127.0.0.1:9/default"})  # nothing listens on port 9
    exe = shutil.which("rewardflow", path=str(Path(sys.executable).parent)) or "rewardflow"
    proc = subprocess.run([exe, "run", "--status-interval", "0", "--monitor-interval", "0"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: cannot prepare ClickHouse" in proc.stderr, proc.stderr[-3000:]
    assert "worker 0 started" in proc.stderr  # the worker did start meanwhile...
    assert _processes_with(f"REWARDFLOW_HOME={home}") == []  # ...and is gone with the command


def test_more_workers_than_partitions_are_told_to_idle_as_spares(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:  # the read endpoint's port is taken: run stops before it starts anything
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
        env.update({"REWARDFLOW_HOME": str(tmp_path / "home"), "REWARDFLOW_PARTITIONS": "2",
                    "REWARDFLOW_WEB_PORT": str(taken.getsockname()[1])})
        exe = shutil.which("rewardflow", path=str(Path(sys.executable).parent)) or "rewardflow"
        proc = subprocess.run([exe, "run", "--workers", "5"], env=env, capture_output=True, text=True, timeout=120,
                              check=False)
    assert proc.returncode != 0
    assert "--workers 5 for 2 partitions (REWARDFLOW_PARTITIONS): 3 of them will hold no partition" in proc.stderr


def test_the_status_line_shows_what_was_not_scored_beside_what_was_written() -> None:
    from rewardflow.cli.run import status_fields

    sink = {"rows_written": {"events": 15_530, "late_events": 15_518, "rewards": 0}, "retries": 0}
    assert status_fields(2, sink, None) == {"workers_alive": 2, "rows_written": 31_048, "rewards": 0, "late": 15_518,
                                            "dead_letters": 0, "excluded": 0, "sink_retries": 0, "lag_raw": "unknown"}
    assert status_fields(None, None, 7) == {"lag_raw": 7}
