"""Deterministic, realistic event streams for tests, benchmarks and examples.

A session is a run of agent turns. Each turn serves a response
(``InferenceServed``), applies edits (``AgentEdit``), calls tools (``ToolCall``,
sometimes ``error`` or ``broken``), measures every edit's persistence at 30,
120, 300, 600 and 900 s (``PersistenceCheck``), and ends with a user action, a
follow-up or a clarifying question.

Contract: pure; the same arguments give the same events (ids included), every
event is a validated model, event ids are unique across a call, and the
stream is ordered by event time (ties keep generation order).
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from rewardflow.events.models import (
    AgentEdit,
    ClarifyingQuestion,
    Envelope,
    FollowUp,
    InferenceServed,
    PersistenceCheck,
    Producer,
    ToolCall,
    ToolStatus,
    UserAction,
    UserActionKind,
)

HORIZONS_S = (30, 120, 300, 600, 900)
START_MS = 1_764_000_000_000  # 2025-11-24T16:00:00Z
PRODUCERS = (Producer(name="vscode-ext", version="1.42.0"), Producer(name="agent-runner", version="0.9.3"))
TOOLS = ("read_file", "run_terminal", "grep", "apply_patch", "web_search")
LANGUAGES = ("python", "typescript", "go", "rust")
STATUSES: tuple[ToolStatus, ...] = ("ok", "error", "broken")
ACTIONS: tuple[UserActionKind, ...] = ("accept", "reject", "undo", "revert")


def _id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def turn_events(rng: random.Random, envelope: dict[str, Any], start_ms: int) -> list[Envelope]:
    """One agent turn's events (unsorted); ``envelope`` holds org, session and producer."""
    request = {**envelope, "request_id": _id(rng)}

    def env(at_ms: int) -> dict[str, Any]:
        return {**request, "event_id": _id(rng), "ts": at_ms}

    ttft = rng.randint(80, 900)
    out: list[Envelope] = [
        InferenceServed(
            **env(start_ms), surface=rng.choice(("tab", "composer", "agent", "chat")),
            checkpoint_id=f"ckpt-2025-11-{rng.randint(1, 28):02d}", experiment_arm=rng.choice(("control", "treatment")),
            ttft_ms=ttft, latency_ms=ttft + rng.randint(0, 20_000),
            prompt_tokens=rng.randint(200, 30_000), completion_tokens=rng.randint(5, 4_000),
        )
    ]
    t = start_ms + rng.randint(500, 5_000)
    for _ in range(rng.randint(0, 2)):
        status = rng.choices(STATUSES, weights=(8, 1, 1))[0]
        out.append(ToolCall(
            **env(t), call_id=_id(rng)[:8], tool=rng.choice(TOOLS), status=status,
            duration_ms=rng.randint(3, 8_000), error_kind=None if status == "ok" else f"{status}_{rng.randint(1, 3)}",
        ))
        t += rng.randint(100, 3_000)
    edits = []
    for _ in range(rng.randint(0, 3)):
        edit = AgentEdit(
            **env(t), edit_id=_id(rng)[:12], file_path_hash=f"{rng.getrandbits(64):016x}", language=rng.choice(LANGUAGES),
            lines_added=rng.randint(0, 80), lines_removed=rng.randint(0, 40), chars_inserted=rng.randint(0, 4_000),
            content_fingerprint=f"{rng.getrandbits(64):016x}" if rng.random() < 0.8 else None,
        )
        out.append(edit)
        edits.append(edit)
        t += rng.randint(50, 2_000)
    for edit in edits:
        survival = 1.0
        for horizon in HORIZONS_S:
            survival = round(max(0.0, survival - rng.random() * 0.2), 4)
            out.append(PersistenceCheck(
                **env(edit.ts + horizon * 1000), edit_id=edit.edit_id, horizon_s=horizon,
                survival_score=survival, revert_score=round(rng.random() * (1 - survival), 4), unchanged=survival > 0.67,
                surviving_chars=int(edit.chars_inserted * survival), branch_changed=rng.random() < 0.05,
            ))
    out.extend(_closing(rng, env, t, edits))
    return out


def _closing(rng: random.Random, env: Any, t: int, edits: list[AgentEdit]) -> list[Envelope]:
    roll = rng.random()
    if roll < 0.1:
        return [ClarifyingQuestion(**env(t), question_chars=rng.randint(20, 400))]
    out: list[Envelope] = []
    if edits or roll < 0.5:
        action = rng.choices(ACTIONS, weights=(6, 2, 1, 1))[0]
        edit_id = rng.choice(edits).edit_id if edits and rng.random() < 0.5 else None
        out.append(UserAction(**env(t + rng.randint(1_000, 20_000)), action=action, edit_id=edit_id))
    if rng.random() < 0.4:
        dissatisfied = rng.choice((True, False, None))
        text = rng.choice(("that broke the build", "thanks, now add tests", "<redacted>", None))
        out.append(FollowUp(**env(t + rng.randint(5_000, 60_000)), dissatisfied=dissatisfied, text_redacted=text))
    return out


def session_events(seed: int, *, turns: int = 5, start_ms: int = START_MS, org_id: str = "org-acme") -> list[Envelope]:
    """One session of ``turns`` turns, sorted by event time."""
    rng = random.Random(seed)
    envelope = {"org_id": org_id, "session_id": f"sess-{_id(rng)[:13]}", "producer": rng.choice(PRODUCERS)}
    out: list[Envelope] = []
    t = start_ms
    for _ in range(turns):
        out.extend(turn_events(rng, envelope, t))
        t += rng.randint(10_000, 120_000)
    return sorted(out, key=lambda e: e.ts)


def sample_events(n: int, seed: int = 0, *, turns: int = 5) -> list[Envelope]:
    """The first ``n`` events (by event time) of sessions that overlap in time.

    Sessions start up to an hour apart; enough of them are generated to give
    ``n`` events, and the merged stream is cut at ``n``.
    """
    rng = random.Random(seed)
    merged: list[Envelope] = []
    i = 0
    while len(merged) < n:
        start = START_MS + rng.randint(0, 3_600_000)
        merged.extend(session_events(rng.getrandbits(64) + i, turns=turns, start_ms=start))
        i += 1
    merged.sort(key=lambda e: e.ts)
    return merged[:n]
