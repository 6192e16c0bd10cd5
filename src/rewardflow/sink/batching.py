"""The sink's batch stage: per-partition buffers and where batches are cut. Pure.

A batch is a run of consecutive records of one (topic, partition), written
with one insert whose deduplication token is derived from (topic, partition,
first offset, last offset). For a replay to be dropped by ClickHouse, the
replay must cut *the same* ranges, though time-based flushing makes cuts
depend on timing. So cuts are recorded in the ledger (:mod:`.ledger`) before
the insert, and :func:`cut` re-uses a recorded range whenever one starts
where the buffer starts; only ranges never recorded are cut afresh (at most
``max_rows`` rows, and never across the start of a recorded range).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pending:
    """One buffered record: its offset, row count and JSONEachRow line.

    ``reject`` is set (reason_code, reason, original value) for a record the
    decode stage refused; it carries no line and is dead-lettered with its batch.
    """

    offset: int
    rows: int
    line: bytes
    reject: tuple[str, str, bytes] | None = None


@dataclass(frozen=True)
class Batch:
    """Records ``first``..``last`` (inclusive) of one partition, bound for ``table``."""

    topic: str
    partition: int
    table: str
    first: int
    last: int
    records: tuple[Pending, ...]
    recorded: bool
    topic_id: str = ""

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.records)

    @property
    def token(self) -> str:
        """The insert_deduplication_token: a pure function of the range.

        ``topic_id`` (Kafka's id of this incarnation of the topic) keeps a topic
        deleted and re-created under the same name from matching old tokens.
        """
        return f"rf1:{self.topic}:{self.topic_id}:{self.partition}:{self.first}:{self.last}"


@dataclass
class PartitionBuffer:
    """Records of one partition read but not yet written, in offset order."""

    topic: str
    partition: int
    table: str
    topic_id: str = ""
    records: list[Pending] = field(default_factory=list)
    since: float = 0.0  # monotonic time the oldest buffered record arrived

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.records)

    def add(self, record: Pending, now: float) -> None:
        if not self.records:
            self.since = now
        self.records.append(record)


Planned = Callable[[int], int | None]
"""first offset -> recorded last offset of the range starting there, or None."""
NextStart = Callable[[int], int | None]
"""offset -> the smallest recorded first offset greater than it, or None."""


def cut(
    buf: PartitionBuffer, planned: Planned, next_start: NextStart, *, max_rows: int, force: bool, position: int | None
) -> list[Batch]:
    """Cut the leading records of ``buf`` into batches; the rest stay buffered.

    A recorded range is cut only when complete (a later record is buffered, its
    last offset is buffered, or the consumer ``position`` is already past it).
    Unrecorded records are cut only when ``force`` (the flush trigger fired).
    Returns the batches in offset order and removes their records from ``buf``.
    """
    recs = buf.records
    out: list[Batch] = []
    i = 0
    while i < len(recs):
        first = recs[i].offset
        last = planned(first)
        j = i
        if last is not None:
            while j < len(recs) and recs[j].offset <= last:
                j += 1
            complete = j < len(recs) or recs[j - 1].offset == last or (position is not None and position > last)
            if not complete:
                break
            out.append(Batch(buf.topic, buf.partition, buf.table, first, last, tuple(recs[i:j]), True, buf.topic_id))
        else:
            if not force:
                break
            stop = next_start(first)
            rows = 0
            while j < len(recs) and (stop is None or recs[j].offset < stop):
                if j > i and rows + recs[j].rows > max_rows:
                    break
                rows += recs[j].rows
                j += 1
            last = recs[j - 1].offset
            out.append(Batch(buf.topic, buf.partition, buf.table, first, last, tuple(recs[i:j]), False, buf.topic_id))
        i = j
    del recs[:i]
    return out
