"""A :class:`~rewardflow.core.config.StateStore` over a changelog-backed Faust Table.

Values are stored as orjson bytes (``value_serializer='raw'``), so the table's
changelog carries exactly what the core asked to keep.

Contract: :meth:`TableStore.put` and :meth:`TableStore.delete` change the local
table at once and queue the changelog record (none for a value whose bytes the table holds
already under that key) for partition
:attr:`TableStore.partition` (the shell sets it to the source partition of the
records being processed); :meth:`TableStore.send_queued` hands the queue, in
call order, to the worker's :class:`~rewardflow_streams.sender.OutputSender`,
whose ``confirm()`` the agent awaits before the batch may be acked, so a
committed offset implies the state writes of its batch are in the changelog.
Keys are serialised exactly as Faust's table does (its key serializer), so
Faust's changelog recovery reads them back. The writes bypass Faust's
synchronous ``table[key] = …`` path, whose buffer throttles the consumer to one
record per 0.1 s once more than 100 writes wait.
:meth:`TableStore.put` raises ``ValueError`` for a value larger than
``max_bytes``: the changelog send would fail later, and the write would be lost.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from rewardflow.core.config import JSON_OPTS, DecodedCache
from rewardflow_streams.sender import OutputSender

_OPTS = JSON_OPTS


class TableStore:
    """Adapter: the core's store protocol on a Faust Table of raw bytes."""

    def __init__(self, table: Any, sender: OutputSender, max_bytes: int | None = None,
                 decoded_cache: int = 16_384, decoded_cache_bytes: int | None = None) -> None:
        self.table = table
        self.sender = sender
        self.max_bytes = max_bytes
        self.partition: int | None = None
        self._queue: list[tuple[int, str, bytes | None]] = []
        # the core reads back what it wrote in the previous batch; decoding it again cost ~5% of
        # the worker. Valid only while the table still holds those very bytes (a changelog
        # recovery writes new objects).
        self._decoded = DecodedCache(decoded_cache, decoded_cache_bytes)

    @property
    def reads(self) -> int:
        """Values read so far (``get``), and those of them decoded from bytes (not in the cache)."""
        return self._decoded.reads

    @property
    def decodes(self) -> int:
        return self._decoded.decodes

    def get(self, key: str) -> Any | None:
        """The stored value; the very object last ``put`` under ``key`` while the table still holds
        its bytes (as :class:`~rewardflow.core.config.DictStore` does), else a fresh decode."""
        raw = self.table.data.get(key)
        return None if raw is None else self._decoded.read(key, raw)

    def put(self, key: str, value: Any) -> None:
        self.put_json(key, value, orjson.dumps(value, option=_OPTS))

    def put_json(self, key: str, value: Any, data: bytes) -> None:
        """:meth:`put` of ``value`` whose encoding the caller already has: ``data`` must be
        ``orjson.dumps(value, option=OPT_NON_STR_KEYS)``, exactly (the core's session states
        keep the encodings of their unchanged parts between writes)."""
        if self.max_bytes is not None and len(data) > self.max_bytes:
            raise ValueError(f"state value of {key!r} is {len(data):,} bytes, over the changelog's "
                             f"{self.max_bytes:,}-byte record limit")
        stored = self.table.data.get(key)
        if stored != data:
            self._queue.append((self._partition(), key, data))
            self.table.data[key] = stored = data
        # else the same bytes again (a record refused or a duplicate): the changelog's last record of the key
        # holds them already, and a state at its limits is megabytes. The decoded value is kept against the
        # bytes object the table holds, so the next read finds it.
        self._decoded.keep(key, stored, value)

    def delete(self, key: str) -> None:
        if key in self.table.data:
            self._queue.append((self._partition(), key, None))
            del self.table.data[key]
        self._decoded.drop(key)

    def forget(self) -> None:
        """Drop the decoded values: every ``get`` decodes the table's bytes afresh (the core rolls a
        batch back this way when one of its records raised; nothing was written during the batch)."""
        self._decoded.clear()

    def send_queued(self) -> None:
        """Hand the queued changelog records to the sender, in order (blocks only while it is full)."""
        queue, self._queue = self._queue, []
        topic = self.table.changelog_topic.get_topic_name()
        dumps_key, key_type, ks = self.table.app.serializers.dumps_key, self.table.key_type, self.table.key_serializer
        for partition, key, value in queue:
            self.sender.send(topic, value, dumps_key(key_type, key, serializer=ks), partition)

    def _partition(self) -> int:
        if self.partition is None:
            raise RuntimeError("TableStore.partition is not set: the shell must bind it before writing")
        return self.partition

    def items(self) -> Iterator[tuple[str, Any]]:
        for key, raw in list(self.table.items()):
            if raw is not None:
                yield (key.decode() if isinstance(key, bytes) else key), orjson.loads(raw)
