"""The broker's operating-system process: PID file, identity check, termination.

A broker is only ever addressed by the PID this tooling wrote, never by name.
Before signalling a PID we check (via ``/proc/<pid>/cmdline``) that it still
is ``kafka.Kafka`` running *our* ``server.properties``, so a stale PID file
whose number was reused by an unrelated process is ignored, never killed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

BROKER_MAIN_CLASS = "kafka.Kafka"


def read_pid(pid_file: Path) -> int | None:
    """The PID stored in ``pid_file``, or None if it is missing or malformed."""
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def write_pid(pid_file: Path, pid: int) -> None:
    """Write ``pid`` atomically (temp file + rename), so readers never see half a number."""
    tmp = pid_file.with_name(pid_file.name + ".tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(pid_file)


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie. Reaps it if it is our exited child."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    except ChildProcessError:
        pass  # not our child: its parent (or init) reaps it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def is_broker_process(pid: int, properties_file: Path) -> bool:
    """True if ``pid`` is alive and runs ``kafka.Kafka <properties_file>``.

    Where ``/proc`` is unavailable the identity cannot be checked and mere
    liveness is trusted.
    """
    if not pid_alive(pid):
        return False
    if not Path("/proc/self").exists():
        return True  # no procfs (not Linux): trust liveness
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False  # exited meanwhile
    decoded = [arg.decode(errors="replace") for arg in args]
    return BROKER_MAIN_CLASS in decoded and str(properties_file) in decoded


def wait_gone(pid: int, timeout: float) -> bool:
    """Poll until ``pid`` has exited; True if it did within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def terminate(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM ``pid``; after ``timeout`` seconds SIGKILL it. Blocks until it is gone.

    Kafka's SIGTERM handler performs a controlled shutdown (about 2 s for
    one idle node). Returns quietly if the process is already gone.
    """
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if wait_gone(pid, timeout):
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    wait_gone(pid, 10.0)
