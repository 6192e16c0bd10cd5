"""Exponential backoff without sleeping: the caller keeps polling Kafka while it waits."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Backoff:
    """Delays ``initial * factor**n`` capped at ``maximum``; :meth:`due` says when to try again."""

    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    attempts: int = 0
    next_at: float = 0.0

    def failed(self, now: float | None = None) -> float:
        """Record a failure; returns the delay before the next attempt."""
        delay = min(self.maximum, self.initial * self.factor**self.attempts)
        self.attempts += 1
        self.next_at = (time.monotonic() if now is None else now) + delay
        return delay

    def succeeded(self) -> None:
        """Reset after a success."""
        self.attempts = 0
        self.next_at = 0.0

    def due(self, now: float | None = None) -> bool:
        """True when no failure is pending or its delay has passed."""
        return (time.monotonic() if now is None else now) >= self.next_at
