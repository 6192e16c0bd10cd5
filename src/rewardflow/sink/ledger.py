"""The sink's batch ledger (table ``sink_batches``): every insert's offset range, recorded first.

Why: a batch's deduplication token is derived from its offset range, and a
replay is only dropped if it re-cuts the same ranges (see :mod:`.batching`).
The ledger is written *before* the batch's insert, so every range that may
have reached a table is on record; if the process dies between the two, the
replay finds the range and re-inserts it under the same token (a no-op if the
insert had landed, the missing rows if it had not).

Contract: :meth:`BatchLedger.planned` and :meth:`BatchLedger.next_start`
answer from memory; :meth:`BatchLedger.load` (one query per partition, on
first use after an assignment) and :meth:`BatchLedger.record` (one insert per
flush) block and raise clickhouse-connect errors, which the sink treats as
"ClickHouse unavailable".
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from clickhouse_connect.driver.client import Client

from rewardflow.sink.batching import Batch

TP = tuple[str, int]
_COLUMNS = ["topic", "topic_id", "partition", "first_offset", "last_offset", "table", "rows", "token"]


class BatchLedger:
    """In-memory view of ``sink_batches`` for the partitions this sink owns."""

    def __init__(self) -> None:
        self._ranges: dict[TP, dict[int, int]] = {}
        self._starts: dict[TP, list[int]] = {}

    def loaded(self, tp: TP) -> bool:
        return tp in self._ranges

    def forget(self, tp: TP) -> None:
        """Drop a partition (revoked); it is loaded again on next use."""
        self._ranges.pop(tp, None)
        self._starts.pop(tp, None)

    def load(self, client: Client, tp: TP, topic_id: str, from_offset: int) -> None:
        """Read the recorded ranges of ``tp`` (this incarnation of the topic) from ``from_offset`` on."""
        result = client.query(
            "SELECT first_offset, argMin(last_offset, _seq) FROM sink_batches "
            "WHERE topic = {t:String} AND topic_id = {id:String} AND partition = {p:UInt32} AND first_offset >= {o:UInt64} "
            "GROUP BY first_offset ORDER BY first_offset",
            parameters={"t": tp[0], "id": topic_id, "p": tp[1], "o": from_offset},
        )
        ranges = {int(first): int(last) for first, last in result.result_rows}
        self._ranges[tp] = ranges
        self._starts[tp] = sorted(ranges)

    def planned(self, tp: TP, first: int) -> int | None:
        """The recorded last offset of the range starting at ``first``, if any."""
        return self._ranges.get(tp, {}).get(first)

    def next_start(self, tp: TP, offset: int) -> int | None:
        """The smallest recorded first offset greater than ``offset``, if any."""
        starts = self._starts.get(tp, [])
        i = bisect.bisect_right(starts, offset)
        return starts[i] if i < len(starts) else None

    def record(self, client: Client, batches: Sequence[Batch]) -> None:
        """Persist the ranges of newly cut ``batches`` (one insert); then remember them."""
        fresh = [b for b in batches if not b.recorded]
        if not fresh:
            return
        rows = [[b.topic, b.topic_id, b.partition, b.first, b.last, b.table, b.rows, b.token] for b in fresh]
        token = "ledger:" + ",".join(b.token for b in fresh)
        client.insert("sink_batches", rows, column_names=_COLUMNS, settings={"insert_deduplication_token": token})
        for b in fresh:
            tp = (b.topic, b.partition)
            self._ranges.setdefault(tp, {})[b.first] = b.last
            bisect.insort(self._starts.setdefault(tp, []), b.first)
