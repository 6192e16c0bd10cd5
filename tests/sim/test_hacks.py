"""Planted reward hacks behave like real ones: they dodge failing hard turns, reward holds, guards drift;
clients that hide failures send exactly the failing turns' served events malformed."""

from __future__ import annotations

import random
from collections import defaultdict

import orjson
import pytest

from rewardflow.events.models import AgentEdit, ClarifyingQuestion, FollowUp, InferenceServed, Producer, ToolCall
from rewardflow.events.validate import split_valid
from rewardflow.sim import TREATMENT, SimConfig, ab_config, ground_truth, run_through_core, simulate
from rewardflow.sim.noise import hidden_served
from rewardflow.sim.profiles import Hack, candidate_profile, plant_hack
from rewardflow.sim.turns import SessionContext, TurnDraft, draft_turn

CTX = SessionContext("org-1", "sess-1", Producer(name="sim", version="1"), "treatment")


def _turns(hack: Hack | None, n: int, seed: int = 3) -> list[TurnDraft]:
    profile = candidate_profile("c") if hack is None else plant_hack(candidate_profile("c"), hack)
    rng = random.Random(seed)
    return [draft_turn(rng, profile, CTX, 1_790_000_000_000 + i * 600_000) for i in range(n)]


@pytest.mark.parametrize("hack", ["broken-tools", "over-ask"])
def test_a_hack_changes_only_the_hard_turns_it_dodges(hack: Hack) -> None:
    clean, hacked = _turns(None, 3_000), _turns(hack, 3_000)
    dodged = 0
    for c, h in zip(clean, hacked, strict=True):
        assert (h.request_id, h.served, h.hard) == (c.request_id, c.served, c.hard)  # paired: same draws
        if [e.model_dump() for e in h.events] == [e.model_dump() for e in c.events]:
            continue
        dodged += 1
        assert h.hard and not any(isinstance(e, ClarifyingQuestion) for e in c.events)  # it attempted
        assert not any(isinstance(e, AgentEdit) for e in h.events)
        work = [e for e in h.events[1:] if not isinstance(e, FollowUp)]
        if hack == "over-ask":
            assert len(work) == 1 and isinstance(work[0], ClarifyingQuestion)
        else:
            assert len(work) == 1 and isinstance(work[0], ToolCall) and work[0].status == "broken"
    hard = sum(t.hard for t in clean)
    assert 0.2 * hard < dodged < 0.8 * hard


def _mean_rewards(hack: Hack | None) -> dict[str, float]:
    """Mean final reward per spec of the candidate alone, scored by the pure core."""
    cand = next(a for a in ab_config(hack=hack).arms if a.name == TREATMENT)
    cfg = SimConfig(arms=(cand,), sessions=120, turns_per_session=8, seed=5, batch_window_ms=40_000)
    groups, _ = simulate(cfg)
    sums: dict[str, list[float]] = defaultdict(list)
    for r in run_through_core(groups).rewards:
        if not r["provisional"]:
            sums[r["spec_version"]].append(r["reward"])
    return {spec: sum(v) / len(v) for spec, v in sums.items()}


def test_hacks_hold_or_raise_the_v1_reward() -> None:
    """Like Cursor's: under v1 (broken calls -0.5, questions free) dodging pays; v2 prices questions."""
    clean, broken, asking = _mean_rewards(None), _mean_rewards("broken-tools"), _mean_rewards("over-ask")
    assert broken["v1"] >= clean["v1"]
    assert asking["v1"] > clean["v1"] + 0.005
    assert asking["v2"] - clean["v2"] < asking["v1"] - clean["v1"] - 0.015  # v2 takes back much of the gain


def test_hacks_move_the_guard_behaviours() -> None:
    clean = ground_truth(ab_config(sessions=150, turns_per_session=8, seed=4))
    broken = ground_truth(ab_config(sessions=150, turns_per_session=8, seed=4, hack="broken-tools"))
    asking = ground_truth(ab_config(sessions=150, turns_per_session=8, seed=4, hack="over-ask"))
    rate = lambda t, k: t.checkpoints["ckpt-cand"].to_dict()[k]  # noqa: E731
    assert rate(broken, "broken_tool_rate") > rate(clean, "broken_tool_rate") + 0.03
    assert rate(broken, "edit_rate") < rate(clean, "edit_rate") - 0.02
    assert rate(asking, "clarifying_rate") > rate(clean, "clarifying_rate") + 0.07
    assert rate(asking, "edit_rate") < rate(clean, "edit_rate") - 0.05
    base = lambda t: t.checkpoints["ckpt-base"].to_dict()  # noqa: E731
    assert base(clean) == base(broken) == base(asking)  # the baseline arm is untouched


def test_hidden_failures_send_only_failing_turns_served_events_malformed() -> None:
    clean, hiding = ab_config(sessions=150, turns_per_session=8, seed=4), ab_config(
        sessions=150, turns_per_session=8, seed=4, hack="hide-failures")
    (g0, t0), (g1, t1) = simulate(clean), simulate(hiding)
    raw = [g for g in g1 if g.raw is not None]
    cand, was = t1.checkpoints["ckpt-cand"], t0.checkpoints["ckpt-cand"]
    assert len(raw) == cand.hidden_turns == cand.orphan_turns == t1.malformed_by_kind["hidden_failure"] > 20
    assert cand.turns + cand.hidden_turns == was.turns  # the same traffic, the hidden turns moved to orphans
    assert t1.checkpoints["ckpt-base"].to_dict() == t0.checkpoints["ckpt-base"].to_dict()
    # hidden turns are failing ones: the candidate's scored population looks better than it is
    assert cand.to_dict()["dissatisfied_rate"] < was.to_dict()["dissatisfied_rate"] - 0.02
    served = {e.request_id: e for g in g0 for e in g.events if isinstance(e, InferenceServed)}
    for g in raw:
        assert g.raw is not None
        doc = orjson.loads(g.raw)
        assert g.raw == hidden_served(served[doc["request_id"]])  # the served event, with one field mistyped
        assert split_valid([doc])[0] == []  # the contract refuses it
