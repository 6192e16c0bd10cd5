"""Plain-value configuration of the pure core, derived from :class:`Settings`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


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
    # derived (read per event on the hot path, so computed once)
    final_horizon_ms: int = field(init=False)
    settle_ms: int = field(init=False)  # from a turn's anchor to its final deadline
    keep_done_ms: int = field(init=False)  # tombstones live this long: late routing and window rebuild need them

    def __post_init__(self) -> None:
        final = self.horizons_s[-1] * 1000
        object.__setattr__(self, "final_horizon_ms", final)
        object.__setattr__(self, "settle_ms", final + self.grace_ms)
        object.__setattr__(self, "keep_done_ms", max(self.tombstone_ms, max(self.window_sizes_s) * 1000 + final + self.grace_ms))

    @classmethod
    def from_settings(cls, s: Any) -> JoinConfig:
        return cls(
            lateness_ms=s.allowed_lateness_ms, grace_ms=s.grace_ms, horizons_s=tuple(s.horizons_s),
            provisional=s.provisional, dedup_ms=s.dedup_horizon_ms, tombstone_ms=s.tombstone_ms,
            window_sizes_s=tuple(s.window_sizes_s), max_record_bytes=s.max_record_bytes,
            max_batch_events=s.max_batch_events,
        )


class StateStore(Protocol):
    """Key → JSON-able value, as the processor sees its state.

    The stream shell backs it with a changelog-backed Faust Table; replay and
    tests use a dict. Writes must reach the changelog in call order.
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
