"""Offset-gap guard: no raw record is skipped because Faust never delivered it.

Why: faust-streaming's consumer can lose a record around a rebalance. Its fetcher
keeps delivering messages fetched under the old consumer generation, the stream
skips them, and the fetcher's read offset moves past the refetched copies; then
the next acked offset is committed over the hole (its gap check tolerates one
missing offset). Seen in our kill -9 tests about 1 run in 3 under load.

Contract: :meth:`GapGuard.admit` is called with one partition's messages of a
batch, in offset order, before they are processed. The raw topic's offsets are
contiguous (no transactions, no compaction), so a message above the next offset
Faust should deliver (after an assignment, the group's committed offset; then
one past the highest delivered) means records were never delivered. Such a
hole also stalls Faust's commits for good (its acked offsets never become
contiguous), so every restart would replay from there. Then ``admit``:

* returns only the messages before the hole (they are processed and acked);
* marks the others as acked *for Faust only* (``message.acked``), so Faust never
  counts them as processed and cannot commit over the hole;
* seeks the consumer back to the expected offset, so the records are read again;
* drops Faust's own gap intervals at or above the expected offset (Faust treats
  them as committable, which would commit records the refetch has not reached).

When the broker no longer has the records (retention deleted them before they
were processed), the loss is logged as an error and counted in
``offset_gap_records_lost``; processing goes on from what exists. After
``max_attempts`` seeks without progress (at most one per ``RESEEK_S`` for the same
offset: messages queued before a seek keep arriving) the process exits with code 70 without
committing, rather than skip anything silently.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from rewardflow.core.processor import PartitionProcessor
from rewardflow_streams.metrics import WorkerMetrics

log = logging.getLogger("rewardflow.streams")
_END = 2**63 - 1
RESEEK_S = 1.0


class GapGuard:
    """Detects holes in one worker's raw partitions and has Faust read them again."""

    def __init__(self, app: Any, metrics: WorkerMetrics, committed_of: Callable[[Any], int | None],
                 max_attempts: int = 200) -> None:
        self.app, self.metrics, self.max_attempts = app, metrics, max_attempts
        self._committed_of = committed_of  # the group's committed offset of a partition, from the broker
        self._attempts: dict[int, int] = {}
        self._next: dict[int, int] = {}  # next offset Faust should deliver, per partition
        self._start: dict[int, int] = {}  # where delivery resumed after the assignment (broker commit)
        self._sought: dict[int, tuple[int, float]] = {}  # partition -> (offset, monotonic time) of the last seek

    def reset(self) -> None:
        """After a rebalance Faust delivers each partition from its committed offset again."""
        self._next.clear()
        self._start.clear()
        self._sought.clear()

    def start_offset(self, partition: int) -> int | None:
        """Where Faust resumed ``partition`` after the assignment (the group's committed offset as
        the broker reported it then): no replay can start before it. None before the first batch."""
        return self._start.get(partition)

    async def admit(self, proc: PartitionProcessor, partition: int, msgs: list[Any]) -> list[Any]:
        """The messages to process now: all of them, or those before the first hole."""
        if not msgs:
            return msgs
        nxt = self._next.get(partition)
        if nxt is None:
            nxt = self._start[partition] = await self._start_offset(msgs[0].tp, proc)
        self._drop_faust_gaps(msgs[0].tp, nxt)
        for i, m in enumerate(msgs):
            if m.offset > nxt:
                kept = await self._hole(partition, nxt, msgs, i)
                self._delivered(partition, kept, nxt)
                return kept
            nxt = max(nxt, m.offset + 1)
        self._delivered(partition, msgs, nxt)
        self._attempts.pop(partition, None)
        self._sought.pop(partition, None)
        return msgs

    def _delivered(self, partition: int, msgs: list[Any], nxt: int) -> None:
        if msgs:
            nxt = max(nxt, max(m.offset for m in msgs) + 1)
        self._next[partition] = nxt

    async def _hole(self, partition: int, expected: int, msgs: list[Any], i: int) -> list[Any]:
        tp, got = msgs[i].tp, msgs[i].offset
        earliest = (await self.app.consumer.earliest_offsets(tp)).get(tp)
        if earliest is not None and earliest > expected:
            lost = min(got, earliest) - expected
            self.metrics.counters["offset_gap_records_lost"] += lost
            log.error("%d records of %s[%d] (from offset %d) were deleted by the broker (retention) before "
                      "they were processed; going on from offset %d", lost, tp.topic, partition, expected,
                      min(got, earliest))
            return msgs
        for m in msgs[i:]:
            m.acked = True  # Faust then never acks them: its commit stays below the hole
        sought = self._sought.get(partition)
        if sought is not None and sought[0] == expected and time.monotonic() - sought[1] < RESEEK_S:
            # already reading again from there: messages Faust had queued before that seek keep
            # arriving; seeking again for each of them would restart the re-read every time
            self._drop_faust_gaps(tp, expected)
            return msgs[:i]
        n = self._attempts[partition] = self._attempts.get(partition, 0) + 1
        if n == 1:
            self.metrics.counters["offset_gaps"] += 1
            log.warning("records %d..%d of %s[%d] never reached the agent (dropped by the Faust consumer, "
                        "usually around a rebalance); reading them again from offset %d",
                        expected, got - 1, tp.topic, partition, expected)
        if n > self.max_attempts:
            log.critical("%s[%d]: offset %d still missing after %d seeks; exiting without commit",
                         tp.topic, partition, expected, n - 1)
            os._exit(70)
        # seek_wait runs the seek in Faust's consumer thread: a plain seek() from this loop races
        # aiokafka's fetcher there (seen: KeyError in Fetcher.fetched_records, then a worker crash)
        await self.app.consumer.seek_wait({tp: expected})
        self._sought[partition] = (expected, time.monotonic())
        self._drop_faust_gaps(tp, expected)
        return msgs[:i]

    async def _start_offset(self, tp: Any, proc: PartitionProcessor) -> int:
        """Where Faust resumes a partition after an assignment: the group's committed offset, else
        the log start (a partition never committed is read from the beginning).

        Asked of the broker: Faust's own ``_committed_offset`` also moves on a commit that failed
        (see :mod:`rewardflow_streams.commits`); it is only the fallback when the broker cannot say.
        """
        committed = await asyncio.to_thread(self._committed_of, tp)
        if committed is None:
            committed = getattr(self.app.consumer, "_committed_offset", {}).get(tp)
        earliest = (await self.app.consumer.earliest_offsets(tp)).get(tp) or 0
        return max(earliest, committed or 0)

    def _drop_faust_gaps(self, tp: Any, expected: int) -> None:
        gaps = getattr(self.app.consumer, "_gap", None)
        tree = gaps.get(tp) if gaps is not None else None
        if tree:
            tree.chop(expected, _END)
