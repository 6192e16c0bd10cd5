"""``EventProducer``: validated events in, session batch records out, every outcome counted.

Route of one event: ``emit`` validates it (a dict) or trusts it (a model), encodes
it once, appends it to its session's open batch, and returns. A batch goes to
Kafka (key ``session_id``, header ``rf-format``) when it is full, would
exceed ``max_record_bytes``, or is ``max_delay_ms`` old; a background thread
(the *pump*) sends the old ones and serves librdkafka's delivery reports.

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
from typing import Any

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
        self._encoder = encoder_for(cfg.wire_format, avro_writer=cfg.avro_writer)
        self._batcher = SessionBatcher(self._encoder, cfg.max_events, cfg.max_record_bytes, cfg.max_delay_s)
        self._writers, self._add, self._max_pending = self._encoder.writers, self._batcher.add, cfg.max_pending_events
        self._ledger = DeliveryLedger()
        self._kafka = kafka_factory(cfg.kafka)
        self._handoff = KafkaHandoff(self._kafka, cfg.topic, self._encoder, self._ledger)
        self._ship = self._handoff.ship
        self._lock = threading.Lock()
        self._accepted = 0
        self._closed = False
        self._pump = Pump(self._kafka, self._tick, interval_s=min(0.05, max(0.001, cfg.max_delay_s / 4)))
        atexit.register(self._at_exit)

    # --- the hot path -------------------------------------------------------------

    def emit(self, event: Envelope | Mapping[str, Any]) -> None:
        """Accept one event (a model, trusted as validated, or a dict, validated here).

        Raises ``InvalidEvent`` (field and reason named) or ``RecordTooLarge``
        before anything is buffered; ``BufferFull`` when ``max_pending_events``
        stay pending for ``block_timeout_s``; ``ProducerClosed`` after close().
        """
        if self._closed:
            raise ProducerClosed("emit() after close()", self.stats)
        model = event if type(event) in TRUSTED else as_model(event)
        fields: dict[str, Any] = model.__dict__  # pydantic's attribute access is slow on this path
        if self._accepted - self._ledger.done >= self._max_pending:
            self._wait_for_room()
        with self._lock:
            if not self._closed:  # (close() may have run while this thread waited for room)
                try:
                    piece = self._writers[fields["event_type"]](fields)
                except (ValueError, TypeError, struct.error) as exc:
                    raise unencodable(model, exc) from None  # type: ignore[arg-type]
                closed = self._add(fields["session_id"], fields["event_id"], piece)
                self._accepted += 1
                for batch in closed:
                    self._ship(batch)
                return
        raise ProducerClosed("emit() after close()", self.stats)

    def _tick(self) -> None:
        """Pump callback: send batches past their delay and retry refused ones."""
        with self._lock:
            self._handoff.retry()
            for batch in self._batcher.expired():
                self._ship(batch)

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + self.config.block_timeout_s
        while True:
            self._kafka.poll(0)
            pending = self._accepted - self._ledger.done
            if pending < self.config.max_pending_events:
                return
            if time.monotonic() >= deadline:
                raise BufferFull(
                    f"{pending} events are pending (max_pending_events={self.config.max_pending_events}); "
                    f"is the broker at {self.config.bootstrap} reachable? The event was not accepted: "
                    "retry it later or call flush()", self.stats)
            self._tick()
            self._kafka.poll(min(0.05, max(0.0, deadline - time.monotonic())))

    # --- accounting, flush, lifecycle -------------------------------------------------

    @property
    def stats(self) -> ProducerStats:
        """A consistent snapshot of the counts (``accepted == sent + failed + pending``)."""
        with self._lock:  # delivery callbacks never take this lock, so the ledger can be read inside it
            accepted, buffered = self._accepted, self._batcher.buffered + self._handoff.waiting_events
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
            already, self._closed = self._closed, True
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
