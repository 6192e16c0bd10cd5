"""Which source offsets the broker has really committed, as far as this worker knows.

Why: the core prunes the ids it uses to recognise a replayed record, and deletes
the stored window closes it would re-emit, once the source partition's commit
has passed them (``PartitionProcessor.process_batch(committed=...)``). That is
only safe if the offset really is committed on the broker: a replay after a
crash or a rebalance starts there.

Faust's consumer keeps its own ``_committed_offset``, but updates it even when
the commit failed (aiokafka's ``CommitFailedError: ... already rebalanced``
makes ``_commit`` return False; the map is updated anyway). A worker that
processed on between that failed commit and the next assignment pruned the
seen ids of records the new generation then read again, and judged their
events late. Seen in the kill -9 fault test, with several dead members of the
group expiring one after another.

Faust calls ``TableManager.on_commit`` only after a successful commit, so
:class:`CommitLedger`, installed as the app's ``TableManager``, records exactly
the confirmed offsets. Contract: :attr:`CommitLedger.confirmed` maps a source
partition to the highest offset (next offset to read) the broker acknowledged
for this worker's group; it only grows, and holds nothing for a partition this
process never committed. It also starts without Faust's one-second pause for tables defined late
(the worker defines its one table before the app starts). :func:`group_offsets` asks the broker for the group's
committed offsets (at an assignment, before anything is committed here), :func:`log_starts` for the
first offset each partition still holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from typing import Any, cast

from faust.tables import TableManager

log = logging.getLogger("rewardflow.streams")


class CommitLedger(TableManager):
    """Faust's table manager, plus the offsets of every commit the broker confirmed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.confirmed: dict[Any, int] = {}

    async def on_start(self) -> None:
        """Faust's start, less its one-second sleep: that pause lets an app add tables once it is
        starting, and the worker's table exists before (Faust refuses one added later), so every
        worker start or restart would wait a second for nothing."""
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    def on_commit(self, offsets: MutableMapping[Any, int]) -> None:
        """Called by Faust's consumer after a commit succeeded (never after a failed one)."""
        super().on_commit(offsets)
        # Faust's driver drops partitions revoked meanwhile from the commit, yet reports them here
        assigned = self.app.consumer.assignment()
        for tp, offset in offsets.items():
            if tp in assigned and offset is not None and offset > self.confirmed.get(tp, -1):
                self.confirmed[tp] = offset



def install_unique_acks(consumer: Any) -> None:
    """Make Faust's commit see each acked offset of a partition once.

    Faust commits the first run of consecutive offsets in its sorted ``_acked`` list
    (``Consumer._new_offset``), and it adds the offsets of its gap intervals to that list without
    looking at what is acked already. An offset there twice ends the run: ``341 341 342 342 …``
    commits one offset at a time, once a commit interval, and a partition with hundreds of records
    to commit looks stalled for minutes. Seen after a restart: every offset from the committed one
    to the log end was in the list twice. Here the list is made unique (and sorted, as Faust keeps
    it) before each of Faust's own steps; a duplicate its gaps add in one commit is gone by the next.
    """
    real = consumer._new_offset

    def new_offset(tp: Any) -> int | None:
        acked = consumer._acked[tp]
        unique = set(acked)
        if len(unique) != len(acked):
            acked[:] = sorted(unique)
        return cast(int | None, real(tp))

    consumer._new_offset = new_offset


def group_offsets(reader: Any, tps: list[Any]) -> dict[Any, int | None]:
    """The committed offsets of ``reader``'s group for ``tps`` (Faust ``TP``s), by one blocking request.

    ``reader`` is a confluent-kafka ``Consumer`` with the group's ``group.id`` that never subscribes,
    so it never joins the group. Not an ``AdminClient``: its ``list_consumer_group_offsets`` crashes
    the process (librdkafka, a NULL consumer group) when the answer is ``NOT_COORDINATOR``, which
    the broker gives while the group's coordinator moves (a broker lost or back). None: nothing
    committed; every one None when the broker cannot say (a replay check then starts from the log
    start, which only widens it)."""
    from confluent_kafka import KafkaException, TopicPartition

    from rewardflow.kafka.lag import until

    parts = [TopicPartition(tp.topic, tp.partition) for tp in tps]
    deadline = time.monotonic() + 10  # (a coordinator that moved is found again within a second or two)
    try:
        got = until(deadline, lambda: reader.committed(parts, timeout=max(0.1, deadline - time.monotonic())))
    except KafkaException as exc:
        log.warning("cannot read the committed offsets of %s; assuming the log start: %s", tps, exc)
        return dict.fromkeys(tps)
    except Exception:  # noqa: BLE001 - unknown
        log.warning("cannot read the committed offsets of %s; assuming the log start", tps, exc_info=True)
        return dict.fromkeys(tps)
    offsets = {(r.topic, r.partition): r.offset for r in got if r.error is None}
    return {tp: off if (off := offsets.get((tp.topic, tp.partition), -1)) >= 0 else None for tp in tps}


def log_starts(admin: Any, tps: list[Any]) -> dict[Any, int | None]:
    """The first offset still in the log of each of ``tps`` (Faust ``TP``s), by one blocking admin
    request over ``admin`` (a confluent-kafka ``AdminClient``, its own connections). None for a
    partition the broker did not answer for; every one None when it cannot say (the caller asks
    Faust's consumer instead)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]  # (re-exported, not declared so)

    earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
    req = {TopicPartition(tp.topic, tp.partition): earliest for tp in tps}
    try:
        futures = admin.list_offsets(req, request_timeout=10)
        got = {(k.topic, k.partition): f.result(timeout=10).offset for k, f in futures.items()}
    except Exception:  # noqa: BLE001 - unknown topic, broker away: the caller falls back
        log.warning("cannot read the log start offsets of %s from the broker", tps, exc_info=True)
        return dict.fromkeys(tps)
    starts = {tp: got.get((tp.topic, tp.partition)) for tp in tps}
    return {tp: off if off is not None and off >= 0 else None for tp, off in starts.items()}
