"""A FIFO queue between two threads bounded in items and in bytes: what a read's stages hold is what
bounds the process's memory outside the engine's own limit.

Contract: thread-safe. :meth:`ByteQueue.put` admits an item when the queue holds fewer than
``max_items`` items and its bytes plus the item's are at most ``max_bytes``, or when the queue is
empty (an item larger than ``max_bytes`` then passes alone; callers refuse such items first).
``put`` and ``get`` wait at most ``timeout`` seconds and raise :class:`queue.Full` or
:class:`queue.Empty` then, as :class:`queue.Queue` does.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Any


class ByteQueue:
    """Items with their sizes, first in first out."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self._items: deque[tuple[Any, int]] = deque()
        self._bytes = 0
        self._changed = threading.Condition()

    def put(self, item: Any, size: int, timeout: float) -> None:
        """Append ``item`` of ``size`` bytes once there is room (see the module contract)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._room(size), timeout):
                raise queue.Full
            self._items.append((item, size))
            self._bytes += size
            self._changed.notify_all()

    def get(self, timeout: float) -> Any:
        """The oldest item, once there is one."""
        with self._changed:
            if not self._changed.wait_for(lambda: bool(self._items), timeout):
                raise queue.Empty
            item, size = self._items.popleft()
            self._bytes -= size
            self._changed.notify_all()
            return item

    def get_nowait(self) -> Any:
        return self.get(0)

    def _room(self, size: int) -> bool:
        return not self._items or (len(self._items) < self.max_items and self._bytes + size <= self.max_bytes)
