"""The window closes a partition keeps in its store until the source commit passes them.

Each close a record decides is stored under its own keys (``r:<partition>:<offset>:<chunk>``, chunks of
:data:`CLOSE_CHUNK` aggregates, far under a changelog record), so a restart can re-emit the closes whose
delivery is uncertain (:func:`~rewardflow.core.restore.restore` reads them back) while the partition's meta
key stays small. Contract: pure over a :class:`~rewardflow.core.config.StateStore`; writes happen only in
:meth:`StoredCloses.write`, which the processor calls once a batch, before it writes the meta key.
"""

from __future__ import annotations

from rewardflow.core.config import StateStore
from rewardflow.core.restore import close_prefix
from rewardflow.core.rows import WindowAggregate

KEEP_CLOSES = 64
"""With the source commit unknown, the closes of this many latest offsets are kept."""
CLOSE_CHUNK = 200
"""Window aggregates per stored close key (~200 KB)."""


class StoredCloses:
    """The stored closes of one partition (``stored``: key -> offset of the record that closed them, as a
    restore found them) and those decided since the last write."""

    def __init__(self, partition: int, stored: dict[str, int] | None = None) -> None:
        self._prefix = close_prefix(partition)
        self._stored: dict[str, int] = dict(stored or {})
        self._new: list[tuple[int, list[WindowAggregate]]] = []

    def add(self, offset: int, closed: list[WindowAggregate]) -> None:
        """The windows the record at ``offset`` closed; stored at the next :meth:`write`."""
        self._new.append((offset, closed))

    def write(self, store: StateStore, committed: int | None) -> None:
        """Store the closes added since the last write, and delete those below ``committed``, the source
        partition's committed offset (None, unknown: all but those of the last :data:`KEEP_CLOSES` offsets)."""
        for offset, closed in self._new:
            for i in range(0, len(closed), CLOSE_CHUNK):
                key = f"{self._prefix}{offset}:{i // CLOSE_CHUNK}"
                store.put(key, closed[i:i + CLOSE_CHUNK])
                self._stored[key] = offset
        self._new = []
        if committed is None and self._stored:
            offsets = sorted(set(self._stored.values()))
            committed = offsets[-KEEP_CLOSES] if len(offsets) > KEEP_CLOSES else None
        if committed is not None:
            for key in [k for k, off in self._stored.items() if off < committed]:
                store.delete(key)
                del self._stored[key]
