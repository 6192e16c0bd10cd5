"""The values last put under the most recently put keys, bounded in number and in bytes.

Contract: pure, not thread-safe. After :meth:`Recent.put` returns, at most ``size`` values are kept
and, with ``max_bytes``, the sizes given with them total at most that many, except that the value just
put is kept whatever its size; the least recently put go first. A value's size is what the caller says
it weighs (the bytes of its encoding, for the decoded-state caches of the stream processor).
"""

from __future__ import annotations

from typing import Generic, TypeVar

V = TypeVar("V")


class Recent(Generic[V]):
    """At most ``size`` values, and at most ``max_bytes`` of their sizes (None: any); see the module doc."""

    def __init__(self, size: int, max_bytes: int | None = None) -> None:
        self.size, self.max_bytes = size, max_bytes
        self._kept: dict[str, tuple[V, int]] = {}
        self.bytes = 0  # the kept values' sizes

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: str) -> V | None:
        hit = self._kept.get(key)
        return None if hit is None else hit[0]

    def pop(self, key: str) -> V | None:
        """The value under ``key``, no longer kept; None when there is none."""
        hit = self._kept.pop(key, None)
        if hit is None:
            return None
        self.bytes -= hit[1]
        return hit[0]

    def put(self, key: str, value: V, size: int) -> None:
        """Keep ``value`` (weighing ``size``) as the most recent; drop the least recent over the bounds."""
        kept, limit = self._kept, self.max_bytes
        self.pop(key)
        kept[key] = (value, size)
        self.bytes += size
        while len(kept) > self.size or (limit is not None and self.bytes > limit and len(kept) > 1):
            self.bytes -= kept.pop(next(iter(kept)))[1]

    def clear(self) -> None:
        self._kept.clear()
        self.bytes = 0
