from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rewardflow.kafka_local import ports as ports_module
from rewardflow.kafka_local.config import HOST
from rewardflow.kafka_local.ports import DEFAULT_EPHEMERAL, ephemeral_range, free_ports, port_is_free
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


def test_free_ports_are_a_free_block_below_the_ephemeral_range() -> None:
    ports = free_ports(6)
    assert ports == list(range(ports[0], ports[0] + 6))
    assert all(port_is_free(p) for p in ports)
    assert ports[-1] < ephemeral_range()[0]


def test_free_ports_refuse_a_block_with_a_port_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    ports = free_ports(3)
    monkeypatch.setattr(ports_module, "PICK_FROM", ports[0])  # the one block left to pick is ``ports``
    monkeypatch.setattr(ports_module, "ephemeral_range", lambda: (ports[0] + 4, 60999))
    assert free_ports(3) == ports
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((HOST, ports[1]))
        held.listen()
        with pytest.raises(OSError, match="no 3 consecutive free ports"):
            free_ports(3)


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(f) == (40000, 50000)
    assert ephemeral_range(tmp_path / "missing") == DEFAULT_EPHEMERAL
