"""Who owns a chDB directory? rewardflow's own owner lock, answered without touching the engine.

chDB allows one process per data directory, and the installed chdb writes no
lock or status file of its own: a second process that opens the engine fails
with ``Error initializing EmbeddedServer`` at best. So the process that opens
the engine first takes an exclusive ``flock`` on ``<path>/rewardflow-owner.lock``
(:func:`claim_engine`, with its PID written in the file) and keeps it until it
exits, as chDB keeps the engine. Every other process asks :func:`probe_engine`
first and reads through the owner's endpoint instead.

Contract: neither function blocks. :func:`probe_engine` never opens the engine
and never takes or drops a lock anyone else holds (it takes and drops a shared
``flock`` of its own on a fresh descriptor). :func:`claim_engine` raises
:class:`~.errors.EngineBusyError` when another process holds the lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from rewardflow.clickhouse.errors import EngineBusyError

LOCK_FILE = "rewardflow-owner.lock"
_held: dict[Path, int] = {}  # directories this process owns -> the descriptor holding the lock


@dataclass(frozen=True)
class EngineOwner:
    """The process that has the chDB directory open. ``pid`` is None if the lock file has none."""

    pid: int | None
    this_process: bool


def claim_engine(path: Path) -> None:
    """Make this process the owner of the chDB directory ``path`` (idempotent)."""
    path = path.resolve()
    if path in _held:
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        owner = probe_engine(path)
        pid = owner.pid if owner is not None else None
        raise EngineBusyError(f"chDB directory {path} is open in process {pid or '?'} (one process per directory)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[path] = fd


def probe_engine(path: Path) -> EngineOwner | None:
    """Return the owner of the chDB directory ``path``, or None when nobody has it open."""
    path = path.resolve()
    if path in _held:
        return EngineOwner(os.getpid(), True)
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            pid = int(text) if text.isdigit() else None
            return EngineOwner(pid, pid == os.getpid())
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
