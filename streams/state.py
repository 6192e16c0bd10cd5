"""A :class:`~rewardflow.core.config.StateStore` over a changelog-backed Faust Table.

Values are stored as orjson bytes (``value_serializer='raw'``), so the table's
changelog carries exactly what the core asked to keep.

Contract: writes go to the local table and to changelog partition
:attr:`TableStore.partition` (the shell sets it to the source partition of
the records being processed), in call order, through Faust's buffered
producer, which Faust flushes before it commits source offsets. Writing with
an explicit partition, instead of through ``table[key] = …``, lets the agent
write outside Faust's per-event context (it processes batches of events).
:meth:`TableStore.put` raises ``ValueError`` for a value larger than
``max_bytes``: the changelog send would fail later, asynchronously, and Faust
only logs that, so the write would be lost silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

_OPTS = orjson.OPT_NON_STR_KEYS


class TableStore:
    """Adapter: the core's store protocol on a Faust Table of raw bytes."""

    def __init__(self, table: Any, max_bytes: int | None = None) -> None:
        self.table = table
        self.max_bytes = max_bytes
        self.partition: int | None = None

    def get(self, key: str) -> Any | None:
        raw = self.table.get(key)
        return None if raw is None else orjson.loads(raw)

    def put(self, key: str, value: Any) -> None:
        data = orjson.dumps(value, option=_OPTS)
        if self.max_bytes is not None and len(data) > self.max_bytes:
            raise ValueError(f"state value of {key!r} is {len(data):,} bytes, over the changelog's "
                             f"{self.max_bytes:,}-byte record limit")
        self.table.send_changelog(self._partition(), key, data)
        self.table.data[key] = data

    def delete(self, key: str) -> None:
        if key in self.table.data:
            self.table.send_changelog(self._partition(), key, None, value_serializer="raw")
            del self.table.data[key]

    def _partition(self) -> int:
        if self.partition is None:
            raise RuntimeError("TableStore.partition is not set: the shell must bind it before writing")
        return self.partition

    def items(self) -> Iterator[tuple[str, Any]]:
        for key, raw in list(self.table.items()):
            if raw is not None:
                yield (key.decode() if isinstance(key, bytes) else key), orjson.loads(raw)
