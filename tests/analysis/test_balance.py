"""Exclusion balance over rows made by the stream's own core from simulated traffic.

A candidate whose clients send the served event of some failing turns malformed (``hide-failures``)
loses those turns to dead letters and orphans: its mean reward rises while nothing it does changed.
The balance must alert in its first window and the gate must refuse it; arms that lose turns alike
must stay quiet.
"""

from __future__ import annotations

import base64
from collections import Counter
from functools import cache
from typing import Any

import orjson

from rewardflow.analysis.ab import compare
from rewardflow.analysis.balance import (ArmExclusions, BalanceConfig, Excluded, attribute, balance, balance_alerts,
                                         from_dead_letters, from_exclusions, mean_rewards)
from rewardflow.analysis.gate import DEFAULT_POLICY, Policy, Rule, evaluate, load_policy
from rewardflow.core.config import JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.sim import ab_config, run_through_core, simulate
from rewardflow.sim.noise import NoiseConfig
from rewardflow.sim.profiles import baseline_profile, plant_hack

BASE, CAND = "ckpt-base", "ckpt-cand"
WINDOW_S = 3600
CFG = JoinConfig(window_sizes_s=(300, WINDOW_S))


@cache
def run(hide: bool, noise: bool = False) -> Outputs:
    base = baseline_profile(BASE)
    cand = base.model_copy(update={"checkpoint_id": CAND})
    if hide:
        cand = plant_hack(cand, "hide-failures")
    cfg = ab_config(base, cand, sessions=160, turns_per_session=8, seed=5, batch_window_ms=40_000,
                    duration_s=1_800, noise=NoiseConfig(orphan_rate=0.02, malformed_rate=0.01) if noise else False)
    groups, _ = simulate(cfg)
    return run_through_core(groups, cfg=CFG, partitions=2)


def _inputs(out: Outputs) -> tuple[list[dict[str, Any]], list[Excluded], dict[str, str]]:
    windows = [dict(w) for w in out.windows]
    items = [*from_exclusions(dict(e) for e in (*out.excluded, *out.late)),
             *from_dead_letters(dict(d) for d in out.dead)]
    sessions = {(str(r["org_id"]), str(r["session_id"])): str(r["checkpoint_id"]) for r in out.rewards}
    return windows, items, sessions


def _balance(out: Outputs) -> Any:
    windows, items, sessions = _inputs(out)
    return balance(windows, items, sessions, window_s=WINDOW_S, spec_version="v1")


def test_hidden_failures_are_counted_against_the_candidate_through_its_sessions() -> None:
    b = _balance(run(hide=True))
    cand, base = b.overall[CAND], b.overall[BASE]
    assert cand.count("dead_letter") > 20 and cand.count("orphan") > 20
    # a hidden turn is one unit: its dead-lettered served event and its orphaned rest name the same turn
    assert cand.units["dead_letter"] <= cand.units["orphan"]
    assert base.count("excluded") == 0 and not b.unattributed
    assert cand.population == cand.turns + cand.count("orphan")


def test_hidden_failures_raise_the_alert_in_the_first_window() -> None:
    out = run(hide=True)
    windows, _, _ = _inputs(out)
    b = _balance(out)
    alerts = balance_alerts(b, BASE, rewards=mean_rewards(windows, window_s=WINDOW_S, spec_version="v1"))
    first = min(start for start, _ in b.windows)
    hits = {(a["monitor"], a["window_start"]) for a in alerts}
    assert ("exclusion_orphan", first) in hits and ("exclusion_excluded", first) in hits
    assert all(a["checkpoint_id"] == CAND and a["baseline"] == BASE and a["value"] > a["baseline_value"] for a in alerts)
    assert len({a["alert_id"] for a in alerts}) == len(alerts)
    assert alerts == balance_alerts(b, BASE, rewards=mean_rewards(windows, window_s=WINDOW_S, spec_version="v1"))
    assert any(a["reward_delta"] > 0 for a in alerts)  # the hidden failures lift the candidate's mean reward


def test_arms_that_lose_turns_alike_raise_nothing() -> None:
    b = _balance(run(hide=False, noise=True))
    assert b.overall[CAND].count("orphan") > 0 and b.overall[BASE].count("orphan") > 0
    assert balance_alerts(b, BASE) == []
    assert sum(b.unattributed.values()) > 0  # noise dead letters of no known session are counted apart


def test_the_gate_refuses_a_candidate_whose_exclusions_are_biased() -> None:
    policy = load_policy(DEFAULT_POLICY).model_copy(update={"min_turns": 100})
    for hide, passes in ((True, False), (False, True)):
        out = run(hide=hide)
        rows = [dict(r) for r in out.rewards]
        report = compare(rows, BASE, CAND, spec_version="v1", exclusions=_balance(out).overall)
        gate = evaluate(report, policy)
        rule = next(r for r in gate.results if r.metric == "excluded_rate")
        assert rule.passed is passes, rule.reason
        assert report.exclusions is not None and report.exclusions[BASE]["excluded"] == 0
    hidden = compare([dict(r) for r in run(hide=True).rewards], BASE, CAND, spec_version="v1",
                     exclusions=_balance(run(hide=True)).overall)
    m = hidden.metrics["orphan_rate"]
    assert m.candidate > 0.05 and m.ci_low > 0 and m.verdict == "worse"


def test_a_report_without_exclusion_counts_leaves_the_rule_unevaluated() -> None:
    rows = [dict(r) for r in run(hide=True).rewards]
    report = compare(rows, BASE, CAND, spec_version="v1")
    assert "excluded_rate" not in report.metrics and report.exclusions is None
    gate = evaluate(report, Policy(rules=[Rule(metric="excluded_rate", max_rise_points=1)]))
    assert gate.passed and "not evaluated" in gate.results[0].reason


def test_attribution_prefers_the_rows_own_checkpoint_and_counts_the_rest() -> None:
    items = [Excluded("late", "ck-a", "o", "s1", "r1", 10), Excluded("orphan", "", "o", "s1", "r2", 10),
             Excluded("orphan", "", "o", "s-unknown", "r3", 10), Excluded("orphan", "", "other", "s1", "r4", 10)]
    kept, lost = attribute(items, {("o", "s1"): "ck-b"})
    assert [(x.reason, x.checkpoint_id) for x in kept] == [("late", "ck-a"), ("orphan", "ck-b")]
    assert lost == Counter({"orphan": 2})  # another org's session of the same id is not that session


def test_dead_letters_name_their_turn_when_their_json_does_but_never_their_checkpoint() -> None:
    def row(i: int, original: bytes, session: str = "") -> dict[str, Any]:
        return {"dead_letter_id": f"d{i}", "session_id": session, "original_b64": base64.b64encode(original).decode()}

    served = orjson.dumps({"org_id": "o", "session_id": "s1", "request_id": "r1", "checkpoint_id": "ck-cand", "ts": 5})
    got = from_dead_letters([row(1, served), row(2, b"{not json", "s2"), row(3, b"[1, 2]")])
    assert [(x.checkpoint_id, x.org_id, x.session_id, x.unit, x.ts) for x in got] == [
        ("", "o", "s1", "o\ts1\tr1", 5), ("", "", "s2", "dl:d2", None), ("", "", "", "dl:d3", None)]
    # a forged body naming a candidate is charged to the checkpoint its session really has, or to none
    kept, lost = attribute(got, {("o", "s1"): "ck-base"})
    assert [(x.checkpoint_id, x.unit) for x in kept] == [("ck-base", "o\ts1\tr1")]
    assert lost == Counter({"dead_letter": 2})


def test_rates_test_both_directions_and_respect_min_samples() -> None:
    def arm(turns: int, orphans: int) -> ArmExclusions:
        a = ArmExclusions(turns)
        a.units["orphan"] = {f"o{i}" for i in range(orphans)}
        return a

    from rewardflow.analysis.balance import Balance

    b = Balance({}, {(0, "base"): arm(1000, 100), (0, "cand"): arm(1000, 5)}, 60, {})
    (alert,) = [a for a in balance_alerts(b, "base") if a["monitor"] == "exclusion_orphan"]
    assert alert["value"] < alert["baseline_value"]  # the baseline losing more turns biases the A/B too
    assert balance_alerts(b, "base", BalanceConfig(min_samples=2_000)) == []
