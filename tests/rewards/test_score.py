"""score(): components, the reward, and the record built from a TurnOutcome."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardflow.core.turn import TurnOutcome
from rewardflow.rewards.score import components, reward_id, score
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


def test_reward_ids_are_deterministic_and_distinguish_spec_and_horizon() -> None:
    final, prov = outcome(), outcome(horizon_s=30, provisional=True)
    assert reward_id("v1", final) == reward_id("v1", outcome(finalised_wm=0)) == score(final, SPEC)["reward_id"]
    ids = {reward_id("v1", final), reward_id("v2", final), reward_id("v1", prov),
           reward_id("v1", outcome(horizon_s=120, provisional=True)), reward_id("v1", outcome(request_id="r2"))}
    assert len(ids) == 5


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
