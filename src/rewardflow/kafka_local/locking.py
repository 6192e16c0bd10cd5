"""An exclusive advisory file lock shared by processes on this machine."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive_lock(lock_file: Path) -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``lock_file`` (created if absent) for the block.

    Blocks until no other process holds it. The kernel drops the lock when the
    holder dies, so a killed process never leaves it stuck.
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
