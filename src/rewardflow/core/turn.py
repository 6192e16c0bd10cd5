"""One agent turn's signals, gathered by ``request_id``, and its outcome.

:class:`TurnState` accumulates the events of a turn in any order; every update
is commutative (counts, maps keyed by ids, ties broken by ``(ts, event_id)``),
so the finalised :class:`TurnOutcome` does not depend on arrival order.

Contract: pure, no I/O. ``TurnState.to_obj`` / ``from_obj`` round-trip through
JSON written with ``JSON_OPTS`` (for the changelog).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from rewardflow.core.config import JSON_OPTS
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

# Event kinds for TurnState.apply: one dict lookup by class instead of a chain of isinstance checks.
_OTHER, _CHECK, _EDIT, _SERVED, _TOOL, _ACTION, _FOLLOWUP, _CLARIFYING = range(8)
_KIND_BASES: tuple[tuple[type[Envelope], int], ...] = (
    (InferenceServed, _SERVED), (AgentEdit, _EDIT), (PersistenceCheck, _CHECK), (ToolCall, _TOOL),
    (UserAction, _ACTION), (FollowUp, _FOLLOWUP), (ClarifyingQuestion, _CLARIFYING),
)
_KIND: dict[type, int] = {cls: kind for cls, kind in _KIND_BASES}


def _kind_of(cls: type) -> int:
    """Kind of an event class: that of the first of ``_KIND_BASES`` it derives from (so subclasses fold
    like their base, as with isinstance checks); cached."""
    kind = next((k for base, k in _KIND_BASES if issubclass(cls, base)), _OTHER)
    _KIND[cls] = kind
    return kind


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
    n: int = 0  # events applied (the session limits count them)
    _anchor: int | None = field(default=None, compare=False, repr=False)  # anchor(), until apply() changes it
    # (to_obj(), its orjson bytes) until apply() or a new provisional horizon changes the turn
    _enc: tuple[list[Any], bytes] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def start(cls, event: Envelope) -> TurnState:
        return cls(event.request_id, event.session_id, event.org_id, event.ts)

    def anchor(self) -> int:
        """Event time the horizons count from: the latest of served and edit times.

        Kept between calls; only :meth:`apply` changes what it depends on (served, edits, first_ts).
        """
        a = self._anchor
        if a is None:
            base = self.served["ts"] if self.served else self.first_ts
            a = self._anchor = max(base, max(self.edits.values())) if self.edits else base
        return a

    def last_edit(self) -> int | None:
        """The latest edit's time, None without edits."""
        return max(self.edits.values()) if self.edits else None

    def apply(self, ev: Envelope) -> None:
        """Fold one validated event into the turn. Order-independent."""
        ts = ev.ts
        self.n += 1
        self._anchor = self._enc = None
        if ts < self.first_ts:
            self.first_ts = ts
        kind = _KIND.get(type(ev)) or _kind_of(type(ev))
        if kind == _CHECK:  # the most frequent kind first
            chk: PersistenceCheck = ev  # type: ignore[assignment]
            edit_id, h = chk.edit_id, chk.horizon_s  # read once: model attributes are slow
            by_h = self.checks.get(edit_id)
            if by_h is None:
                by_h = self.checks[edit_id] = {}
            cur = by_h.get(h)
            # the latest check wins, ties broken by event_id: (ts, event_id) > (cur ts, cur event_id)
            if cur is None or ts > cur[0] or (ts == cur[0] and chk.event_id > cur[1]):
                by_h[h] = [ts, chk.event_id, chk.survival_score]
        elif kind == _EDIT:
            edit_id = ev.edit_id  # type: ignore[attr-defined]
            prev = self.edits.get(edit_id)
            self.edits[edit_id] = ts if prev is None or ts < prev else prev
        elif kind == _SERVED:
            srv: InferenceServed = ev  # type: ignore[assignment]
            s = self.served
            # the first served wins: (ts, event_id) < (served ts, served event_id)
            if s is None or ts < s["ts"] or (ts == s["ts"] and srv.event_id < s["event_id"]):
                self.served = {
                    "ts": ts, "event_id": srv.event_id, "checkpoint_id": srv.checkpoint_id,
                    "experiment_arm": srv.experiment_arm, "surface": srv.surface,
                    "latency_ms": srv.latency_ms, "ttft_ms": srv.ttft_ms,
                    "prompt_tokens": srv.prompt_tokens, "completion_tokens": srv.completion_tokens,
                }
        elif kind == _TOOL:
            status = ev.status  # type: ignore[attr-defined]
            c = self.counts
            c["tool_calls"] = c.get("tool_calls", 0) + 1
            if status != "ok":
                key = "tool_broken" if status == "broken" else "tool_error"
                c[key] = c.get(key, 0) + 1
        elif kind == _ACTION:
            action = ev.action  # type: ignore[attr-defined]
            self.counts[action] = self.counts.get(action, 0) + 1
        elif kind == _FOLLOWUP:
            c = self.counts
            c["followups"] = c.get("followups", 0) + 1
            if ev.dissatisfied:  # type: ignore[attr-defined]
                c["dissatisfied"] = c.get("dissatisfied", 0) + 1
        elif kind == _CLARIFYING:
            self.counts["clarifying"] = self.counts.get("clarifying", 0) + 1

    def outcome(self, horizons: Sequence[int], horizon_s: int, *, provisional: bool, wm: int, by: str) -> TurnOutcome:
        """The outcome covering horizons up to ``horizon_s``. Requires ``served``."""
        s = self.served
        assert s is not None, "orphan turns have no outcome"
        persistence: dict[int, float] = {}
        persisted: dict[int, int] = {}
        checked: dict[int, int] = {}
        edits = self.edits
        by_edit = [by_h for e, by_h in self.checks.items() if e in edits]  # checks of unknown edits are ignored
        if by_edit:
            for h in horizons:
                if h > horizon_s:
                    break
                scores: list[float] = []
                n_persisted = 0
                for by_h in by_edit:
                    if h in by_h:
                        x = by_h[h][2]
                        scores.append(x)
                        if x >= PERSISTED_THRESHOLD:
                            n_persisted += 1
                if scores:
                    checked[h] = len(scores)
                    persisted[h] = n_persisted
                    persistence[h] = math.fsum(scores) / len(scores)  # exact sum: independent of arrival order
        c = self.counts
        return TurnOutcome(
            request_id=self.request_id, session_id=self.session_id, org_id=self.org_id,
            checkpoint_id=s["checkpoint_id"], experiment_arm=s["experiment_arm"], surface=s["surface"],
            served_ts=s["ts"], latency_ms=s["latency_ms"], ttft_ms=s["ttft_ms"],
            prompt_tokens=s["prompt_tokens"], completion_tokens=s["completion_tokens"],
            n_edits=len(edits), counts={k: c[k] for k in _COUNTERS if c.get(k)} if c else {},
            persistence=persistence, persisted=persisted, checked=checked,
            horizon_s=horizon_s, provisional=provisional, finalised_wm=wm, finalised_by=by,
        )

    def note_provisional(self, horizon_s: int) -> None:
        """Record that a provisional outcome was emitted up to ``horizon_s``."""
        self.provisional_h = horizon_s
        self._enc = None

    def to_obj(self) -> list[Any]:
        return self.encoded()[0]

    def encoded(self) -> tuple[list[Any], bytes]:
        """:meth:`to_obj`'s value and ``orjson.dumps`` of it (``JSON_OPTS``), kept until the turn changes:
        a session's state is rewritten whole, mostly with its other turns unchanged. Every change
        goes through :meth:`apply` or :meth:`note_provisional`. The value shares the turn's maps:
        treat it as read-only. Its ``checks`` keep their int horizons as keys (``JSON_OPTS`` writes them
        as strings; :meth:`from_obj` reads either)."""
        enc = self._enc
        if enc is None:
            obj = [self.request_id, self.session_id, self.org_id, self.first_ts, self.served,
                   self.edits, self.checks, self.counts, self.provisional_h, self.n]
            enc = self._enc = (obj, orjson.dumps(obj, option=JSON_OPTS))
        return enc

    @classmethod
    def from_obj(cls, o: list[Any]) -> TurnState:
        checks = {e: {int(h): v for h, v in hs.items()} for e, hs in o[6].items()} if o[6] else {}
        return cls(o[0], o[1], o[2], o[3], o[4], o[5], checks, o[7], o[8], o[9] if len(o) > 9 else 0)


_OUTCOME_FIELDS: tuple[str, ...] = TurnOutcome.__slots__  # the fields, in declaration order
_outcome_values = operator.attrgetter(*_OUTCOME_FIELDS)


def _str_keys(m: dict[int, Any]) -> dict[str, Any]:
    return {str(h): v for h, v in m.items()} if m else {}


def outcome_to_obj(o: TurnOutcome) -> dict[str, Any]:
    """JSON-able dict of an outcome (int map keys become strings)."""
    d = dict(zip(_OUTCOME_FIELDS, _outcome_values(o)))
    d["persistence"] = _str_keys(o.persistence)
    d["persisted"] = _str_keys(o.persisted)
    d["checked"] = _str_keys(o.checked)
    return d


def outcome_from_obj(d: dict[str, Any]) -> TurnOutcome:
    d = dict(d)
    for k in ("persistence", "persisted", "checked"):
        d[k] = {int(h): v for h, v in d[k].items()}
    return TurnOutcome(**d)
