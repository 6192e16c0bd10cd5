"""Plain-value configuration of the pure core, derived from :class:`Settings`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from rewardflow.core.recent import Recent

JSON_OPTS = orjson.OPT_NON_STR_KEYS
"""The orjson options state is encoded with (by stores that keep bytes, and by ``put_json`` callers)."""
PRUNE_STEPS = 12
"""Pruning wake-ups per dedup horizon (``JoinConfig.prune_step_ms``): state is kept up to 1/12 longer."""


@dataclass(frozen=True, slots=True)
class JoinConfig:
    """Event-time rules of the turn join (all times in ms unless named ``_s``)."""

    lateness_ms: int = 5_000
    grace_ms: int = 60_000
    horizons_s: tuple[int, ...] = (30, 120, 300, 600, 900)
    provisional: bool = True
    dedup_ms: int = 3_600_000
    tombstone_ms: int = 3_600_000
    window_sizes_s: tuple[int, ...] = (300, 3600)
    max_record_bytes: int = 1_000_000
    max_batch_events: int = 500
    state_cache: int = 4_096  # decoded session states kept between batches, per partition (processor._session)
    state_cache_bytes: int = 32 << 20  # ...and at most so many bytes of their encodings, per partition
    max_clock_skew_ms: int = 30_000  # an event may be dated this far after its record's broker timestamp
    max_session_turns: int = 1_000  # open turns plus finalised turns still remembered, per session
    max_session_events: int = 10_000  # events in those turns, per session
    # an edit dated later than this after its turn's served event is dead-lettered (turn_span_limit): each edit
    # puts off the turn's deadline, and an open served turn holds back the closing of its partition's windows
    max_turn_span_ms: int = 3_600_000
    # a signal for a finalised turn dated at most this long after the turn's deadline corrects it (a new
    # revision of its rewards); later ones are late. 0: off (Settings.correction_window_ms turns it on)
    correction_ms: int = 0
    tick_key: bytes | None = field(default=None, repr=False)  # None: unsigned ticks pass (trusted replays)
    # derived (read per event on the hot path, so computed once)
    final_horizon_ms: int = field(init=False)
    settle_ms: int = field(init=False)  # from a turn's anchor to its final deadline
    keep_done_ms: int = field(init=False)  # tombstones live this long: late routing and window rebuild need them
    # a session wakes up to be pruned on this grid of event time only (wakeups.py), so the seen ids and
    # tombstones that expire within one step go in one wake-up and one state write
    prune_step_ms: int = field(init=False)
    longest_window_ms: int = field(init=False)

    def __post_init__(self) -> None:
        final = self.horizons_s[-1] * 1000
        object.__setattr__(self, "final_horizon_ms", final)
        object.__setattr__(self, "settle_ms", final + self.grace_ms)
        object.__setattr__(self, "longest_window_ms", max(self.window_sizes_s) * 1000)
        object.__setattr__(self, "keep_done_ms", max(self.tombstone_ms, self.longest_window_ms + final + self.grace_ms,
                                                     self.correction_ms + final + self.grace_ms))
        object.__setattr__(self, "prune_step_ms", max(1, min(self.dedup_ms, self.keep_done_ms) // PRUNE_STEPS))

    @classmethod
    def from_settings(cls, s: Any, tick_key: bytes | None = None) -> JoinConfig:
        """The core's rules from :class:`~rewardflow.settings.Settings`; ``tick_key`` is the workers'
        shared key (:func:`rewardflow.settings.tick_key`), None where ticks come from the caller itself."""
        return cls(
            lateness_ms=s.allowed_lateness_ms, grace_ms=s.grace_ms, horizons_s=tuple(s.horizons_s),
            provisional=s.provisional, dedup_ms=s.dedup_horizon_ms, tombstone_ms=s.tombstone_ms,
            window_sizes_s=tuple(s.window_sizes_s), max_record_bytes=s.max_record_bytes,
            max_batch_events=s.max_batch_events,
            state_cache=max(64, s.worker_state_cache // max(1, s.partitions)),
            state_cache_bytes=max(1 << 20, (s.worker_state_cache_mb << 20) // max(1, s.partitions)),
            max_clock_skew_ms=s.max_clock_skew_ms, max_session_turns=s.max_session_turns,
            max_session_events=s.max_session_events, max_turn_span_ms=s.max_turn_span_ms,
            correction_ms=s.correction_window_ms, tick_key=tick_key,
        )


class StateStore(Protocol):
    """Key → JSON-able value, as the processor sees its state.

    The stream shell backs it with a changelog-backed Faust Table; replay and
    tests use a dict. Writes must reach the changelog in call order.

    A store that keeps encoded bytes may also offer ``put_json(key, value, data)``:
    ``put`` of ``value`` whose encoding ``data`` (``orjson.dumps(value, option=JSON_OPTS)``,
    exactly) the caller already has. The processor uses it for session states, which keep
    the encodings of their unchanged parts between writes.
    """

    def get(self, key: str) -> Any | None: ...

    def put(self, key: str, value: Any) -> None: ...

    def delete(self, key: str) -> None: ...

    def items(self) -> Any: ...


@dataclass
class DictStore:
    """In-memory :class:`StateStore` (replay, tests). Records write order for inspection."""

    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any | None:
        return self.data.get(key)

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def items(self) -> Any:
        return list(self.data.items())


class DecodedCache:
    """The values last written under the ``size`` most recently written keys of a store that keeps
    encoded bytes, beside those bytes: reading a key back gives the very value written while the
    store still holds those very bytes (replaced bytes, by a changelog recovery say, are decoded).

    With ``max_bytes``, the kept values' encodings also total at most that many bytes (the newest
    is kept whatever its size): a decoded value takes several times its bytes, so a count alone
    does not bound the memory when values are large.
    """

    def __init__(self, size: int, max_bytes: int | None = None) -> None:
        self._kept: Recent[tuple[bytes, Any]] = Recent(size, max_bytes)
        self.reads = self.decodes = 0  # (counters for metrics)

    @property
    def held_bytes(self) -> int:
        """The kept values' encodings."""
        return self._kept.bytes

    def read(self, key: str, raw: bytes) -> Any:
        """The value of ``raw``, the bytes the store now holds under ``key``."""
        self.reads += 1
        hit = self._kept.get(key)
        if hit is not None and hit[0] is raw:
            return hit[1]
        self.decodes += 1
        return orjson.loads(raw)

    def keep(self, key: str, data: bytes, value: Any) -> None:
        self._kept.put(key, (data, value), len(data))

    def drop(self, key: str) -> None:
        self._kept.pop(key)

    def clear(self) -> None:
        """Forget every kept value (the counters stay)."""
        self._kept.clear()


class EncodedStore:
    """A :class:`StateStore` of encoded values, as the worker's table keeps them (replay checks, tests).

    ``get`` returns the very value last put while it is among the ``cached`` most recently
    written (a :class:`DecodedCache`, as the worker's table has), else a fresh decode of the
    stored bytes. With ``check``, ``put_json`` raises ``AssertionError`` when the caller's bytes
    are not exactly ``orjson.dumps(value, option=JSON_OPTS)``. ``records`` and ``written`` count
    what a changelog behind it would carry: a record per write (none for the bytes the key holds
    already) and per delete of a stored key, and the bytes written.
    """

    def __init__(self, cached: int = 256, check: bool = True, cached_bytes: int | None = None) -> None:
        self.data: dict[str, bytes] = {}
        self._decoded = DecodedCache(cached, cached_bytes)
        self.check, self.put_json_calls = check, 0
        self.records = self.written = 0

    def get(self, key: str) -> Any | None:
        raw = self.data.get(key)
        return None if raw is None else self._decoded.read(key, raw)

    def put(self, key: str, value: Any) -> None:
        data = orjson.dumps(value, option=JSON_OPTS)
        self.data[key] = data
        self._decoded.keep(key, data, value)
        self.records += 1
        self.written += len(data)

    def put_json(self, key: str, value: Any, data: bytes) -> None:
        if self.check and data != orjson.dumps(value, option=JSON_OPTS):
            raise AssertionError(f"put_json bytes of {key!r} are not orjson.dumps of its value")
        self.put_json_calls += 1
        stored = self.data.get(key)
        if stored != data:  # (the worker's table writes nothing for the same bytes again)
            self.data[key] = stored = data
            self.records += 1
            self.written += len(data)
        self._decoded.keep(key, stored, value)

    def delete(self, key: str) -> None:
        if self.data.pop(key, None) is not None:
            self.records += 1
        self._decoded.drop(key)

    def forget(self) -> None:
        """Drop the decoded values: every ``get`` decodes the stored bytes afresh (a batch's rollback)."""
        self._decoded.clear()

    def items(self) -> Any:
        return [(k, orjson.loads(v)) for k, v in self.data.items()]
