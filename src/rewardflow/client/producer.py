"""``EventProducer``: validated events in, session batch records out, every outcome counted.

Route of one event: ``emit`` validates it (a dict) or trusts it (a model), encodes
it once, appends it to its session's open batch, and returns. A batch goes to
Kafka (key ``session_id``, header ``rf-format``) when it is full, would
exceed ``max_record_bytes``, or is ``max_delay_ms`` old; a background thread
(the *pump*) serves librdkafka's delivery reports and sends the old ones, or,
when an emitting thread holds the lock, flags them for that thread to send
on its next ``emit`` (the pump never waits for the emit path's lock).

Cost per event on the hot path: one encoder call outside the lock (fastavro
or orjson), one dict lookup and a list append under it. Per record: one
``produce`` and one delivery callback. Pending events are bounded without reading the delivery ledger per
event (a limit refreshed when reached).

Guarantees:

* Nothing is sent for an event that fails validation or is too large; it is
  rejected by an exception from ``emit``.
* Each accepted event is eventually counted once as sent or failed; until then
  it is pending. ``stats`` always tells the numbers; nothing is dropped silently.
* Order: the events of one session reach the topic in ``emit`` order (batches
  of a session are produced in order; idempotence keeps it across retries),
  provided one thread emits a given session's events.
* ``emit`` never blocks on the network. It blocks up to ``block_timeout_s``
  only when ``max_pending_events`` are pending, then raises ``BufferFull``.

Thread safety: every method may be called from any thread.
"""

from __future__ import annotations

import atexit
import logging
import struct
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, cast

from confluent_kafka import Producer

from rewardflow.client.batching import SessionBatcher
from rewardflow.client.config import ProducerConfig
from rewardflow.client.delivery import DeliveryLedger, ProducerStats
from rewardflow.client.encoding import encoder_for
from rewardflow.client.errors import BufferFull, ProducerClosed, UndeliveredEvents
from rewardflow.client.events_in import TRUSTED, as_model, unencodable
from rewardflow.client.handoff import KafkaHandoff
from rewardflow.client.pump import Pump
from rewardflow.events.models import Envelope
from rewardflow.settings import Settings, load_settings

log = logging.getLogger(__name__)


class EmitState:
    """Counts and flags of the emit path, changed under the producer's lock (except ``due``)."""

    __slots__ = ("accepted", "limit", "closed", "due")

    def __init__(self, limit: int) -> None:
        self.accepted = 0
        self.limit = limit
        """``emit`` accepts while ``accepted < limit``: ``done + max_pending_events``, refreshed lazily."""
        self.closed = False
        self.due = False
        """Set by the pump: batches may be past their delay; whoever holds the lock next sends them."""


class EventProducer:
    """Send rewardflow events to Kafka in per-session batch records.

    ``EventProducer(settings, config)``; both optional (``load_settings()`` and
    ``ProducerConfig()``). Use it as a context manager, or call ``close()``.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        config: ProducerConfig | None = None,
        *,
        kafka_factory: Callable[[dict[str, Any]], Any] = Producer,
    ) -> None:
        """Connects lazily (librdkafka in the background); raises ``ValueError`` for a bad config.

        ``kafka_factory`` builds the Kafka producer from the librdkafka config
        (a seam for tests; anything with confluent-kafka's ``produce``/``poll``/``flush``).
        """
        self.settings = settings or load_settings()
        self.config = (config or ProducerConfig()).resolve(self.settings)
        cfg = self.config
        self._encoder = encoder_for(cfg.wire_format)
        self._lock = threading.Lock()
        self._batcher = SessionBatcher(self._encoder, cfg.max_events, cfg.max_record_bytes, cfg.max_delay_s)
        self._writers, self._open, self._sep = self._encoder.writers, self._batcher.open, len(self._encoder.separator)
        self._ledger = DeliveryLedger()
        self._kafka = kafka_factory(cfg.kafka)
        self._handoff = KafkaHandoff(self._kafka, cfg.topic, self._encoder, self._ledger)
        self._ship = self._handoff.ship
        self._state = EmitState(cfg.max_pending_events)
        self._pump = Pump(self._kafka, self._tick, interval_s=min(0.05, max(0.001, cfg.max_delay_s / 4)))
        atexit.register(self._at_exit)

    # --- the hot path -------------------------------------------------------------

    def emit(self, event: Envelope | Mapping[str, Any]) -> None:
        """Accept one event (a model, trusted as validated, or a dict, validated here).

        Raises ``InvalidEvent`` (field and reason named) or ``RecordTooLarge``
        before anything is buffered; ``BufferFull`` when ``max_pending_events``
        stay pending for ``block_timeout_s``; ``ProducerClosed`` after close().
        """
        state = self._state
        if state.closed:
            raise ProducerClosed("emit() after close()", self.stats)
        model = cast(Envelope, event) if type(event) in TRUSTED else as_model(event)
        fields: dict[str, Any] = model.__dict__  # pydantic's attribute access is slow on this path
        try:  # encoding is pure: done outside the lock
            piece = self._writers[fields["event_type"]](fields)
        except (ValueError, TypeError, OverflowError, KeyError, IndexError, AttributeError, struct.error) as exc:
            raise unencodable(model, exc) from None
        if state.accepted >= state.limit:
            self._wait_for_room()
        with self._lock:
            if state.closed:  # (close() may have run meanwhile)
                raise ProducerClosed("emit() after close()", self.stats)
            if state.due:
                self._send_due()
            batch = self._open.get(fields["session_id"])
            size = len(piece) + self._sep
            if batch is not None and batch.room >= size:  # the common case: append (SessionBatcher's contract)
                batch.pieces.append(piece)
                batch.room -= size
                batch.left -= 1
                state.accepted += 1
                if not batch.left:
                    self._ship(self._batcher.close(batch))
                return
            closed = self._batcher.add(fields["session_id"], fields["event_id"], piece)  # may raise RecordTooLarge
            state.accepted += 1
            for batch in closed:
                self._ship(batch)

    def _tick(self) -> None:
        """Pump callback: flag that batches may be due; send them now unless another thread holds the lock.

        Never waits for the lock: an emitting thread that holds it sends the
        due batches itself on its next ``emit`` (it sees ``state.due``).
        """
        self._state.due = True
        if self._lock.acquire(blocking=False):
            try:
                self._send_due()
            finally:
                self._lock.release()

    def _send_due(self) -> None:
        """Under the lock: retry refused batches, send batches past their delay."""
        self._state.due = False
        self._handoff.retry()
        for batch in self._batcher.expired():
            self._ship(batch)

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + self.config.block_timeout_s
        max_pending = self.config.max_pending_events
        state = self._state
        while True:
            self._kafka.poll(0)
            state.limit = self._ledger.done + max_pending
            if state.accepted < state.limit:
                return
            if time.monotonic() >= deadline:
                raise BufferFull(
                    f"{state.accepted - self._ledger.done} events are pending (max_pending_events={max_pending}); "
                    f"is the broker at {self.config.bootstrap} reachable? The event was not accepted: "
                    "retry it later or call flush()", self.stats)
            with self._lock:
                self._send_due()
            self._kafka.poll(min(0.05, max(0.0, deadline - time.monotonic())))

    # --- accounting, flush, lifecycle -------------------------------------------------

    @property
    def stats(self) -> ProducerStats:
        """A consistent snapshot of the counts (``accepted == sent + failed + pending``)."""
        with self._lock:  # delivery callbacks never take this lock, so the ledger can be read inside it
            accepted, buffered = self._state.accepted, self._batcher.buffered + self._handoff.waiting_events
            sent, failed, records, failures = self._ledger.snapshot()
        return ProducerStats(accepted, sent, failed, accepted - sent - failed, buffered, records, failures)

    def flush(self, timeout: float | None = None) -> ProducerStats:
        """Send every open batch and block until all accepted events are acknowledged or ``timeout`` s pass.

        Returns the stats when nothing is pending and no delivery failed since
        the previous report; otherwise raises ``UndeliveredEvents`` with the
        new failures by reason and the counts (then the failures count as
        reported). ``timeout=None`` waits as long as delivery may take
        (``delivery_timeout_ms`` at most). Events other threads emit while it
        runs may still be pending at its end, and make it raise.
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float:  # librdkafka's convention: -1 waits without limit
            return -1.0 if deadline is None else max(0.0, deadline - time.monotonic())

        with self._lock:
            for batch in self._batcher.drain():
                self._ship(batch)
        while True:
            with self._lock:
                if self._handoff.retry():
                    break
            if left() == 0.0:
                break
            self._kafka.poll(0.05 if left() < 0 else min(0.05, left()))
        self._kafka.flush(left())
        stats = self.stats
        failures = self._ledger.take_unreported()
        if failures or stats.pending:
            raise UndeliveredEvents(stats, failures)
        return stats

    def close(self, timeout: float | None = None) -> ProducerStats:
        """Refuse further emits, flush (``timeout`` defaults to ``close_timeout_s``), stop the pump.

        Raises like :meth:`flush`; the pump stops either way. Closing twice is a no-op.
        """
        with self._lock:
            already, self._state.closed = self._state.closed, True
        if already:
            return self.stats
        try:
            return self.flush(self.config.close_timeout_s if timeout is None else timeout)
        finally:
            self._pump.stop()
            atexit.unregister(self._at_exit)

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Close; raise ``UndeliveredEvents`` if events remain undelivered, unless already unwinding an error."""
        try:
            self.close()
        except UndeliveredEvents as err:
            if exc is None:
                raise
            exc.add_note(f"rewardflow EventProducer: {err}")

    def _at_exit(self) -> None:
        try:
            self.close()
        except UndeliveredEvents as err:
            log.error("interpreter exit with undelivered events: %s", err)
