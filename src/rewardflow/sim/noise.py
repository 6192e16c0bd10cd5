"""Delivery faults the simulator can plant, and the malformed records it sends.

Every fault is counted in the ground truth, so a pipeline run can be
reconciled exactly:

* **duplicate**: a client resend of an event (same ``event_id``) 0.1–5 s of
  event time after the original; the core excludes it as ``duplicate``.
* **out of order**: an event delivered up to ``max_jitter_ms`` after its event
  time, behind later events; it still joins its turn (the jitter is kept well
  inside ``grace − lateness``).
* **late**: an *extra* dissatisfied follow-up of a turn whose event time (and
  delivery) is ``late_extra_ms`` beyond the turn's final deadline
  (anchor + last horizon + grace). Within the pipeline's correction window
  (``SimConfig.correction_ms``) it corrects the turn (a new revision), past it
  the core routes it to ``late``.
* **orphan**: a turn whose ``InferenceServed`` is never sent; the core
  excludes the turn as ``orphan`` and emits no reward for it.
* **malformed**: a record of raw bytes that must be dead-lettered (one dead
  letter each): bad JSON, a wrong type, a missing field, an unknown event
  type, or a timestamp in seconds.

Contract: pure; :func:`malformed_record` is deterministic given ``rng``.
"""

from __future__ import annotations

import random
from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rewardflow.events.models import InferenceServed
from rewardflow.sim.turns import new_id

Rate = Annotated[float, Field(ge=0.0, le=1.0)]
MalformedKind = Literal["bad_json", "wrong_type", "missing_field", "unknown_type", "ts_in_seconds"]
MALFORMED_KINDS: tuple[MalformedKind, ...] = ("bad_json", "wrong_type", "missing_field", "unknown_type", "ts_in_seconds")


class NoiseConfig(BaseModel):
    """Rates of planted delivery faults (all zero: a clean stream)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    duplicate_rate: Rate = Field(default=0.0, description="P(an event is sent twice)")
    out_of_order_rate: Rate = Field(default=0.0, description="P(an event is delivered late by up to max_jitter_ms)")
    max_jitter_ms: int = Field(default=20_000, ge=1_000, le=3_600_000)
    late_rate: Rate = Field(default=0.0, description="P(a turn gets an extra follow-up delivered after its deadline)")
    late_extra_ms: tuple[int, int] = Field(default=(120_000, 900_000), description="how far beyond the deadline")
    malformed_rate: Rate = Field(default=0.0, description="P(a turn is accompanied by one malformed record)")
    orphan_rate: Rate = Field(default=0.0, description="P(a turn's InferenceServed is dropped)")

    @model_validator(mode="after")
    def _ordered(self) -> NoiseConfig:
        lo, hi = self.late_extra_ms
        if not 60_000 <= lo <= hi:
            raise ValueError("late_extra_ms must be (lo, hi) with 60000 <= lo <= hi")
        return self

    @classmethod
    def realistic(cls) -> NoiseConfig:
        """The ``--noise`` preset: every fault at a small, production-like rate."""
        return cls(duplicate_rate=0.01, out_of_order_rate=0.05, late_rate=0.01, malformed_rate=0.005, orphan_rate=0.01)


def hidden_served(served: InferenceServed) -> bytes:
    """JSON record bytes of ``served`` as a ``hide-failures`` client sends it: ``latency_ms`` a string,
    so validation refuses it (the rest of its turn then has no served event)."""
    event = served.model_dump(mode="json")
    event["latency_ms"] = f"{served.latency_ms}ms"
    return orjson.dumps(event)


def malformed_record(rng: random.Random, kind: MalformedKind, session_id: str, ts_ms: int) -> bytes:
    """JSON record bytes of one event that fails decoding or validation as ``kind``."""
    event: dict[str, object] = {
        "event_id": new_id(rng), "event_type": "ToolCall", "schema_version": 1, "ts": ts_ms,
        "org_id": "org-sim", "session_id": session_id, "request_id": new_id(rng),
        "producer": {"name": "sim-broken-client", "version": "0.0.1"},
        "call_id": new_id(rng)[:13], "tool": "grep", "status": "ok", "duration_ms": 12,
    }
    if kind == "bad_json":
        return orjson.dumps(event)[: -rng.randint(2, 20)]
    if kind == "wrong_type":
        event["duration_ms"] = "slow"
    elif kind == "missing_field":
        del event["request_id"]
    elif kind == "unknown_type":
        event["event_type"] = "ToolCallV9"
    elif kind == "ts_in_seconds":
        event["ts"] = ts_ms // 1000
    else:  # pragma: no cover - Literal exhausts the kinds
        raise ValueError(f"unknown malformed kind {kind!r}")
    return orjson.dumps(event)
