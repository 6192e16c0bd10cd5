"""Builders of valid event dicts for tests (plain data, no I/O)."""

from __future__ import annotations

import itertools
from typing import Any

T0 = 1_790_000_000_000
_ids = itertools.count()


def ev(event_type: str, request_id: str = "r1", session_id: str = "s1", ts: int = T0, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "event_id": fields.pop("event_id", f"e{next(_ids)}"),
        "event_type": event_type,
        "schema_version": 1,
        "ts": ts,
        "org_id": "org",
        "session_id": session_id,
        "request_id": request_id,
        "producer": {"name": "test", "version": "1"},
    }
    defaults: dict[str, dict[str, Any]] = {
        "InferenceServed": dict(surface="agent", checkpoint_id="ck-a", experiment_arm="control", ttft_ms=100,
                                latency_ms=1000, prompt_tokens=500, completion_tokens=200),
        "AgentEdit": dict(edit_id="ed1", file_path_hash="h", language="python", lines_added=3,
                          lines_removed=1, chars_inserted=80),
        "ToolCall": dict(call_id="c1", tool="run", status="ok", duration_ms=50),
        "PersistenceCheck": dict(edit_id="ed1", horizon_s=30, survival_score=0.9, revert_score=0.0, unchanged=True),
        "UserAction": dict(action="accept"),
        "FollowUp": dict(dissatisfied=False),
        "ClarifyingQuestion": dict(),
    }
    base.update(defaults[event_type])
    base.update(fields)
    return base


def turn(request_id: str, session_id: str = "s1", ts: int = T0, checkpoint: str = "ck-a",
         survival: float = 0.9, horizons: tuple[int, ...] = (30, 120, 300, 600, 900), **served: Any) -> list[dict[str, Any]]:
    """A complete turn: served, one edit, one ok tool call, checks at each horizon, accept."""
    out = [
        ev("InferenceServed", request_id, session_id, ts, checkpoint_id=checkpoint, **served),
        ev("AgentEdit", request_id, session_id, ts + 1000, edit_id=f"{request_id}-ed"),
        ev("ToolCall", request_id, session_id, ts + 500, call_id=f"{request_id}-c"),
        ev("UserAction", request_id, session_id, ts + 2000, action="accept", edit_id=f"{request_id}-ed"),
    ]
    for h in horizons:
        out.append(ev("PersistenceCheck", request_id, session_id, ts + 1000 + h * 1000,
                      edit_id=f"{request_id}-ed", horizon_s=h, survival_score=survival))
    return out
