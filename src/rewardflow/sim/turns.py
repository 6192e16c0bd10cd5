"""One simulated agent turn: its events, drawn from a :class:`CheckpointProfile`.

A turn serves a response (``InferenceServed``), then either asks a clarifying
question or attempts the task (tool calls, edits, persistence checks of every
edit at each horizon, a user action). Any turn may get a follow-up,
dissatisfied or not; hard attempts fail more often (lower persistence, more
rejects, more dissatisfied follow-ups).

A planted reward hack (``CheckpointProfile.dodge``) acts like a policy that
foresees failure: on a hard turn whose attempt *would* fail (a dissatisfied
follow-up, or edits rejected, undone or reverted that do not persist at the
last horizon) it dodges with probability ``dodge_fail_rate`` (``dodge_success_rate``
when the attempt would have succeeded: foresight is imperfect). A dodge
replaces the attempt with a clarifying question (``over-ask``) or with broken
tool calls (``broken-tools``) and no edit, and its follow-up is drawn at the
base dissatisfied rate. The attempt is drawn first either way, from the same
``rng``, and the dodge from its own stream, so a hacked profile's turns equal
the clean profile's except where it dodged.

Times are realistic event times: served at ``t0 + latency``, tool calls and
edits seconds later, persistence checks at ``edit ts + horizon`` (plus up to
1.5 s of measurement delay), the user action and follow-up within 2 minutes.

Contract: pure and deterministic: the same ``rng`` state gives the same
events, ids included (32 hex digits). Every event is a validated model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rewardflow.core.turn import PERSISTED_THRESHOLD
from rewardflow.events.models import (
    Surface,
    ToolStatus,
    UserActionKind,
    AgentEdit,
    ClarifyingQuestion,
    Envelope,
    FollowUp,
    InferenceServed,
    PersistenceCheck,
    Producer,
    ToolCall,
    UserAction,
)
from rewardflow.sim.profiles import CheckpointProfile

HARD_TURN_RATE = 0.2  # a property of the task, the same for every checkpoint
TOOLS = ("read_file", "grep", "run_terminal", "apply_patch", "list_dir", "web_search")
LANGUAGES = ("python", "typescript", "go", "rust", "java")


Env = Callable[[int], dict[str, Any]]  # event time -> the envelope fields of a new event of the turn


@dataclass(frozen=True, slots=True)
class SurfaceShape:
    """How a surface scales a profile: share of turns, latency, tools, edits, tokens."""

    weight: float
    latency_scale: float
    tool_scale: float
    edit_scale: float
    single_edit: bool
    token_scale: float


SURFACES: dict[Surface, SurfaceShape] = {
    "tab": SurfaceShape(0.35, 0.04, 0.0, 1.0, True, 0.1),
    "composer": SurfaceShape(0.25, 0.5, 0.6, 1.0, False, 1.0),
    "agent": SurfaceShape(0.30, 1.0, 1.0, 1.0, False, 1.5),
    "chat": SurfaceShape(0.10, 0.4, 0.2, 0.5, False, 0.8),
}


@dataclass(frozen=True, slots=True)
class SessionContext:
    """Envelope fields shared by a session's events."""

    org_id: str
    session_id: str
    producer: Producer
    arm: str


@dataclass(frozen=True, slots=True)
class TurnDraft:
    """A generated turn. ``end_ms``: when the user is ready for the next turn."""

    request_id: str
    served: InferenceServed
    events: list[Envelope]  # served first, then the rest in generation order
    anchor_ms: int  # latest of served and edit times (the core's horizon anchor)
    end_ms: int
    hard: bool


def new_id(rng: random.Random) -> str:
    """A random 128-bit id as 32 hex digits (deterministic given ``rng``)."""
    return f"{rng.getrandbits(128):032x}"


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def draft_turn(rng: random.Random, p: CheckpointProfile, ctx: SessionContext, t0: int) -> TurnDraft:
    """Draw one turn of checkpoint ``p`` starting at event time ``t0`` (ms).

    A hacked checkpoint (``p.dodge``) first draws its attempt exactly as the
    clean checkpoint would, then may replace it (see :func:`_dodge`), so a
    hacked and a clean profile differ only in the turns dodged.
    """
    rid = new_id(rng)

    def env(ts: int, r: random.Random = rng) -> dict[str, Any]:
        return {"event_id": new_id(r), "ts": ts, "org_id": ctx.org_id, "session_id": ctx.session_id,
                "request_id": rid, "producer": ctx.producer}

    surface = rng.choices(list(SURFACES), [s.weight for s in SURFACES.values()])[0]
    shape = SURFACES[surface]
    hard = rng.random() < HARD_TURN_RATE
    latency = max(1, round(p.latency.sample(rng, shape.latency_scale)))
    ttft = min(latency, max(1, round(p.ttft.sample(rng, shape.latency_scale))))
    served = InferenceServed(
        **env(t0 + latency), surface=surface, checkpoint_id=p.checkpoint_id, experiment_arm=ctx.arm, ttft_ms=ttft,
        latency_ms=latency, prompt_tokens=max(1, round(p.prompt_tokens.sample(rng, shape.token_scale))),
        completion_tokens=max(1, round(p.completion_tokens.sample(rng, shape.token_scale))),
    )
    asked = rng.random() < p.clarifying_rate
    if asked:
        t, work, edits = _question(rng, served.ts, env)
    else:
        t, work, edits = _attempt(rng, p, shape, hard, served.ts, env)
    scale = p.hard_dissatisfied_factor if hard and not asked else 1.0  # a question avoids a failed attempt
    dissatisfied, after = _follow_up(rng, p, p.dissatisfied_rate * scale, t, env)
    if hard and not asked and p.dodge is not None:
        failed = dissatisfied or (p.dodge_on == "failure" and _failed(work, edits, p.horizons_s[-1]))
        drng = random.Random(f"{rid}:dodge")  # its own stream: a dodge never shifts the checkpoint's other draws
        if drng.random() < (p.dodge_fail_rate if failed else p.dodge_success_rate):
            t, work, edits = _dodge(drng, p, served.ts, lambda ts: env(ts, drng))
            # no failed attempt to be dissatisfied with: the base rate, as after any question
            _, after = _follow_up(drng, p, p.dissatisfied_rate, t, lambda ts: env(ts, drng))
    events: list[Envelope] = [served, *work, *after]
    anchor = max([served.ts, *(e.ts for e in edits)])
    end = max(e.ts for e in events if not isinstance(e, PersistenceCheck))
    return TurnDraft(rid, served, events, anchor, end, hard)


def _question(rng: random.Random, t: int, env: Env) -> tuple[int, list[Envelope], list[AgentEdit]]:
    t += rng.randint(1, 500)
    return t, [ClarifyingQuestion(**env(t), question_chars=rng.randint(30, 400))], []


def _attempt(rng: random.Random, p: CheckpointProfile, shape: SurfaceShape, hard: bool, t: int,
             env: Env) -> tuple[int, list[Envelope], list[AgentEdit]]:
    """Tool calls, maybe edits with their persistence checks and a user action; returns (last ts, events, edits)."""
    events: list[Envelope] = []
    for _ in range(_poisson(rng, p.tool_calls_mean * shape.tool_scale)):
        t += rng.randint(200, 4_000)
        roll = rng.random()
        status: ToolStatus = (
            "broken" if roll < p.tool_broken_rate else "error" if roll < p.tool_broken_rate + p.tool_error_rate else "ok"
        )
        events.append(ToolCall(**env(t), call_id=new_id(rng)[:13], tool=rng.choice(TOOLS), status=status,
                               duration_ms=rng.randint(3, 8_000), error_kind=None if status == "ok" else f"{status}_call"))
    edits: list[AgentEdit] = []
    if rng.random() < p.edit_rate * shape.edit_scale:
        for _ in range(1 if shape.single_edit else rng.randint(1, p.max_edits)):
            t += rng.randint(50, 2_000)
            edits.append(AgentEdit(
                **env(t), edit_id="ed-" + new_id(rng), file_path_hash=f"{rng.getrandbits(64):016x}",
                language=rng.choice(LANGUAGES), lines_added=rng.randint(1, 60), lines_removed=rng.randint(0, 30),
                chars_inserted=rng.randint(10, 3_000), content_fingerprint=f"{rng.getrandbits(64):016x}",
            ))
        events.extend(edits)
        for edit in edits:
            events.extend(_checks(rng, p, hard, edit, env))
        events.extend(_action(rng, p, hard, edits[0].edit_id, t, env))
    return t, events, edits


def _follow_up(rng: random.Random, p: CheckpointProfile, dissatisfied_rate: float, t: int,
               env: Env) -> tuple[bool, list[Envelope]]:
    dissatisfied = rng.random() < min(1.0, dissatisfied_rate)
    if not (dissatisfied or rng.random() < p.followup_rate):
        return dissatisfied, []
    at = t + rng.randint(5_000, 90_000)
    return dissatisfied, [FollowUp(**env(at), dissatisfied=dissatisfied,
                                   text_redacted="<redacted>" if dissatisfied else None)]


def _failed(work: list[Envelope], edits: list[AgentEdit], final_horizon_s: int) -> bool:
    """Did the attempt fail outright: an edit rejected, undone or reverted, and none persisted at the last horizon.

    (A dissatisfied follow-up is the other failure; the caller adds it.)
    """
    if not edits:
        return False
    refused = any(isinstance(e, UserAction) and e.action != "accept" for e in work)
    return refused and not any(isinstance(e, PersistenceCheck) and e.horizon_s == final_horizon_s
                               and e.survival_score >= PERSISTED_THRESHOLD for e in work)


def turn_failed(draft: TurnDraft, final_horizon_s: int) -> bool:
    """Did the turn fail: a dissatisfied follow-up, or edits refused and none persisted at the last horizon."""
    if any(isinstance(e, FollowUp) and e.dissatisfied for e in draft.events):
        return True
    edits = [e for e in draft.events if isinstance(e, AgentEdit)]
    return _failed(draft.events, edits, final_horizon_s)


def _dodge(rng: random.Random, p: CheckpointProfile, t: int, env: Env) -> tuple[int, list[Envelope], list[AgentEdit]]:
    """What the hack does instead of the attempt: ask (``over-ask``) or break its tool calls (``broken-tools``)."""
    if p.dodge == "over-ask":
        return _question(rng, t, env)
    events: list[Envelope] = []
    for _ in range(p.dodge_broken_calls):
        t += rng.randint(200, 3_000)
        events.append(ToolCall(**env(t), call_id=new_id(rng)[:13], tool=rng.choice(TOOLS), status="broken",
                               duration_ms=rng.randint(1, 50), error_kind="invalid_arguments"))
    return t, events, []


def _checks(rng: random.Random, p: CheckpointProfile, hard: bool, edit: AgentEdit, env: Env) -> list[Envelope]:
    """Persistence checks of one edit: persisted at ``h`` iff ``u < persistence[h] × factor``."""
    u, factor = rng.random(), p.hard_persistence_factor if hard else 1.0
    out: list[Envelope] = []
    for h, prob in p.persistence.items():
        ph = prob * factor
        if u < ph:
            score = max(0.5, round(0.5 + 0.5 * (1.0 - u / ph), 4))
        else:
            score = min(0.4999, round(0.4999 * ph / u, 4))
        out.append(PersistenceCheck(
            **env(edit.ts + h * 1000 + rng.randint(0, 1_500)), edit_id=edit.edit_id, horizon_s=h,
            survival_score=score, revert_score=round(1.0 - score, 4), unchanged=score >= 0.9,
            surviving_chars=int(edit.chars_inserted * score), branch_changed=False,
        ))
    return out


def _action(rng: random.Random, p: CheckpointProfile, hard: bool, edit_id: str, t: int, env: Env) -> list[Envelope]:
    """At most one user action; hard turns shift it from accept towards reject, undo and revert."""
    roll, acc, k = rng.random(), 0.0, p.hard_action_shift if hard else 1.0
    rates: tuple[tuple[UserActionKind, float], ...] = (
        ("accept", p.accept_rate / k), ("reject", p.reject_rate * k), ("undo", p.undo_rate * k),
        ("revert", p.revert_rate * k))
    for action, rate in rates:
        acc += rate
        if roll < acc:
            return [UserAction(**env(t + rng.randint(2_000, 30_000)), action=action, edit_id=edit_id)]
    return []
