"""The raw topic's records, taken from Faust's consumer one fetch at a time.

Faust hands each fetched record through its conductor, a channel queue, a stream and an event,
awaiting two tasks a record (``Service.wait_first``): at the SDK's record shape that alone caps a
worker far below its target (``bench/bench_faust_path.py`` times both routes; figures in
``bench/README.md``). :func:`drain` replaces the consumer's fetch loop: the raw
topic's records of each fetch go to the worker as one batch; every other topic's records (the
changelog, during a recovery) take Faust's own route, unchanged. A fetch is taken partition by
partition (:func:`fetch`), not through ``Consumer.getmany``, whose per-record steps cost about a
third of the route (``bench/bench_faust_path.py``). Faust keeps the consumer group,
the subscription (the worker's agent stays subscribed to the raw topic and receives nothing),
the table, its changelog, recovery, flow control and the commits of what is acked.

Contract: ``handle(messages)`` is awaited with each fetch's raw messages (each partition's in
offset order) and acks (:func:`ack_all`) what it processed once its outputs are confirmed; the
loop fetches again only after it returns, so nothing else buffers raw records. The read-offset
bookkeeping is Faust's own: a record below its partition's read offset is dropped as read, the
read offset follows each record taken, and an offset gap of an acked topic is registered so a
commit can pass it. An exception in ``handle`` ends the loop and crashes the app, and the worker
exits (:func:`rewardflow_streams.main.exit_on_crash`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from faust.types.tuples import ack_lock
from mode.utils.futures import notify

log = logging.getLogger("rewardflow.streams")
Handle = Callable[[list[Any]], Awaitable[None]]
# How long one fetch waits for records. The first fetch after an assignment often returns nothing
# after its whole wait though records arrived meanwhile (the next fetch has them): a short wait
# bounds that delay (bench/README.md, "After an assignment").
FETCH_TIMEOUT_S = 0.2


class LoopStage:
    """Where :func:`drain` is and since when, for the stall watch's log lines (one loop a process)."""

    def __init__(self) -> None:
        self.stage, self.since = "not started", time.monotonic()

    def enter(self, stage: str) -> None:
        self.stage, self.since = stage, time.monotonic()

    def describe(self) -> str:
        return f"{self.stage} for {time.monotonic() - self.since:.1f} s"


LOOP = LoopStage()


def install(consumer: Any, raw_topic: str, handle: Handle) -> None:
    """Make ``consumer``'s fetcher run :func:`drain` instead of Faust's loop (before the app starts)."""

    async def fetch_loop(fetcher: Any) -> None:
        await drain(consumer, fetcher, raw_topic, handle)

    consumer._drain_messages = fetch_loop


async def drain(consumer: Any, fetcher: Any, raw_topic: str, handle: Handle) -> None:
    """Fetch until the consumer or the fetcher stops; see the module doc."""
    read = consumer._read_offset
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    to_message = consumer._to_message
    app = consumer.app

    def stale(generation: int) -> bool:
        """Whether a rebalance began since the fetch (Faust then seeks back to the committed offsets)."""
        return not consumer.flow_active or app.consumer_generation_id != generation

    try:
        while not (consumer.should_stop or fetcher.should_stop):
            batch: list[Any] = []
            LOOP.enter("fetching")
            fetched, generation = await fetch(consumer, FETCH_TIMEOUT_S)
            LOOP.enter("taking a fetch's records")
            for tp, records in fetched:
                if stale(generation):
                    break
                app.monitor.track_tp_end_offset(tp, consumer.highwater(tp))
                gaps_kept = acks_enabled_for(tp.topic)
                raw = tp.topic == raw_topic
                for record in records:
                    offset, r_offset = record.offset, read[tp]
                    if r_offset is not None and offset < r_offset:
                        continue  # read already (Faust's rule)
                    if r_offset and offset - r_offset > 1 and gaps_kept:
                        await consumer._add_gap(tp, r_offset + 1, offset)
                        if stale(generation):
                            break
                    message = to_message(tp, record)
                    if raw:
                        batch.append(message)
                    else:
                        await consumer.wait_first(consumer.callback(message), consumer.suspend_flow.wait())
                    read[tp] = offset
                    if not raw and stale(generation):
                        break
            await asyncio.sleep(0)  # a fetch may return at once, again and again: let the loop run
            if batch:
                LOOP.enter(f"processing a batch of {len(batch)} records")
                await handle(batch)
        LOOP.enter("stopped")
    except consumer.consumer_stopped_errors:
        if not consumer.app.should_stop:
            raise
    except asyncio.CancelledError:
        if not consumer.app.should_stop:
            raise


async def fetch(consumer: Any, timeout: float) -> tuple[list[tuple[Any, list[Any]]], int]:
    """One fetch's records by partition, as Faust's ``Consumer.getmany`` takes them, and the consumer
    generation they belong to.

    The same records as ``getmany``: none once the consumer stops; none while the flow is off (Faust
    seeks back to the committed offsets then); only partitions active or buffered. Not its per-record
    work: no round-robin across topics (a batch is split by partition anyway), and the flow, the
    generation and the high watermark are looked at once a partition, not once a record.
    """
    if not consumer.flow_active:
        LOOP.enter("waiting for the flow to resume")  # (Faust's fetch waits for it)
    records, active = await consumer._wait_next_records(timeout)
    if active is not None and not active and not consumer.assignment():
        keep_membership(consumer)
    generation = consumer.app.consumer_generation_id
    if records is None or consumer.should_stop:
        return [], generation
    if not consumer.flow_active:
        try:
            await consumer.perform_seek()
        except Exception as exc:  # noqa: BLE001 - logged as Faust logs it; the next fetch tries again
            log.warning("exception performing seek when flow not active %s", exc)
        return [], generation
    buffered = consumer._buffered_partitions
    return [(tp, recs) for tp, recs in records.items()
            if active is None or tp in active or tp in buffered], generation


def keep_membership(consumer: Any) -> None:
    """Keep a spare (a member holding no partition) in the group: Faust never fetches for it, and aiokafka
    counts the time since the last fetch as a stuck poll loop, so past ``broker_max_poll_interval``
    (1,000 s) the spare left the group, silently and for good, and the group rebalanced. Marking a fetch
    restarts that clock; a member that holds partitions keeps the check."""
    with consumer._thread._ensure_consumer()._subscription.fetch_context():
        pass


def ack_all(consumer: Any, messages: Iterable[Any]) -> int:
    """Faust's ``Consumer.ack`` of each of ``messages``, in order, under its lock once; returns how many
    were newly acked.

    The same bookkeeping as one ``ack`` a message: a message is marked acked, and its offset, when at or
    above the partition's committed offset and not acked before, joins the partition's acked offsets
    that Faust's commit reads. Only the per-message lookups (the topic's acks setting, the partition's
    maps) are made once a partition, and the waiters on an ack are woken once: at the SDK's record
    shape a worker acks tens of thousands of records a second. Never raises for a message acked already.
    """
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    committed_of, index_of, acked_of = consumer._committed_offset, consumer._acked_index, consumer._acked
    unacked = consumer._unacked_messages  # (the raw messages never join it: Faust's conductor adds them)
    n, tp, enabled = 0, None, False
    committed: int | None = None
    index: set[int] | None = None
    acked: list[int] | None = None
    with ack_lock:
        try:
            for message in messages:
                if message.acked:
                    continue
                message.acked = True
                if message.tp is not tp:
                    tp = message.tp
                    enabled = acks_enabled_for(message.topic)
                    if enabled:
                        committed, index, acked = committed_of[tp], None, None
                if not enabled:
                    continue
                offset = message.offset
                if committed is None or offset >= committed:
                    if index is None:  # (looked up as Faust does: only for an offset it may count)
                        index = index_of[tp]
                    if offset not in index:
                        if unacked:
                            unacked.discard(message)
                        index.add(offset)
                        if acked is None:
                            acked = acked_of[tp]
                        acked.append(offset)
                        n += 1
            consumer._n_acked += n
        finally:
            notify(consumer._waiting_for_ack)
    return n


def ack_part(consumer: Any, messages: list[Any]) -> None:
    """Ack ``messages``, a processed prefix of one partition's messages in offset order that its commit
    must pass now, records the gap guard read straight from the broker included (:func:`ack_all`), and
    take their range out of Faust's gap intervals. Faust treats a gap interval as done only once an
    offset past it is acked, and then all of it: the interval's offsets past the prefix stay in it,
    to be committed with the acks of the records that follow them."""
    ack_all(consumer, messages)
    gaps = getattr(consumer, "_gap", None)
    tp = messages[-1].tp
    if gaps is not None and tp in gaps:
        gaps[tp].chop(messages[0].offset, messages[-1].offset + 1)
