"""Delivery accounting: what the broker acknowledged, what failed and why.

librdkafka reports each record's fate to a callback, run by whichever thread
calls ``poll()`` / ``flush()`` on the Kafka producer. :class:`DeliveryLedger`
turns those reports into event counts. Its counters only grow, and every
accepted event ends up counted exactly once as ``sent`` or ``failed``; until
then it is ``pending``.

Contract: callbacks are thread-safe (one lock, held for a few additions).
Each failure reason is logged once at WARNING; all are counted.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """Event counts of one producer. ``accepted == sent + failed + pending`` always holds."""

    accepted: int = 0
    """Events ``emit()`` accepted (validated, encoded, buffered)."""
    sent: int = 0
    """Events in records the broker acknowledged (acks=all)."""
    failed: int = 0
    """Events in records whose delivery failed for good; reasons in ``failures``."""
    pending: int = 0
    """Accepted, neither sent nor failed: buffered in the SDK or in flight."""
    buffered: int = 0
    """Part of ``pending`` still in the SDK's session batches (not yet handed to Kafka)."""
    records: int = 0
    """Records (session batches) acknowledged."""
    failures: Mapping[str, int] = field(default_factory=dict)
    """Failed events by reason, cumulative."""


def reason_of(err: Any) -> str:
    """``NAME: description`` of a ``KafkaError`` (or ``str()`` of anything else)."""
    name = getattr(err, "name", None)
    text = getattr(err, "str", None)
    if callable(name) and callable(text):
        return f"{name()}: {text()}"
    return str(err)


class DeliveryLedger:
    """Counts acknowledged and failed events from delivery reports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self.done = 0
        """Events with a final outcome (sent + failed); a plain attribute, read on every emit."""
        self.records = 0
        self._failures: Counter[str] = Counter()
        self._unreported: Counter[str] = Counter()

    def callback(self, events: int) -> Callable[[Any, Any], None]:
        """The ``on_delivery`` callback of one record carrying ``events`` events."""
        return functools.partial(self._report, events)

    def _report(self, events: int, err: Any, _msg: Any) -> None:
        if err is None:
            with self._lock:
                self.sent += events
                self.done += events
                self.records += 1
        else:
            self.fail(events, reason_of(err))

    def fail(self, events: int, reason: str) -> None:
        """Count ``events`` as failed for ``reason`` (also used when ``produce()`` itself refuses)."""
        with self._lock:
            first = reason not in self._failures
            self.failed += events
            self.done += events
            self._failures[reason] += events
            self._unreported[reason] += events
        if first:
            log.warning("event delivery failed: %s (further failures with this reason are counted, not logged)", reason)

    def snapshot(self) -> tuple[int, int, int, dict[str, int]]:
        """``(sent, failed, records, failures)``, read together."""
        with self._lock:
            return self.sent, self.failed, self.records, dict(self._failures)

    def take_unreported(self) -> dict[str, int]:
        """Failures since the previous call, by reason; resets them."""
        with self._lock:
            out = dict(self._unreported)
            self._unreported.clear()
            return out
