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
