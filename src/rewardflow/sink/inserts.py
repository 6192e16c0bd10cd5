"""The sink's inserts in flight: at most one chain per partition running, later batches queued behind it.

Contract of :class:`Inserts`: batches handed to :meth:`Inserts.add` (already
recorded in the ledger, in offset order per partition) are written in that
order per partition, never two of one partition at once. :meth:`Inserts.collect`
returns the results of finished chains; the batches a failed chain did not
write go back to the *front* of their partition's queue, so a retry writes
them first. Nothing here commits offsets or touches Kafka: the caller commits
the written prefixes it collects. Used from the sink's thread only.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait

from rewardflow.sink.batching import Batch
from rewardflow.sink.inflight import ChainResult, ParallelWriter

TP = tuple[str, int]


class Inserts:
    """Queued and running batches of the sink, per partition."""

    def __init__(self, writer: ParallelWriter) -> None:
        self.writer = writer
        self.queued: dict[TP, list[Batch]] = {}
        self.running: dict[TP, tuple[list[Batch], Future[ChainResult], int]] = {}

    @property
    def busy(self) -> bool:
        """Anything queued or running."""
        return bool(self.running) or any(self.queued.values())

    def rows(self) -> int:
        """Rows queued or being written."""
        return sum(b.rows for q in self.queued.values() for b in q) + sum(
            b.rows for chain, _, _ in self.running.values() for b in chain
        )

    def add(self, batches: list[Batch]) -> None:
        """Queue ``batches`` (offset order per partition) behind what is queued or running."""
        for batch in batches:
            self.queued.setdefault((batch.topic, batch.partition), []).append(batch)

    def start(self, tag: int = 0) -> None:
        """Submit the queue of every partition that has no chain running; ``tag`` comes back with its result."""
        for tp, queue in list(self.queued.items()):
            if queue and tp not in self.running:
                self.running[tp] = (queue, self.writer.submit(queue), tag)
                del self.queued[tp]

    def collect(self, *, block: bool = False) -> list[tuple[int, ChainResult]]:
        """(tag, result) of the finished chains; with ``block``, wait until one finished (if any runs)."""
        if block and self.running:
            wait([f for _, f, _ in self.running.values()], return_when=FIRST_COMPLETED)
        results: list[tuple[int, ChainResult]] = []
        for tp, (_, future, tag) in list(self.running.items()):
            if not future.done():
                continue
            del self.running[tp]
            result = future.result()  # raises only for programming errors
            if result.remaining:
                self.queued[tp] = result.remaining + self.queued.get(tp, [])
            results.append((tag, result))
        return results

    def forget(self, tp: TP) -> None:
        """Drop the queue of a revoked partition (call when nothing of it runs)."""
        self.queued.pop(tp, None)
