"""Pure reward functions: a finalised :class:`TurnOutcome` and a spec → a reward record.

The same function serves the stream and batch replay, so a replay under the
same spec reproduces the stream's rewards exactly.

Contract: pure, no I/O, deterministic. Broken tool calls always contribute
``weights.tool_broken × count`` (never dropped).
"""

from __future__ import annotations

from rewardflow.core.records import RewardRecord, stable_id
from rewardflow.core.turn import TurnOutcome
from rewardflow.rewards.spec import RewardSpec


def components(o: TurnOutcome, spec: RewardSpec) -> dict[str, float]:
    """Each component's contribution to the reward."""
    w = spec.weights
    fp = o.final_persistence()
    return {
        "persistence": w.persistence * fp if fp is not None else 0.0,
        "accept": w.accept * o.count("accept"),
        "reject": w.reject * o.count("reject"),
        "undo": w.undo * o.count("undo"),
        "revert": w.revert * o.count("revert"),
        "dissatisfied": w.dissatisfied * o.count("dissatisfied"),
        "latency": w.latency_per_s * o.latency_ms / 1000.0,
        "tool_broken": w.tool_broken * o.count("tool_broken"),
        "tool_error": w.tool_error * o.count("tool_error"),
        "clarifying": w.clarifying * o.count("clarifying"),
    }


def reward_id(spec_version: str, o: TurnOutcome) -> str:
    return stable_id(spec_version, o.request_id, f"h{o.horizon_s}" if o.provisional else "final")


def score(o: TurnOutcome, spec: RewardSpec, spec_hash: str | None = None) -> RewardRecord:
    """The reward record of one outcome under one spec."""
    comps = components(o, spec)
    return RewardRecord(
        reward_id=reward_id(spec.version, o),
        sample_id=o.request_id,
        spec_version=spec.version,
        spec_hash=spec_hash or spec.content_hash,
        org_id=o.org_id,
        session_id=o.session_id,
        checkpoint_id=o.checkpoint_id,
        experiment_arm=o.experiment_arm,
        surface=o.surface,
        served_ts=o.served_ts,
        finalised_wm=o.finalised_wm,
        finalised_by=o.finalised_by,
        provisional=int(o.provisional),
        horizon_s=o.horizon_s,
        reward=round(sum(comps.values()), 12),
        components=comps,
        latency_ms=o.latency_ms,
        ttft_ms=o.ttft_ms,
        completion_tokens=o.completion_tokens,
        n_edits=o.n_edits,
        n_tool_calls=o.count("tool_calls"),
        n_tool_broken=o.count("tool_broken"),
        n_tool_error=o.count("tool_error"),
        n_clarifying=o.count("clarifying"),
        n_followups=o.count("followups"),
        n_dissatisfied=o.count("dissatisfied"),
        n_accept=o.count("accept"),
        n_reject=o.count("reject"),
        n_undo=o.count("undo"),
        n_revert=o.count("revert"),
        persistence=dict(o.persistence),
        persisted=dict(o.persisted),
        checked=dict(o.checked),
    )
