"""Typed errors of the producer SDK. Each says what happened and what to do.

Errors about one event are :class:`~rewardflow.events.errors.EventError`
subclasses (``InvalidEvent`` from validation, :class:`RecordTooLarge` here):
that event was not accepted and nothing was sent. Errors about delivery are
:class:`ProducerError` subclasses and carry the producer's counts.
"""

from __future__ import annotations

from collections.abc import Mapping

from rewardflow.client.delivery import ProducerStats
from rewardflow.events.errors import EventError


class RecordTooLarge(EventError):
    """One event alone, framed as a record, exceeds ``max_record_bytes`` (code ``too_large``)."""

    code = "too_large"

    def __init__(self, event_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"event {event_id!r} encodes to a {size}-byte record, over the {limit}-byte limit "
            "(REWARDFLOW_MAX_RECORD_BYTES); shorten its text fields"
        )
        self.size = size
        self.limit = limit


class ProducerError(RuntimeError):
    """Base of delivery-side errors; ``stats`` is a snapshot taken when it was raised."""

    def __init__(self, message: str, stats: ProducerStats) -> None:
        super().__init__(message)
        self.stats = stats


class BufferFull(ProducerError):
    """``max_pending_events`` events are accepted but not yet acknowledged; the new event was NOT accepted.

    Usually the broker is slow or unreachable. Retry the event later, or call
    ``flush()`` to wait for deliveries.
    """


ProducerBackpressure = BufferFull


class UndeliveredEvents(ProducerError):
    """Events failed delivery, or were still unacknowledged when a flush timed out.

    ``failures`` maps each reason (``"_MSG_TIMED_OUT: Local: Message timed out"``
    …) to the number of events it made fail since the previous report;
    ``stats`` holds the cumulative counts.
    """

    def __init__(self, stats: ProducerStats, failures: Mapping[str, int]) -> None:
        parts = []
        if failures:
            reasons = "; ".join(f"{n} x {reason}" for reason, n in sorted(failures.items(), key=lambda kv: -kv[1]))
            parts.append(f"{sum(failures.values())} events failed delivery ({reasons})")
        if stats.pending:
            parts.append(f"{stats.pending} events still undelivered ({stats.buffered} not yet handed to Kafka)")
        super().__init__("; ".join(parts) + f" [sent={stats.sent} failed={stats.failed} pending={stats.pending}]", stats)
        self.failures = dict(failures)


class ProducerClosed(ProducerError):
    """``emit`` was called after ``close()``; the event was not accepted."""
