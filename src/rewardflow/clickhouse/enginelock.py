"""Who owns a chDB directory? Answered without touching the engine.

chDB allows one process per data directory. The engine holds an exclusive
``flock`` on ``<path>/status`` (which also records its PID) while it is open.
Opening the engine from a second process fails with the cryptic
``Error initializing EmbeddedServer`` and leaves that process's engine
unusable, so readers call :func:`probe_engine` first.

Contract: never blocks, never opens the engine, never removes a lock held by
anyone (it only takes and drops its own shared ``flock`` on a fresh file
descriptor; ``flock`` locks belong to the open file, so this cannot release
the owner's lock even inside the owning process).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

_PID = re.compile(r"^PID:\s*(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class EngineOwner:
    """The process that has the chDB directory open. ``pid`` is None if the status file has none."""

    pid: int | None
    this_process: bool


def probe_engine(path: Path) -> EngineOwner | None:
    """Return the owner of the chDB engine at ``path``, or None when nobody has it open."""
    status = path / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            match = _PID.search(text)
            pid = int(match.group(1)) if match else None
            return EngineOwner(pid, pid == os.getpid())
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
