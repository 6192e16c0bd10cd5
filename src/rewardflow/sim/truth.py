"""Ground truth of a simulation: what a correct pipeline must report.

Counts are *realised* (taken from the events actually generated), not
expected values, so a run reconciles exactly:

* per checkpoint, ``turns`` = final reward rows per reward spec (served turns,
  orphans excluded); ``orphan_turns`` = ``orphan`` exclusions;
* ``edits_checked`` / ``edits_persisted`` = sums of the ``checked`` /
  ``persisted`` maps at the final horizon over those rows;
* ``turns_dissatisfied`` / ``turns_clarifying`` / ``turns_broken`` /
  ``turns_with_edit`` = rows with ``n_dissatisfied`` / ``n_clarifying`` /
  ``n_tool_broken`` / ``n_edits`` > 0;
* stream-wide: ``valid_events`` = rows of the ``events`` table (distinct valid
  events that are not late), ``duplicates`` = ``duplicate`` exclusions,
  ``late`` = ``late`` rows, ``malformed`` = dead letters.

Contract: pure; :meth:`GroundTruth.to_dict` is JSON-able.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from rewardflow.core.turn import PERSISTED_THRESHOLD
from rewardflow.events.models import (
    AgentEdit,
    ClarifyingQuestion,
    Envelope,
    FollowUp,
    PersistenceCheck,
    ToolCall,
)
from rewardflow.sim.turns import TurnDraft


def nearest_rank(values: list[int], q: float) -> float:
    """Nearest-rank quantile of ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[max(1, math.ceil(q * len(ordered))) - 1])


@dataclass(slots=True)
class CheckpointTruth:
    """Realised outcome counts of one checkpoint."""

    checkpoint_id: str
    arm: str
    sessions: int = 0
    turns: int = 0
    orphan_turns: int = 0
    hidden_turns: int = 0  # failing turns whose served event a hide-failures client sent malformed
    hard_turns: int = 0
    edits: int = 0
    edits_checked: int = 0
    edits_persisted: int = 0
    turns_with_edit: int = 0
    turns_dissatisfied: int = 0
    turns_clarifying: int = 0
    turns_broken: int = 0
    tool_calls: int = 0
    tool_broken: int = 0
    latencies_ms: list[int] = field(default_factory=list)

    def add_turn(self, draft: TurnDraft, final_horizon_s: int) -> None:
        """Count a served (non-orphan) turn from its generated events."""
        ev = draft.events
        self.turns += 1
        self.hard_turns += draft.hard
        self.latencies_ms.append(draft.served.latency_ms)
        edits = {e.edit_id for e in ev if isinstance(e, AgentEdit)}
        checks = [e for e in ev if isinstance(e, PersistenceCheck) and e.horizon_s == final_horizon_s and e.edit_id in edits]
        broken = sum(1 for e in ev if isinstance(e, ToolCall) and e.status == "broken")
        self.edits += len(edits)
        self.edits_checked += len(checks)
        self.edits_persisted += sum(1 for c in checks if c.survival_score >= PERSISTED_THRESHOLD)
        self.turns_with_edit += bool(edits)
        self.turns_dissatisfied += any(isinstance(e, FollowUp) and e.dissatisfied for e in ev)
        self.turns_clarifying += any(isinstance(e, ClarifyingQuestion) for e in ev)
        self.turns_broken += broken > 0
        self.tool_calls += sum(1 for e in ev if isinstance(e, ToolCall))
        self.tool_broken += broken

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__ if k != "latencies_ms"}
        n = self.turns or 1
        d.update(
            persistence_rate=self.edits_persisted / self.edits_checked if self.edits_checked else None,
            dissatisfied_rate=self.turns_dissatisfied / n, clarifying_rate=self.turns_clarifying / n,
            broken_tool_rate=self.turns_broken / n, edit_rate=self.turns_with_edit / n,
            latency_p50=nearest_rank(self.latencies_ms, 0.5), latency_p95=nearest_rank(self.latencies_ms, 0.95),
        )
        return d


@dataclass(slots=True)
class GroundTruth:
    """Everything planted in a simulation, for reconciliation."""

    seed: int
    start_ms: int
    final_horizon_s: int
    sessions: int = 0
    arms: dict[str, str] = field(default_factory=dict)  # arm -> checkpoint
    checkpoints: dict[str, CheckpointTruth] = field(default_factory=dict)
    events_generated: int = 0  # distinct valid events, late ones included
    events_sent: int = 0  # valid events sent, duplicates included
    duplicates: int = 0
    out_of_order: int = 0
    late: int = 0  # planted late signals past the correction window
    corrected: int = 0  # planted late signals within it: each corrects its turn once
    orphan_turns: int = 0
    malformed: int = 0
    malformed_by_kind: dict[str, int] = field(default_factory=dict)
    last_event_ms: int = 0

    @property
    def valid_events(self) -> int:
        """Expected rows of the events table: distinct valid events minus late ones (a correcting one is stored)."""
        return self.events_generated - self.late

    @property
    def turns_per_checkpoint(self) -> dict[str, int]:
        return {c: t.turns for c, t in self.checkpoints.items()}

    def count_event(self, event: Envelope) -> None:
        self.events_generated += 1
        self.last_event_ms = max(self.last_event_ms, event.ts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "start_ms": self.start_ms, "last_event_ms": self.last_event_ms,
            "final_horizon_s": self.final_horizon_s, "sessions": self.sessions, "arms": dict(self.arms),
            "turns_per_checkpoint": self.turns_per_checkpoint,
            "checkpoints": {c: t.to_dict() for c, t in self.checkpoints.items()},
            "events_generated": self.events_generated, "valid_events": self.valid_events,
            "events_sent": self.events_sent, "duplicates": self.duplicates, "out_of_order": self.out_of_order,
            "late": self.late, "corrected": self.corrected, "orphan_turns": self.orphan_turns, "malformed": self.malformed,
            "malformed_by_kind": dict(self.malformed_by_kind),
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
