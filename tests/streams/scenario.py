"""Turn builders for the stream tests and the pure-core reference they are checked against.

Contract: plain data, no I/O. :func:`varied_turn` builds a complete turn whose
signals depend on ``rng`` (edits, tool outcomes, user actions, follow-ups,
checks at every horizon); :func:`expected_finals` is what the pure core makes
of a turn's events applied *in event-time order*, as rows read from the
rewards topic, without the fields that depend on when the turn was finalised.
"""

from __future__ import annotations

import random
from typing import Any

from rewardflow.core.turn import TurnState
from rewardflow.events.validate import validate_event
from rewardflow.rewards.registry import active_specs
from rewardflow.core.score import score
from rewardflow.settings import Settings
from tests.factories import ev
from tests.streams.replay import on_wire

TIMING = ("finalised_wm", "finalised_by")
SURFACES = ("agent", "composer", "tab", "chat")


def varied_turn(rng: random.Random, rid: str, sid: str, ts: int, horizons: list[int], *,
                checkpoint: str = "ck-a", arm: str = "control", surface: str = "agent",
                latency_ms: int | None = None) -> list[dict[str, Any]]:
    """A served turn with 0-2 edits and a random mix of every other signal, within 60 s of ``ts``."""
    out = [ev("InferenceServed", rid, sid, ts, checkpoint_id=checkpoint, experiment_arm=arm, surface=surface,
              latency_ms=latency_ms if latency_ms is not None else rng.randrange(200, 20_000),
              completion_tokens=rng.randrange(10, 900))]
    for k in range(rng.choice((0, 1, 1, 2))):
        edit = f"{rid}-ed{k}"
        at = ts + 500 + 300 * k
        out.append(ev("AgentEdit", rid, sid, at, edit_id=edit))
        for h in horizons:
            out.append(ev("PersistenceCheck", rid, sid, at + h * 1000, edit_id=edit, horizon_s=h,
                          survival_score=rng.choice((0.0, 0.3, 0.5, 0.8, 1.0))))
        out.append(ev("UserAction", rid, sid, at + 200, action=rng.choice(("accept", "reject", "undo", "revert"))))
    for k in range(rng.randrange(3)):
        out.append(ev("ToolCall", rid, sid, ts + 100 + k, call_id=f"{rid}-c{k}",
                      status=rng.choice(("ok", "ok", "error", "broken"))))
    if rng.random() < 0.4:
        out.append(ev("FollowUp", rid, sid, ts + rng.randrange(1_000, 50_000), dissatisfied=rng.random() < 0.5))
    if rng.random() < 0.3:
        out.append(ev("ClarifyingQuestion", rid, sid, ts + 50))
    return out


def expected_finals(events: list[dict[str, Any]], settings: Settings) -> dict[str, dict[str, Any]]:
    """spec version -> the final reward row of one turn, from its events in event-time order."""
    ordered = [validate_event(e) for e in sorted(events, key=lambda e: (e["ts"], e["event_id"]))]
    state = TurnState.start(ordered[0])
    for e in ordered:
        state.apply(e)
    hz = list(settings.horizons_s)
    outcome = state.outcome(hz, hz[-1], provisional=False, wm=0, by="")
    rows = on_wire([score(outcome, spec) for spec in active_specs(settings)])
    return {r["spec_version"]: strip_timing(r) for r in rows}


def strip_timing(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in TIMING}
