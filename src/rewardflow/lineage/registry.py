"""The checkpoint registry as data: checkpoints, their generations, and the rules of a registration.

A checkpoint is registered with its parent (``''`` for a root) and the time it started serving.
Its generation is 0 for a root and its parent's + 1; the parent must be registered first, so the
lineage is a forest and a cycle cannot be written. A checkpoint's lineage never changes:
registering an id again with the same parent and deployment time does nothing, with another one
is refused (:class:`LineageError`). The lag of a checkpoint is the highest registered generation
minus its own: 0 for the newest generation.

Contract: pure and deterministic; every refusal is a :class:`LineageError` whose message names
the checkpoint and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

_ID = re.compile(r"^[^\x00-\x1f\x7f]{1,128}$")
_MIN_MS = 10**11  # 1973-03-03: smaller epoch values are seconds given for milliseconds
_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_NOTE_CHARS = 1_024


class LineageError(ValueError):
    """A registration the registry refuses (bad id or time, unknown parent, changed lineage)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One registered checkpoint. ``registered_at`` is the server's time of the registration ('' before it)."""

    checkpoint_id: str
    parent_id: str
    generation: int
    deployed_at_ms: int
    note: str = ""
    registered_at: str = ""

    def same_lineage(self, other: Checkpoint) -> bool:
        """Same id, parent and deployment time (the note and registration time may differ)."""
        return (self.checkpoint_id, self.parent_id, self.deployed_at_ms) == (
            other.checkpoint_id, other.parent_id, other.deployed_at_ms)


@dataclass(frozen=True)
class Registry:
    """A snapshot of the registered checkpoints, by id."""

    checkpoints: Mapping[str, Checkpoint] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> Registry:
        """From rows with the ``checkpoints`` columns; the first row of an id is its registration."""
        found: dict[str, Checkpoint] = {}
        for r in rows:
            found.setdefault(str(r["checkpoint_id"]), Checkpoint(
                str(r["checkpoint_id"]), str(r["parent_id"]), int(r["generation"]), int(r["deployed_at_ms"]),
                str(r.get("note") or ""), str(r.get("registered_at") or "")))
        return cls(found)

    def get(self, checkpoint_id: str) -> Checkpoint | None:
        return self.checkpoints.get(checkpoint_id)

    def ordered(self) -> list[Checkpoint]:
        """Every checkpoint by generation, then deployment time, then id."""
        return sorted(self.checkpoints.values(), key=lambda c: (c.generation, c.deployed_at_ms, c.checkpoint_id))

    @property
    def newest_generation(self) -> int | None:
        """The highest registered generation; None for an empty registry."""
        return max((c.generation for c in self.checkpoints.values()), default=None)

    def lag(self, checkpoint_id: str) -> int | None:
        """Generations between ``checkpoint_id`` and the newest one; None when it is not registered."""
        ck, newest = self.checkpoints.get(checkpoint_id), self.newest_generation
        return None if ck is None or newest is None else newest - ck.generation

    def within(self, max_lag: int) -> list[str]:
        """Ids of the checkpoints at most ``max_lag`` generations behind the newest, sorted."""
        if max_lag < 0:
            raise ValueError(f"max_policy_lag must be 0 or more, not {max_lag}")
        newest = self.newest_generation
        if newest is None:
            return []
        return sorted(c.checkpoint_id for c in self.checkpoints.values() if newest - c.generation <= max_lag)

    def plan(self, checkpoint_id: str, parent_id: str = "", deployed_at_ms: int | None = None, note: str = "",
             *, now_ms: int) -> tuple[Checkpoint, bool]:
        """The checkpoint a registration stands for, and whether it must be written (False: already registered).

        ``deployed_at_ms=None`` means the registered time for a checkpoint already registered, else
        ``now_ms``. A repeated registration keeps the first note. Raises :class:`LineageError`."""
        if not _ID.match(checkpoint_id):
            raise LineageError(f"checkpoint id {checkpoint_id[:40]!r}: 1 to 128 characters, no control characters")
        if len(note) > MAX_NOTE_CHARS:
            raise LineageError(f"note: at most {MAX_NOTE_CHARS} characters")
        if parent_id == checkpoint_id:
            raise LineageError(f"checkpoint {checkpoint_id!r} cannot be its own parent")
        current = self.checkpoints.get(checkpoint_id)
        when = deployed_at_ms if deployed_at_ms is not None else current.deployed_at_ms if current else now_ms
        check_ms(when)
        if current is not None:
            wanted = replace(current, parent_id=parent_id, deployed_at_ms=when)
            if not current.same_lineage(wanted):
                raise LineageError(
                    f"checkpoint {checkpoint_id!r} is registered with parent {current.parent_id or '(none)'!r}, deployed "
                    f"{iso_ms(current.deployed_at_ms)}; asked: parent {parent_id or '(none)'!r}, deployed {iso_ms(when)}. "
                    "A checkpoint's lineage does not change: register the new weights under a new id")
            return current, False
        generation = 0
        if parent_id:
            parent = self.checkpoints.get(parent_id)
            if parent is None:
                raise LineageError(f"unknown parent checkpoint {parent_id!r}: register it first "
                                   f"(rewardflow checkpoints register {parent_id})")
            generation = parent.generation + 1
        return Checkpoint(checkpoint_id, parent_id, generation, when, note), True


def check_ms(ms: int) -> int:
    """``ms`` if it is a plausible epoch-milliseconds time; raises :class:`LineageError`."""
    if not _MIN_MS <= ms <= _MAX_MS:
        hint = " (that looks like epoch seconds; give milliseconds)" if 0 < ms < _MIN_MS else ""
        raise LineageError(f"deployed-at {ms}: epoch milliseconds between 1973 and 9999 expected{hint}")
    return ms


def parse_time(text: str) -> int:
    """Epoch milliseconds from digits (epoch ms) or ISO-8601 (a time without offset is UTC). Raises LineageError."""
    value = text.strip()
    if value.isdigit():
        return check_ms(int(value))
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise LineageError(f"deployed-at {text[:40]!r}: ISO-8601 (2025-06-01T08:00:00Z) or epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return check_ms((moment - _EPOCH) // timedelta(milliseconds=1))


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC (``2025-06-01T08:00:00.000Z``)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
