from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rewardflow.kafka_local.ports import free_ports, port_is_free
from rewardflow.kafka_local.process import is_broker_process, pid_alive, read_pid, terminate, write_pid


def test_pid_file_roundtrip(tmp_path: Path) -> None:
    pid_file = tmp_path / "broker.pid"
    assert read_pid(pid_file) is None
    write_pid(pid_file, 4242)
    assert read_pid(pid_file) == 4242
    pid_file.write_text("garbage")
    assert read_pid(pid_file) is None


def test_exited_child_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while pid_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child.pid)


def test_unrelated_process_is_not_taken_for_a_broker(tmp_path: Path) -> None:
    assert pid_alive(os.getpid())
    assert not is_broker_process(os.getpid(), tmp_path / "server.properties")


def test_terminate_escalates_to_sigkill() -> None:
    ignores_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", ignores_term], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    started = time.monotonic()
    terminate(child.pid, timeout=0.5)
    assert not pid_alive(child.pid)
    assert time.monotonic() - started < 5
    child.poll()
    child.stdout.close()


def test_free_ports_are_distinct_and_free() -> None:
    a, b = free_ports(2)
    assert a != b
    assert port_is_free(a) and port_is_free(b)
