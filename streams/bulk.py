"""The raw topic's records, taken from Faust's consumer one fetch at a time.

Faust hands each fetched record through its conductor, a channel queue, a stream and an event,
awaiting two tasks a record (``Service.wait_first``): at the SDK's record shape that alone caps a
worker far below its target (``bench/bench_faust_path.py`` times both routes; figures in
``bench/README.md``). :func:`drain` replaces the consumer's fetch loop: the raw
topic's records of each fetch go to the worker as one batch; every other topic's records (the
changelog, during a recovery) take Faust's own route, unchanged. Faust keeps the consumer group,
the subscription (the worker's agent stays subscribed to the raw topic and receives nothing),
the table, its changelog, recovery, flow control and the commits of what is acked.

Contract: ``handle(messages)`` is awaited with each fetch's raw messages (each partition's in
offset order) and acks (``consumer.ack``) what it processed once its outputs are confirmed; the
loop fetches again only after it returns, so nothing else buffers raw records. The read-offset
bookkeeping is Faust's own: a record below its partition's read offset is dropped as read, the
read offset follows each record taken, and an offset gap of an acked topic is registered so a
commit can pass it. An exception in ``handle`` ends the loop and crashes the app, and the worker
exits (:func:`rewardflow_streams.main.exit_on_crash`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Handle = Callable[[list[Any]], Awaitable[None]]
# How long one fetch waits for records. The first fetch after an assignment often returns nothing
# after its whole wait though records arrived meanwhile (the next fetch has them): a short wait
# bounds that delay (bench/README.md, "After an assignment").
FETCH_TIMEOUT_S = 0.2


def install(consumer: Any, raw_topic: str, handle: Handle) -> None:
    """Make ``consumer``'s fetcher run :func:`drain` instead of Faust's loop (before the app starts)."""

    async def fetch_loop(fetcher: Any) -> None:
        await drain(consumer, fetcher, raw_topic, handle)

    consumer._drain_messages = fetch_loop


async def drain(consumer: Any, fetcher: Any, raw_topic: str, handle: Handle) -> None:
    """Fetch until the consumer or the fetcher stops; see the module doc."""
    read = consumer._read_offset
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    try:
        while not (consumer.should_stop or fetcher.should_stop):
            batch: list[Any] = []
            async for tp, message in consumer.getmany(timeout=FETCH_TIMEOUT_S):
                offset, r_offset = message.offset, read[tp]
                if r_offset is not None and offset < r_offset:
                    continue  # read already (Faust's rule)
                if r_offset and offset - r_offset > 1 and acks_enabled_for(message.topic):
                    await consumer._add_gap(tp, r_offset + 1, offset)
                if tp.topic == raw_topic:
                    batch.append(message)
                else:
                    await consumer.wait_first(consumer.callback(message), consumer.suspend_flow.wait())
                read[tp] = offset
            await asyncio.sleep(0)  # a fetch may return at once, again and again: let the loop run
            if batch:
                await handle(batch)
    except consumer.consumer_stopped_errors:
        if not consumer.app.should_stop:
            raise
    except asyncio.CancelledError:
        if not consumer.app.should_stop:
            raise
