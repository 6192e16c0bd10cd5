"""The edge's per-key rate limit and its Prometheus metrics.

Contract: :class:`RateLimiter` is thread-safe and never blocks; :class:`EdgeMetrics` keeps its own
registry, so several collectors in one process (tests) do not share counters.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

from rewardflow.events.models import EVENT_MODELS

_FIELDS = frozenset({"<event>", "event_type"} | {f for m in EVENT_MODELS.values() for f in m.model_fields})


def contract_field(name: str) -> str:
    """``name`` when it is a field of the contract, else ``other``: a client names any field it likes,
    and only the contract's become metric labels."""
    return name if name in _FIELDS else "other"


class RateLimiter:
    """A token bucket of events per key: ``rate`` per second, up to ``burst`` at once. Thread-safe."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, n: int, now: float | None = None) -> float:
        """Take ``n`` events' worth; returns 0 when allowed, else the seconds until they would be
        (``inf`` when ``n`` is over the burst and never will be)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            level, at = self._buckets.get(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - at) * self.rate)
            if n > level:
                self._buckets[key] = (level, now)
                return (n - level) / self.rate if n <= self.burst else math.inf
            self._buckets[key] = (level - n, now)
            return 0.0

    def give_back(self, key: str, n: int) -> None:
        """Return ``n`` taken by a request refused afterwards for another reason (never above the burst)."""
        with self._lock:
            level, at = self._buckets.get(key, (float(self.burst), time.monotonic()))
            self._buckets[key] = (min(float(self.burst), level + n), at)


class SessionGate:
    """How fast each key may open sessions: a token bucket of *new* session ids per key (``rate`` per second,
    up to ``burst`` at once), beside its event rate. Thread-safe; never blocks.

    Why: the workers keep a session's state (its seen event ids, turns and tombstones) for the dedup horizon,
    and a session holding one event costs them as much as a dozen further events of one session. Without
    this gate, one key could open a session an event at its whole event rate. A session counts as new
    unless it is among the last ``remembered`` the key sent (an older one counts again, at worst).
    """

    def __init__(self, rate: float, burst: int, remembered: int = 50_000) -> None:
        self.remembered = remembered
        self._buckets = RateLimiter(rate, burst)
        self._seen: dict[str, OrderedDict[str, None]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, sessions: Iterable[str], now: float | None = None) -> float:
        """Admit the sessions of one request: 0 when allowed (they are remembered), else the seconds until
        its new ones would be (``inf`` when more than ``burst`` at once)."""
        ids = list(dict.fromkeys(sessions))
        with self._lock:
            seen = self._seen.setdefault(key, OrderedDict())
            new = sum(1 for s in ids if s not in seen)
            wait = self._buckets.take(key, new, now) if new else 0.0
            if wait:
                return wait
            for s in ids:
                seen[s] = None
                seen.move_to_end(s)
            while len(seen) > self.remembered:
                seen.popitem(last=False)
            return 0.0


def retry_after(wait_s: float) -> str:
    """A ``Retry-After`` value for a wait from :meth:`RateLimiter.take`: whole seconds, at least 1."""
    return "60" if math.isinf(wait_s) else str(max(1, math.ceil(wait_s)))


class EdgeMetrics:
    """Prometheus metrics of one collector, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("rewardflow_collect_requests", "Requests by status.", ["status"], registry=self.registry)
        self.events = Counter("rewardflow_collect_events", "Events by outcome (accepted, or the reason refused).",
                              ["outcome"], registry=self.registry)
        self.redacted = Counter("rewardflow_collect_redacted", "Secret-looking tokens scrubbed from free text, by kind "
                                "(kind cut: texts cut to their schema limit once scrubbed).",
                                ["kind"], registry=self.registry)
        self.spans = Counter("rewardflow_collect_spans", "OTLP spans by outcome (mapped, or the reason not).",
                             ["outcome"], registry=self.registry)
        self.ack = Histogram("rewardflow_collect_kafka_ack_seconds", "Time until Kafka acknowledged a request's records.",
                             registry=self.registry, buckets=(.002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10))
