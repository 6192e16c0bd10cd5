"""One agent turn's signals, gathered by ``request_id``, and its outcome.

:class:`TurnState` accumulates the events of a turn in any order; every update
is commutative (counts, maps keyed by ids, ties broken by ``(ts, event_id)``),
so the finalised :class:`TurnOutcome` does not depend on arrival order.

Contract: pure, no I/O. ``TurnState.to_obj`` / ``from_obj`` round-trip through
JSON-able values (for the changelog).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rewardflow.events.models import (
    AgentEdit,
    ClarifyingQuestion,
    Envelope,
    FollowUp,
    InferenceServed,
    PersistenceCheck,
    ToolCall,
    UserAction,
)

PERSISTED_THRESHOLD = 0.5  # an edit "persists" at a horizon when survival_score >= this

_COUNTERS = (
    "tool_calls", "tool_broken", "tool_error", "clarifying", "followups",
    "dissatisfied", "accept", "reject", "undo", "revert",
)


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """Everything known about a turn when it is (provisionally) finalised."""

    request_id: str
    session_id: str
    org_id: str
    checkpoint_id: str
    experiment_arm: str
    surface: str
    served_ts: int
    latency_ms: int
    ttft_ms: int
    prompt_tokens: int
    completion_tokens: int
    n_edits: int
    counts: dict[str, int]  # keys: _COUNTERS
    persistence: dict[int, float]  # horizon -> mean survival over edits checked
    persisted: dict[int, int]  # horizon -> edits persisted
    checked: dict[int, int]  # horizon -> edits checked
    horizon_s: int
    provisional: bool
    finalised_wm: int
    finalised_by: str

    def count(self, name: str) -> int:
        return self.counts.get(name, 0)

    def final_persistence(self) -> float | None:
        """Mean survival at the covered horizon, or None when no edit was checked there."""
        if self.checked.get(self.horizon_s):
            return self.persistence[self.horizon_s]
        return None


@dataclass(slots=True)
class TurnState:
    """Mutable accumulator of one turn."""

    request_id: str
    session_id: str
    org_id: str
    first_ts: int
    served: dict[str, Any] | None = None
    edits: dict[str, int] = field(default_factory=dict)  # edit_id -> edit ts
    # edit_id -> horizon -> [ts, event_id, survival]
    checks: dict[str, dict[int, list[Any]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    provisional_h: int = 0  # last horizon a provisional outcome was emitted for

    @classmethod
    def start(cls, event: Envelope) -> TurnState:
        return cls(event.request_id, event.session_id, event.org_id, event.ts)

    def anchor(self) -> int:
        """Event time the horizons count from: the latest of served and edit times."""
        base = self.served["ts"] if self.served else self.first_ts
        return max(base, max(self.edits.values())) if self.edits else base

    def apply(self, ev: Envelope) -> None:
        """Fold one validated event into the turn. Order-independent."""
        if ev.ts < self.first_ts:
            self.first_ts = ev.ts
        c = self.counts
        if isinstance(ev, InferenceServed):
            cand = {
                "ts": ev.ts, "event_id": ev.event_id, "checkpoint_id": ev.checkpoint_id,
                "experiment_arm": ev.experiment_arm, "surface": ev.surface,
                "latency_ms": ev.latency_ms, "ttft_ms": ev.ttft_ms,
                "prompt_tokens": ev.prompt_tokens, "completion_tokens": ev.completion_tokens,
            }
            if self.served is None or (ev.ts, ev.event_id) < (self.served["ts"], self.served["event_id"]):
                self.served = cand
        elif isinstance(ev, AgentEdit):
            prev = self.edits.get(ev.edit_id)
            self.edits[ev.edit_id] = ev.ts if prev is None else min(prev, ev.ts)
        elif isinstance(ev, PersistenceCheck):
            by_h = self.checks.setdefault(ev.edit_id, {})
            cur = by_h.get(ev.horizon_s)
            cand_l = [ev.ts, ev.event_id, ev.survival_score]
            if cur is None or (ev.ts, ev.event_id) > (cur[0], cur[1]):
                by_h[ev.horizon_s] = cand_l
        elif isinstance(ev, ToolCall):
            c["tool_calls"] = c.get("tool_calls", 0) + 1
            if ev.status != "ok":
                key = "tool_broken" if ev.status == "broken" else "tool_error"
                c[key] = c.get(key, 0) + 1
        elif isinstance(ev, UserAction):
            c[ev.action] = c.get(ev.action, 0) + 1
        elif isinstance(ev, FollowUp):
            c["followups"] = c.get("followups", 0) + 1
            if ev.dissatisfied:
                c["dissatisfied"] = c.get("dissatisfied", 0) + 1
        elif isinstance(ev, ClarifyingQuestion):
            c["clarifying"] = c.get("clarifying", 0) + 1

    def outcome(self, horizons: list[int], horizon_s: int, *, provisional: bool, wm: int, by: str) -> TurnOutcome:
        """The outcome covering horizons up to ``horizon_s``. Requires ``served``."""
        s = self.served
        assert s is not None, "orphan turns have no outcome"
        persistence: dict[int, float] = {}
        persisted: dict[int, int] = {}
        checked: dict[int, int] = {}
        for h in horizons:
            if h > horizon_s:
                break
            scores = [by_h[h][2] for e, by_h in self.checks.items() if e in self.edits and h in by_h]
            if scores:
                checked[h] = len(scores)
                persisted[h] = sum(1 for x in scores if x >= PERSISTED_THRESHOLD)
                persistence[h] = math.fsum(scores) / len(scores)  # exact sum: independent of arrival order
        return TurnOutcome(
            request_id=self.request_id, session_id=self.session_id, org_id=self.org_id,
            checkpoint_id=s["checkpoint_id"], experiment_arm=s["experiment_arm"], surface=s["surface"],
            served_ts=s["ts"], latency_ms=s["latency_ms"], ttft_ms=s["ttft_ms"],
            prompt_tokens=s["prompt_tokens"], completion_tokens=s["completion_tokens"],
            n_edits=len(self.edits), counts={k: self.counts[k] for k in _COUNTERS if self.counts.get(k)},
            persistence=persistence, persisted=persisted, checked=checked,
            horizon_s=horizon_s, provisional=provisional, finalised_wm=wm, finalised_by=by,
        )

    def to_obj(self) -> list[Any]:
        return [self.request_id, self.session_id, self.org_id, self.first_ts, self.served,
                self.edits, {e: {str(h): v for h, v in hs.items()} for e, hs in self.checks.items()},
                self.counts, self.provisional_h]

    @classmethod
    def from_obj(cls, o: list[Any]) -> TurnState:
        checks = {e: {int(h): v for h, v in hs.items()} for e, hs in o[6].items()}
        return cls(o[0], o[1], o[2], o[3], o[4], o[5], checks, o[7], o[8])


def outcome_to_obj(o: TurnOutcome) -> dict[str, Any]:
    """JSON-able dict of an outcome (int map keys become strings)."""
    d = {k: getattr(o, k) for k in TurnOutcome.__slots__}
    for k in ("persistence", "persisted", "checked"):
        d[k] = {str(h): v for h, v in d[k].items()}
    return d


def outcome_from_obj(d: dict[str, Any]) -> TurnOutcome:
    d = dict(d)
    for k in ("persistence", "persisted", "checked"):
        d[k] = {int(h): v for h, v in d[k].items()}
    return TurnOutcome(**d)
