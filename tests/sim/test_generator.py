"""The simulator: deterministic under seed, realistic times, send order, noise accounting."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from rewardflow.events.models import AgentEdit, InferenceServed, PersistenceCheck
from rewardflow.events.validate import validate_event
from rewardflow.sim import NoiseConfig, SendGroup, Simulator, ab_config, ground_truth, simulate
from rewardflow.sim.config import SimConfig
from rewardflow.sim.profiles import CheckpointProfile, candidate_profile, plant_hack

NOISY = NoiseConfig(duplicate_rate=0.05, out_of_order_rate=0.1, late_rate=0.05, malformed_rate=0.05, orphan_rate=0.05)


def _fingerprint(groups: list[SendGroup]) -> list[tuple[object, ...]]:
    return [(g.due_ms, g.send_at_s, g.session_id, g.raw, g.late, tuple(e.model_dump_json() for e in g.events))
            for g in groups]


def test_same_seed_same_stream_and_truth() -> None:
    cfg = ab_config(sessions=15, turns_per_session=4, seed=11, noise=NOISY)
    a, ta = simulate(cfg)
    b, tb = simulate(cfg)
    assert _fingerprint(a) == _fingerprint(b)
    assert ta.to_dict() == tb.to_dict() == ground_truth(cfg).to_dict()


def test_other_seed_other_stream() -> None:
    a, _ = simulate(ab_config(sessions=5, turns_per_session=3, seed=1))
    b, _ = simulate(ab_config(sessions=5, turns_per_session=3, seed=2))
    assert _fingerprint(a) != _fingerprint(b)


def test_events_are_valid_and_times_realistic() -> None:
    cfg = ab_config(sessions=10, turns_per_session=5, seed=3, start_ms=1_800_000_000_000)
    groups, truth = simulate(cfg)
    events = [e for g in groups for e in g.events]
    assert len({e.event_id for e in events}) == len(events) == truth.events_generated
    for e in events:
        validate_event(e.model_dump())
        assert e.ts >= cfg.start_ms
    edits = {e.edit_id: e.ts for e in events if isinstance(e, AgentEdit)}
    checks = [e for e in events if isinstance(e, PersistenceCheck)]
    assert {c.horizon_s for c in checks} == {30, 120, 300, 600, 900}
    for c in checks:
        assert 0 <= c.ts - (edits[c.edit_id] + c.horizon_s * 1000) <= 1_500
    served = [e for e in events if isinstance(e, InferenceServed)]
    assert {s.experiment_arm for s in served} == {"control", "treatment"}
    assert {(s.experiment_arm, s.checkpoint_id) for s in served} == {("control", "ckpt-base"), ("treatment", "ckpt-cand")}
    assert len({s.surface for s in served}) >= 3


def test_send_order_and_groups() -> None:
    cfg = ab_config(sessions=12, turns_per_session=4, seed=5, noise=NOISY, max_group_events=3)
    groups, truth = simulate(cfg)
    dues = [g.due_ms for g in groups]
    assert dues == sorted(dues)
    for g in groups:
        assert {e.session_id for e in g.events} <= {g.session_id}
        assert len(g.events) <= 3
        assert (g.raw is None) == bool(g.events)
        assert not g.late or len(g.events) == 1
    assert sum(g.raw is not None for g in groups) == truth.malformed
    assert sum(g.late for g in groups) == truth.late
    assert sum(len(g.events) for g in groups) == truth.events_sent == truth.events_generated + truth.duplicates


def test_time_scale_changes_only_the_send_schedule() -> None:
    fast, _ = simulate(ab_config(sessions=6, turns_per_session=3, seed=9, time_scale=0))
    paced, _ = simulate(ab_config(sessions=6, turns_per_session=3, seed=9, time_scale=60))
    assert [g.events for g in fast] == [g.events for g in paced]
    assert all(g.send_at_s == 0 for g in fast)
    for g in paced:
        assert g.send_at_s == pytest.approx((g.due_ms - 1_790_000_000_000) / 60_000)


def test_truth_needs_a_full_pass() -> None:
    sim = Simulator(ab_config(sessions=2, turns_per_session=2))
    with pytest.raises(RuntimeError):
        _ = sim.truth
    list(sim.stream())
    assert sim.truth.sessions == 2


def test_noise_counts_are_planted() -> None:
    _, truth = simulate(ab_config(sessions=40, turns_per_session=5, seed=2, noise=NOISY))
    assert truth.duplicates > 0 and truth.out_of_order > 0 and truth.late > 0
    assert truth.malformed == sum(truth.malformed_by_kind.values()) > 0
    assert truth.orphan_turns == sum(c.orphan_turns for c in truth.checkpoints.values()) > 0
    total = sum(c.turns + c.orphan_turns for c in truth.checkpoints.values())
    assert total == 40 * 5


def test_profile_and_config_validation() -> None:
    with pytest.raises(ValidationError, match="must not increase"):
        CheckpointProfile(checkpoint_id="x", persistence={30: 0.5, 900: 0.7})
    with pytest.raises(ValidationError, match="distinct"):
        ab_config("same", "same")
    with pytest.raises(ValidationError, match="grace_ms"):
        ab_config(noise=NoiseConfig(out_of_order_rate=0.1, max_jitter_ms=50_000))
    with pytest.raises(ValueError, match="unknown hack"):
        plant_hack(candidate_profile("c"), "nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown candidate kind"):
        ab_config(candidate_kind="nope")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="need a dodge"):
        CheckpointProfile(checkpoint_id="x", dodge_fail_rate=0.5)


def test_candidate_carries_the_published_deltas() -> None:
    cfg = ab_config()
    base, cand = (a.profile for a in cfg.arms)
    assert cand.final_persistence / base.final_persistence - 1 == pytest.approx(0.0228)
    assert cand.dissatisfied_rate / base.dissatisfied_rate - 1 == pytest.approx(-0.0313)
    assert cand.latency.quantile(0.95) / base.latency.quantile(0.95) - 1 == pytest.approx(-0.103)
    assert isinstance(cfg, SimConfig) and Counter(a.name for a in cfg.arms) == {"control": 1, "treatment": 1}


def test_regressed_candidate_is_clearly_worse() -> None:
    base, cand = (a.profile for a in ab_config(candidate_kind="regress").arms)
    assert cand.checkpoint_id == "ckpt-cand"
    assert cand.final_persistence / base.final_persistence == pytest.approx(0.8)
    assert cand.dissatisfied_rate / base.dissatisfied_rate == pytest.approx(1.25)
    truth = ground_truth(ab_config(candidate_kind="regress", sessions=80, turns_per_session=5, seed=4))
    rate = {ck: t.to_dict()["persistence_rate"] for ck, t in truth.checkpoints.items()}
    assert rate["ckpt-cand"] < rate["ckpt-base"] - 0.08


def test_story_config_three_arms_the_gaming_one_with_the_published_gains_and_the_hack() -> None:
    from rewardflow.sim import TREATMENT_B, story_config
    from rewardflow.sim.profiles import candidate_profile

    cfg = story_config(sessions=500, seed=3)
    arms = {a.name: a for a in cfg.arms}
    assert [a.profile.checkpoint_id for a in cfg.arms] == ["ckpt-base", "ckpt-cand", "ckpt-cand-b"]
    assert [a.share for a in cfg.arms] == [0.4, 0.4, 0.2]
    game, cand = arms[TREATMENT_B].profile, arms["treatment"].profile
    assert game.dodge == "over-ask" and cand.dodge is None
    assert cand == candidate_profile("ckpt-cand")
    assert game.persistence == cand.persistence and game.latency == cand.latency
    turns = ground_truth(cfg).turns_per_checkpoint
    assert 0.15 < turns["ckpt-cand-b"] / sum(turns.values()) < 0.25
    regress = story_config(candidate_kind="regress", hack="broken-tools")
    assert regress.arms[1].profile.final_persistence < regress.arms[0].profile.final_persistence
    assert regress.arms[2].profile.dodge == "broken-tools"
