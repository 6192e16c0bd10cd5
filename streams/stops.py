"""Commit stops: the source commit made to pass part of a batch before the rest is processed.

The core stops a batch once a session's tombstones kept until the commit reach its limits
(``PartitionProcessor.process_batch(until_commit=True)``); the worker then has the commit pass the
processed part (:meth:`CommitStops.commit_through`) and goes on, so the kept tombstones go at their
next prune.

Contract: :meth:`CommitStops.commit_through` is awaited once the part's outputs and state writes are
confirmed (and the batch before it acked). It acks the part, records the gap guard read straight from
the broker included (:func:`~rewardflow_streams.bulk.ack_part`), so the commit can pass a part that
ends inside a hole; a part whose messages a rebalance made stale is not acked (they are read again).
It commits for up to :data:`COMMIT_WAIT_S` in all, each commit call included (aiokafka retries a
commit while the coordinator is away). A commit that does not pass the part in time is logged, and
the partition's batches then run without stops (:meth:`CommitStops.allowed`) for as long before the
next attempt: while commits fail, what sessions keep until the commit grows with the records
processed, and a state that outgrows the changelog's record limit stops the worker (exit 70) as an
infrastructure failure would. Never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from rewardflow_streams import bulk
from rewardflow_streams.metrics import WorkerMetrics

log = logging.getLogger("rewardflow.streams")
# How long a batch the core stopped for a commit waits for that commit before going on without it
COMMIT_WAIT_S = 10.0


class CommitStops:
    """The commit stops of one worker's raw partitions."""

    def __init__(self, consumer: Callable[[], Any], committed: Callable[[Any, int], int | None],
                 current: Callable[[list[Any]], bool], metrics: WorkerMetrics) -> None:
        self._consumer, self._committed, self._current, self._metrics = consumer, committed, current, metrics
        # raw partition -> monotonic time before which its batches do not stop for a commit (the last wait ran out)
        self._no_stops_until: dict[int, float] = {}

    def allowed(self, partition: int) -> bool:
        """Whether a batch of ``partition`` may stop for a commit now (``until_commit``)."""
        return time.monotonic() >= self._no_stops_until.get(partition, 0.0)

    async def commit_through(self, partition: int, msgs: list[Any]) -> None:
        """Ack ``msgs`` (a processed part of one partition, in offset order, its sends confirmed) and have
        the source commit pass them; see the module doc."""
        if not self._current(msgs):
            return
        consumer, tp, want = self._consumer(), msgs[-1].tp, msgs[-1].offset + 1
        bulk.ack_part(consumer, msgs)
        self._metrics.counters["commit_stops"] += 1
        deadline = time.monotonic() + COMMIT_WAIT_S
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(consumer.commit({tp})), max(0.01, deadline - time.monotonic()))
            got = self._committed(tp, partition)
            if got is not None and got >= want:
                return
            if time.monotonic() >= deadline or not self._current(msgs):
                self._no_stops_until[partition] = time.monotonic() + COMMIT_WAIT_S
                log.warning("a session's tombstones kept until the commit reached its limits at %s[%d]@%d, and "
                            "the commit is at %s: going on uncommitted, without such stops for %.0f s",
                            tp.topic, partition, msgs[-1].offset, got, COMMIT_WAIT_S)
                return
            await asyncio.sleep(0.05)
