"""score(): components, the reward, and the record built from a TurnOutcome."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardflow.core.turn import TurnOutcome
from rewardflow.core.score import components, reward_id, score
from rewardflow.rewards.spec import RewardSpec, RewardWeights
from tests.factories import T0

SPEC = RewardSpec(version="v1")


def outcome(**changes: Any) -> TurnOutcome:
    base = TurnOutcome(
        request_id="r1", session_id="s1", org_id="org", checkpoint_id="ck", experiment_arm="control",
        surface="agent", served_ts=T0, latency_ms=2500, ttft_ms=100, prompt_tokens=10, completion_tokens=20,
        n_edits=2, counts={"tool_calls": 4, "tool_broken": 1, "tool_error": 1, "accept": 2, "reject": 1,
                           "undo": 1, "revert": 1, "dissatisfied": 1, "followups": 2, "clarifying": 3},
        persistence={30: 0.75, 120: 0.5}, persisted={30: 2, 120: 1}, checked={30: 2, 120: 2},
        horizon_s=120, provisional=False, finalised_wm=T0 + 10**6, finalised_by="watermark",
    )
    return replace(base, **changes)


def test_each_component_is_its_weight_times_its_feature() -> None:
    w = RewardWeights(persistence=2.0, accept=0.25, reject=-0.75, undo=-0.125, revert=-1.5, dissatisfied=-2.0,
                      latency_per_s=-0.1, tool_broken=-4.0, tool_error=-0.5, clarifying=-0.25)
    comps = components(outcome(), RewardSpec(version="w", weights=w))
    assert comps == pytest.approx({
        "persistence": 2.0 * 0.5, "accept": 0.25 * 2, "reject": -0.75, "undo": -0.125, "revert": -1.5,
        "dissatisfied": -2.0, "latency": -0.1 * 2.5, "tool_broken": -4.0, "tool_error": -0.5, "clarifying": -0.75,
    })
    rec = score(outcome(), RewardSpec(version="w", weights=w))
    assert rec["reward"] == pytest.approx(sum(comps.values()))
    assert rec["components"] == comps


def test_persistence_uses_the_final_horizon_and_is_zero_without_checks() -> None:
    assert components(outcome(), SPEC)["persistence"] == 0.5
    provisional = outcome(horizon_s=30, provisional=True, persistence={30: 0.75}, persisted={30: 2}, checked={30: 2})
    assert components(provisional, SPEC)["persistence"] == 0.75
    unchecked = outcome(persistence={30: 0.75}, persisted={30: 2}, checked={30: 2})
    assert components(unchecked, SPEC)["persistence"] == 0.0


def test_record_carries_the_outcome_features() -> None:
    rec = score(outcome(), SPEC)
    assert (rec["sample_id"], rec["spec_version"], rec["spec_hash"]) == ("r1", "v1", SPEC.content_hash)
    assert (rec["n_tool_calls"], rec["n_tool_broken"], rec["n_tool_error"], rec["n_clarifying"]) == (4, 1, 1, 3)
    assert (rec["n_followups"], rec["n_dissatisfied"], rec["n_accept"], rec["n_reject"]) == (2, 1, 2, 1)
    assert (rec["n_undo"], rec["n_revert"], rec["n_edits"], rec["latency_ms"]) == (1, 1, 2, 2500)
    assert rec["persisted"] == {30: 2, 120: 1} and rec["checked"] == {30: 2, 120: 2}
    assert (rec["provisional"], rec["horizon_s"], rec["finalised_by"]) == (0, 120, "watermark")
    assert score(outcome(), SPEC, spec_hash="pinned")["spec_hash"] == "pinned"
    empty = score(outcome(counts={}), SPEC)
    assert empty["n_tool_calls"] == 0 and empty["components"]["tool_broken"] == 0.0


def test_record_maps_are_copies_not_the_outcomes() -> None:
    o = outcome()
    rec = score(o, SPEC)
    rec["persisted"][30] = 99
    assert o.persisted[30] == 2


def test_reward_ids_are_deterministic_and_distinguish_spec_horizon_and_turn() -> None:
    final, prov = outcome(), outcome(horizon_s=30, provisional=True)
    assert reward_id("v1", final) == reward_id("v1", outcome(finalised_wm=0)) == score(final, SPEC)["reward_id"]
    ids = {reward_id("v1", final), reward_id("v2", final), reward_id("v1", prov),
           reward_id("v1", outcome(horizon_s=120, provisional=True)), reward_id("v1", outcome(request_id="r2")),
           reward_id("v1", outcome(session_id="s2")), reward_id("v1", outcome(org_id="org-2"))}
    assert len(ids) == 7  # a turn is (org, session, request): another session's turn of one request id is another row


def test_scoring_is_deterministic() -> None:
    assert score(outcome(), SPEC) == score(outcome(), SPEC)


weights = st.builds(
    RewardWeights,
    **{name: st.floats(-5, 5, allow_nan=False) for name in RewardWeights.model_fields if name != "tool_broken"},
    tool_broken=st.floats(-5, -1e-3),
)


@settings(max_examples=100, deadline=None)
@given(w=weights, broken=st.integers(1, 20), others=st.integers(0, 5))
def test_broken_tool_calls_always_count_against_the_reward(w: RewardWeights, broken: int, others: int) -> None:
    spec = RewardSpec(version="h", weights=w)
    base = outcome(counts={"tool_calls": others, "accept": others})
    more = outcome(counts={"tool_calls": others + broken, "accept": others, "tool_broken": broken})
    comps = components(more, spec)
    assert comps["tool_broken"] < 0
    assert comps["tool_broken"] == pytest.approx(w.tool_broken * broken)
    assert score(more, spec)["reward"] < score(base, spec)["reward"]


def typed(x: Any) -> Any:
    """A value with its types, dict key order and float bits made explicit (== on it is an exact comparison)."""
    if isinstance(x, dict):
        return [(typed(k), typed(v)) for k, v in x.items()]
    if isinstance(x, float):
        return ("float", x.hex())
    return (type(x).__name__, x)


def reference_score(o: TurnOutcome, spec: RewardSpec, spec_hash: str | None = None, revision: int = 0) -> dict[str, Any]:
    """The plain definition of a reward record: each field straight from the outcome and the spec."""
    from rewardflow.core.records import stable_id

    w, fp = spec.weights, o.final_persistence()
    comps = {
        "persistence": w.persistence * fp if fp is not None else 0.0,
        "accept": w.accept * o.count("accept"), "reject": w.reject * o.count("reject"),
        "undo": w.undo * o.count("undo"), "revert": w.revert * o.count("revert"),
        "dissatisfied": w.dissatisfied * o.count("dissatisfied"), "latency": w.latency_per_s * o.latency_ms / 1000.0,
        "tool_broken": w.tool_broken * o.count("tool_broken"), "tool_error": w.tool_error * o.count("tool_error"),
        "clarifying": w.clarifying * o.count("clarifying"),
    }
    return {
        "reward_id": stable_id(spec.version, o.org_id, o.session_id, o.request_id,
                               f"h{o.horizon_s}" if o.provisional else "final",
                               *([f"r{revision}"] if revision else [])),
        "sample_id": o.request_id, "spec_version": spec.version, "spec_hash": spec_hash or spec.content_hash,
        "org_id": o.org_id, "session_id": o.session_id, "checkpoint_id": o.checkpoint_id,
        "experiment_arm": o.experiment_arm, "surface": o.surface, "served_ts": o.served_ts,
        "finalised_wm": o.finalised_wm, "finalised_by": o.finalised_by, "provisional": int(o.provisional),
        "horizon_s": o.horizon_s, "revision": revision, "reward": round(sum(comps.values()), 12), "components": comps,
        "latency_ms": o.latency_ms, "ttft_ms": o.ttft_ms, "completion_tokens": o.completion_tokens,
        "n_edits": o.n_edits, "n_tool_calls": o.count("tool_calls"), "n_tool_broken": o.count("tool_broken"),
        "n_tool_error": o.count("tool_error"), "n_clarifying": o.count("clarifying"),
        "n_followups": o.count("followups"), "n_dissatisfied": o.count("dissatisfied"),
        "n_accept": o.count("accept"), "n_reject": o.count("reject"), "n_undo": o.count("undo"),
        "n_revert": o.count("revert"), "persistence": dict(o.persistence), "persisted": dict(o.persisted),
        "checked": dict(o.checked),
    }


COUNTER_NAMES = ["tool_calls", "tool_broken", "tool_error", "clarifying", "followups", "dissatisfied",
                 "accept", "reject", "undo", "revert"]


@settings(max_examples=150, deadline=None)
@given(
    w=weights,
    counts=st.dictionaries(st.sampled_from(COUNTER_NAMES), st.integers(0, 6), max_size=6),
    checked=st.dictionaries(st.sampled_from([30, 120]), st.integers(0, 3), max_size=2),
    survival=st.floats(0, 1),
    latency_ms=st.integers(0, 200_000),
    provisional=st.booleans(),
    request_id=st.text(min_size=1, max_size=8),
    spec_hash=st.sampled_from([None, "", "pinned"]),
    revision=st.sampled_from([0, 0, 1, 7]),
)
def test_score_is_exactly_the_plain_definition(w: RewardWeights, counts: dict[str, int], checked: dict[int, int],
                                               survival: float, latency_ms: int, provisional: bool, request_id: str,
                                               spec_hash: str | None, revision: int) -> None:
    """Bit for bit (float signs such as -0.5 × 0 = -0.0 included), key order and types, ids."""
    spec = RewardSpec(version="p", weights=w)
    o = outcome(counts=counts, checked=checked, persistence={h: survival for h in checked},
                persisted={h: n for h, n in checked.items()}, latency_ms=latency_ms, provisional=provisional,
                horizon_s=30 if provisional else 120, request_id=request_id)
    revision = 0 if provisional else revision  # (only final outcomes are corrected)
    want = reference_score(o, spec, spec_hash, revision)
    assert typed(score(o, spec, spec_hash, revision)) == typed(want)
    assert typed(components(o, spec)) == typed(want["components"])
    assert reward_id("p", o, revision) == want["reward_id"]


def test_specs_are_never_confused_even_when_many_or_short_lived() -> None:
    """Per-spec derived values are cached by object; a new spec (even at a reused address) gets its own."""
    o = outcome()
    for i in range(600):
        spec = RewardSpec(version=f"s{i % 3}", weights=RewardWeights(accept=i / 7, tool_broken=-1.0 - i))
        assert typed(score(o, spec)) == typed(reference_score(o, spec))
        del spec
