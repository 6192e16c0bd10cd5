"""The served times of a partition's open served turns, with the earliest at hand.

A window may close only once no open served turn can still add to it, so the processor asks for the
earliest served time of its open turns whenever a window is due. While one turn is held open (a client
may keep one open for up to its settle time plus ``max_turn_span_ms``), windows stay due, and that
question comes with every record: a scan of every open turn of the partition each time would cost a
record milliseconds on a busy partition.

Contract: pure, not thread-safe. :meth:`OpenServed.earliest` is the minimum of the times set and not
removed, in amortised logarithmic time: a heap of (time, key) beside the map, where an entry whose key
was removed or set again is dropped when it reaches the top, and the heap is rebuilt from the map once
it holds more than twice the entries the map does (and 64 more).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

Key = tuple[str, str]  # (session key, request id): request ids need not be unique across sessions


class OpenServed:
    """Open served turns' served times by (session key, request id); see the module doc."""

    __slots__ = ("_ts", "_heap")

    def __init__(self, items: Mapping[Key, int] | None = None) -> None:
        self._ts: dict[Key, int] = dict(items or {})
        self._heap: list[tuple[int, Key]] = []
        self._rebuild()

    def __len__(self) -> int:
        return len(self._ts)

    def __setitem__(self, key: Key, ts: int) -> None:
        if self._ts.get(key) == ts:
            return
        self._ts[key] = ts
        heapq.heappush(self._heap, (ts, key))
        self._bound()

    def pop(self, key: Key) -> int | None:
        """Forget ``key``; its time, or None when it was not set."""
        ts = self._ts.pop(key, None)
        self._bound()
        return ts

    def earliest(self) -> int | None:
        """The earliest time set, or None when there is none."""
        heap, ts = self._heap, self._ts
        while heap:
            t, key = heap[0]
            if ts.get(key) == t:
                return t
            heapq.heappop(heap)
        return None

    def _bound(self) -> None:
        if len(self._heap) > 2 * len(self._ts) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(t, key) for key, t in self._ts.items()]
        heapq.heapify(self._heap)
