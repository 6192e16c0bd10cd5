"""The worker's output path: a confluent-kafka producer for output rows and changelog writes.

Why not Faust's producer: it is aiokafka, pure Python on the worker's event loop.
Profiled on the stream benchmark, its per-message bookkeeping, lz4 compression and
waits for a full buffer took about a third of the worker's time. librdkafka batches,
compresses and sends in its own threads, outside the GIL, so that work overlaps the
core's processing on a second core.

Contract:

* :meth:`OutputSender.send` queues one record and returns at once. It blocks only when
  librdkafka's local queue is full (``queue.buffering.max.kbytes``), serving delivery
  reports until there is room. It raises :class:`SendFailed` for a record the producer
  refuses outright (too large, unknown topic).
* :meth:`OutputSender.mark` ends a batch: the records queued since the last mark belong to
  it, and it returns the batch's number.
* :meth:`OutputSender.confirm` waits (off the event loop) until every record queued so far,
  or every record of the batches up to a given mark, is acknowledged by the broker
  (``acks=all``), however long the broker is unreachable (logging a warning every 30 s), and
  raises :class:`SendFailed` naming the first record that failed for good (refused, or
  undelivered after ``message.timeout.ms``). The worker awaits it before Faust may ack a
  batch, so a committed source offset implies its outputs and state writes are in Kafka;
  that is the guarantee Faust's own flush-before-commit gave. Records queued after the mark
  do not delay a batch's confirmation, so the next batch is processed while it is pending.
* :func:`chunks` splits rows into orjson records of at most a size limit, in order.
* Order: records to one partition keep their send order (idempotent producer, so
  retries neither reorder nor duplicate them). That is what the changelog needs: a
  delete after a put of the same key stays after it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer


log = logging.getLogger("rewardflow.streams")


class SendFailed(RuntimeError):
    """An output or changelog record was refused or not acknowledged."""


class OutputSender:
    """One idempotent librdkafka producer; see the module doc for the contract."""

    def __init__(self, client_config: dict[str, Any], *, max_message_bytes: int, client_id: str) -> None:
        """Connects lazily: the librdkafka producer is made at the first :meth:`send`."""
        self._config = {
            **client_config,
            "client.id": client_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_048_576,
            "compression.type": "lz4",
            "message.max.bytes": max_message_bytes + 65_536,
            "queue.buffering.max.kbytes": 262_144,
        }
        self._producer_: Any = None
        self._lock = threading.Lock()
        self._failure: str | None = None
        self._batch = _Batch(0, self._lock)  # the batch being queued
        self._open: dict[int, _Batch] = {}  # marked batches not fully delivered yet, by number

    @property
    def _producer(self) -> Any:
        if self._producer_ is None:
            self._producer_ = Producer(self._config)
        return self._producer_

    def send(self, topic: str, value: bytes | None, key: bytes | None, partition: int | None = None) -> None:
        """Queue one record (see the module doc); a refused record raises :class:`SendFailed`."""
        batch = self._batch
        kwargs: dict[str, Any] = {"on_delivery": batch.delivered}
        if partition is not None:
            kwargs["partition"] = partition
        with self._lock:  # counted before the produce: its report may come at once, in another thread
            batch.pending += 1
        while True:
            try:
                self._producer.produce(topic, value, key, **kwargs)
                break
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                with self._lock:
                    batch.pending -= 1
                raise SendFailed(f"{topic}: {exc.args[0]}") from exc
        self._producer.poll(0)

    def send_rows(self, topic: str, rows: list[Any], limit: int, key: bytes | None, *, str_keys: bool = False) -> None:
        """Queue ``rows`` as orjson records of at most ``limit`` bytes (:func:`chunks`), in order.
        ``str_keys``: the rows' maps are expected to have string keys only, which encode twice as fast
        (a row that has others is encoded with them all the same)."""
        try:
            values = list(chunks(rows, limit, 0 if str_keys else orjson.OPT_NON_STR_KEYS))
        except orjson.JSONEncodeError:
            values = list(chunks(rows, limit, orjson.OPT_NON_STR_KEYS))
        for value in values:
            self.send(topic, value, key)

    def mark(self) -> int:
        """End the batch being queued and return its number (see :meth:`confirm`)."""
        with self._lock:
            done = self._batch
            if done.pending:
                self._open[done.number] = done
            self._batch = _Batch(done.number + 1, self._lock)
        return done.number

    @property
    def pending(self) -> int:
        """Records queued and not acknowledged yet."""
        return self._undelivered(None)

    def _undelivered(self, upto: int | None) -> int:
        """Records of the batches up to ``upto`` (None: of all) without a delivery report; notes a failure."""
        with self._lock:
            batches = (*self._open.values(), self._batch)
            if self._failure is None:
                self._failure = next((b.failure for b in batches if b.failure), None)
            left = sum(b.pending for b in batches if upto is None or b.number <= upto)
            for number in [n for n, b in self._open.items() if not b.pending]:
                del self._open[number]
            return left

    async def confirm(self, upto: int | None = None, warn_every_s: float = 30.0) -> None:
        """Wait until everything sent so far (``upto`` None), or every record of the batches
        numbered up to ``upto`` (:meth:`mark`), is acknowledged; raise :class:`SendFailed` if a
        record failed.

        While the broker is unreachable this keeps waiting (librdkafka retries) and logs a warning
        every ``warn_every_s``; a record fails for good only after ``message.timeout.ms`` (5 min),
        and then this raises.
        """
        waited, step = 0.0, 5.0
        while self._undelivered(upto) and self._failure is None:
            if upto is None:
                await asyncio.to_thread(self._producer.flush, step)
            else:  # serve delivery reports until this batch's are in (later batches' may stay pending)
                await asyncio.to_thread(self._serve_until, upto, step)
            left = self._undelivered(upto)
            if left and self._failure is None:
                waited += step
                if waited % warn_every_s < step:
                    log.warning("%d output/state records not acknowledged after %.0f s; is the broker "
                                "reachable? (the batch is not committed until they are)", left, waited)
        if self._failure is not None:
            raise SendFailed(self._failure)

    def _serve_until(self, upto: int, timeout_s: float) -> None:
        """Serve delivery reports (blocking) until the batches up to ``upto`` are delivered, or for ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while self._undelivered(upto) and self._failure is None and time.monotonic() < end:
            self._producer.poll(0.05)

    def close(self, timeout_s: float = 10.0) -> int:
        """Flush what is queued; returns the number of records still undelivered."""
        return 0 if self._producer_ is None else int(self._producer_.flush(timeout_s))


class _Batch:
    """The records of one batch still waiting for their delivery report."""

    __slots__ = ("number", "pending", "failure", "_lock")

    def __init__(self, number: int, lock: threading.Lock) -> None:
        self.number = number
        self.pending = 0
        self.failure: str | None = None
        self._lock = lock

    def delivered(self, err: KafkaError | None, msg: Any) -> None:
        """librdkafka's delivery callback (in whichever thread serves the reports)."""
        with self._lock:
            self.pending -= 1
            if err is not None and self.failure is None:
                self.failure = f"{msg.topic()}[{msg.partition()}]: {err.str()}"


def chunks(rows: list[Any], limit: int, option: int = 0) -> Iterator[bytes]:
    """orjson lists of ``rows``, each at most ``limit`` bytes (a lone larger row goes alone), in order.

    One record can settle thousands of turns (a tick); a single output record of them all would
    exceed the producer's max request size and the broker's max message size. A batch's rows
    are tens of MB, so encoding them twice would cost as much as half the core: the chunk count
    is estimated from a sample of rows, and only a chunk that still comes out too large is
    split again.
    """
    if not rows:
        return
    sample = orjson.dumps(rows[:64], option=option)
    estimate = len(sample) * len(rows) / min(len(rows), 64)
    n = max(1, -(-int(estimate * 1.25) // limit))
    step = -(-len(rows) // n)
    for start in range(0, len(rows), step):
        part = rows[start:start + step]
        value = orjson.dumps(part, option=option)
        if len(value) <= limit or len(part) == 1:
            yield value
        else:
            half = len(part) // 2
            yield from chunks(part[:half], limit, option)
            yield from chunks(part[half:], limit, option)
