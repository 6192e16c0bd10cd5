"""The nonces a read endpoint took, kept in a file under its home, so a signed request taken before a
restart is refused after it as well (:class:`~rewardflow.readapi.signing.Nonces` reads it at start).

The file holds one line per nonce taken, ``<token id> <nonce> <until>`` (``until``: the wall-clock
second after which the request it came with is past the window). Each line is written with one
``write`` before the request runs, so a process killed at any point leaves every nonce it acted on in
the file (the operating system keeps what was written; a power loss may not). A line cut short by a
kill is skipped when read. The file is rewritten from the nonces still kept at start and whenever it
grows past twice those plus :data:`SLACK` lines.

Contract: not thread-safe (its owner holds a lock around every call); blocks on the file only.
:meth:`NonceLog.append` raises ``OSError`` when the line cannot be written, and the caller then
refuses the request: a nonce is never acted on without its record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

NONCES_FILE = "read-nonces.log"
"""The file under the endpoint's home."""
SLACK = 10_000
"""Lines the file may hold beyond twice the nonces still kept before it is rewritten."""

_LINE = re.compile(r"^([0-9a-f]{12}) ([0-9a-f]{16,64}) ([0-9]{1,12}(?:\.[0-9]+)?)$")


class NonceLog:
    """The append-only record of the nonces taken (mode 0600), and its reading at start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._lines = 0

    def load(self, now: float) -> Iterator[tuple[str, str, float]]:
        """The ``(token id, nonce, until)`` of each line still in force at ``now``, in file order
        (malformed and expired lines skipped). Nothing when there is no file."""
        try:
            text = self.path.read_text("ascii", errors="replace")
        except FileNotFoundError:
            return
        for line in text.splitlines():
            m = _LINE.match(line)
            if m is not None and float(m.group(3)) > now:
                yield m.group(1), m.group(2), float(m.group(3))

    def rewrite(self, kept: Iterable[tuple[str, str, float]]) -> None:
        """Replace the file by the lines of ``kept`` (written to a new file, then renamed over it)."""
        tmp = self.path.with_name(self.path.name + ".new")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = "".join(f"{t} {n} {u:.3f}\n" for t, n, u in kept)
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            data = body.encode("ascii")
            if os.write(fd, data) != len(data):
                raise OSError(f"{tmp}: a short write")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.close()
        self._lines = body.count("\n")

    def append(self, token_id: str, nonce: str, until: float) -> None:
        """Record one nonce taken: a single ``write`` of its line. Raises ``OSError`` when it fails."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        line = f"{token_id} {nonce} {until:.3f}\n".encode("ascii")
        if os.write(self._fd, line) != len(line):
            raise OSError(f"{self.path}: a short write")
        self._lines += 1

    def due(self, kept: int) -> bool:
        """Whether the file holds more than twice ``kept`` lines plus :data:`SLACK`: time to rewrite it."""
        return self._lines > 2 * kept + SLACK

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
