"""A broker started with ``die_with_parent`` goes away when its starter is SIGKILLed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rewardflow.kafka_local.process import read_pid

pytestmark = pytest.mark.kafka

STARTER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rewardflow.kafka_local.broker import LocalBroker
    from rewardflow.kafka_local.ports import free_ports
    from rewardflow.settings import load_settings
    port, cport = free_ports(2)
    b = LocalBroker(load_settings().home, port, cport, partitions=1, data_dir=Path(sys.argv[1]),
                    die_with_parent=sys.argv[2] == "1")
    b.up(timeout=90)
    print("up", flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.mark.skipif(shutil.which("setpriv") is None or not sys.platform.startswith("linux"),
                    reason="needs Linux and util-linux setpriv")
def test_broker_dies_when_its_starter_is_killed(tmp_path: Path) -> None:
    data = tmp_path / "kafka"
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(data), "1"], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        assert starter.stdout is not None and starter.stdout.readline().strip() == "up"
        pid = read_pid(data / "broker.pid")
        assert pid is not None and _alive(pid)
        starter.send_signal(signal.SIGKILL)
        starter.wait(10)
        deadline = time.monotonic() + 60
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid), "the broker outlived the process that started it"
    finally:
        starter.kill()
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
