"""Offset-gap guard: no raw record is skipped because Faust never delivered it.

Why: faust-streaming's consumer can lose a record around a rebalance. Its fetcher
keeps delivering messages fetched under the old consumer generation, the stream
skips them, and the fetcher's read offset moves past the refetched copies; then
the next acked offset is committed over the hole (its gap check tolerates one
missing offset). Seen in our kill -9 tests about 1 run in 3 under load.

Contract: :meth:`GapGuard.admit` is called with one partition's messages of a
batch, in offset order, before they are processed. The raw topic's offsets are
contiguous (no transactions, no compaction), so a message above the partition's
expected offset (the processor's last processed offset + 1, kept in its meta
key across restarts; for a partition never processed, the committed offset or
else the log start) means records were never delivered. Then ``admit``:

* returns only the messages before the hole (they are processed and acked);
* marks the others as acked *for Faust only* (``message.acked``), so Faust never
  counts them as processed and cannot commit over the hole;
* seeks the consumer back to the expected offset, so the records are read again;
* drops Faust's own gap intervals at or above the expected offset (Faust treats
  them as committable, which would commit records the refetch has not reached).

When the broker no longer has the records (retention deleted them before they
were processed), the loss is logged as an error and counted in
``offset_gap_records_lost``; processing goes on from what exists. After
``max_attempts`` seeks without progress the process exits with code 70 without
committing, rather than skip anything silently.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from rewardflow.core.processor import PartitionProcessor
from rewardflow_streams.metrics import WorkerMetrics

log = logging.getLogger("rewardflow.streams")
_END = 2**63 - 1


class GapGuard:
    """Detects holes in one worker's raw partitions and has Faust read them again."""

    def __init__(self, app: Any, metrics: WorkerMetrics, max_attempts: int = 200) -> None:
        self.app, self.metrics, self.max_attempts = app, metrics, max_attempts
        self._attempts: dict[int, int] = {}

    async def admit(self, proc: PartitionProcessor, partition: int, msgs: list[Any]) -> list[Any]:
        """The messages to process now: all of them, or those before the first hole."""
        if not msgs:
            return msgs
        expected = proc.expected_offset()
        if expected is None:  # nothing processed yet: the partition starts at the commit or the log start
            expected = await self._start_offset(msgs[0].tp)
        self._drop_faust_gaps(msgs[0].tp, expected)
        for i, m in enumerate(msgs):
            if m.offset > expected:
                return await self._hole(partition, expected, msgs, i)
            expected = max(expected, m.offset + 1)
        self._attempts.pop(partition, None)
        return msgs

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
        for m in msgs[i:]:
            m.acked = True  # Faust then never acks them: its commit stays below the hole
        await self.app.consumer.seek(tp, expected)
        self._drop_faust_gaps(tp, expected)
        return msgs[:i]

    async def _start_offset(self, tp: Any) -> int:
        committed = getattr(self.app.consumer, "_committed_offset", {}).get(tp)
        earliest = (await self.app.consumer.earliest_offsets(tp)).get(tp) or 0
        return max(earliest, committed or 0)

    def _drop_faust_gaps(self, tp: Any, expected: int) -> None:
        gaps = getattr(self.app.consumer, "_gap", None)
        tree = gaps.get(tp) if gaps is not None else None
        if tree:
            tree.chop(expected, _END)
