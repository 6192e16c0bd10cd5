"""The deploy gate: policy files, rule semantics, and verdicts on simulated candidates."""

from __future__ import annotations

from pathlib import Path

import pytest

from rewardflow.analysis.ab import compare
from rewardflow.analysis.gate import Policy, PolicyError, Rule, check_rule, evaluate, load_policy
from tests.analysis.conftest import BASE, CAND, rewards, synthetic_rows

EXAMPLE = Path(__file__).parents[2] / "src" / "rewardflow" / "analysis" / "deploy-gate.toml"


def test_example_policy_loads_and_inherits_defaults() -> None:
    policy = load_policy(EXAMPLE)
    assert policy.min_turns == 500 and len(policy.rules) >= 5
    assert all(r.test == "regression" for r in policy.rules)
    assert {r.confidence for r in policy.rules} == {0.95, 0.99}


@pytest.mark.parametrize(("body", "needle"), [
    ('[[rule]]\nmetric = "nope"\nmax_drop_pct = 1', "unknown metric"),
    ('[[rule]]\nmetric = "latency_p95"\nmax_rise_pct = 1\nmax_rise = 3', "exactly one"),
    ('[[rule]]\nmetric = "latency_p95"\nmax_rise_points = 1', "rate metrics only"),
    ('[[rule]]\nmetric = "edit_rate"\nmax_drop_points = -1', "greater than or equal"),
    ("[[rule]\n", "Expected"),
    ('surprise = 1', "surprise"),
])
def test_invalid_policies_fail_with_one_line(tmp_path: Path, body: str, needle: str) -> None:
    path = tmp_path / "gate.toml"
    path.write_text(body)
    with pytest.raises(PolicyError, match=needle) as info:
        load_policy(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="No such file"):
        load_policy(tmp_path / "absent.toml")


def test_gate_passes_a_clean_candidate_and_fails_regressions() -> None:
    policy = load_policy(EXAMPLE).model_copy(update={"min_turns": 100})
    assert evaluate(compare(rewards("clean"), BASE, CAND), policy).passed
    broken = evaluate(compare(rewards("broken"), BASE, CAND), policy)
    assert not broken.passed
    assert {r.metric for r in broken.results if not r.passed} >= {"broken_tool_rate"}
    asking = evaluate(compare(rewards("asking"), BASE, CAND), policy)
    assert {r.metric for r in asking.results if not r.passed} >= {"clarifying_rate", "edit_rate"}
    # the clean candidate as baseline: the old checkpoint regresses
    backwards = evaluate(compare(rewards("clean"), CAND, BASE), policy)
    failed = {r.metric for r in backwards.results if not r.passed}
    assert {"persistence_rate", "dissatisfied_rate"} <= failed


def test_min_turns() -> None:
    result = evaluate(compare(rewards("clean"), BASE, CAND), Policy(min_turns=10_000))
    assert not result.passed and result.results[0].metric == "min_turns"


def test_non_inferiority_needs_evidence_regression_needs_proof() -> None:
    report = compare(rewards("same"), BASE, CAND, spec_version="v1")
    m = report.metrics["persistence_rate"]
    assert m.ci_high - m.ci_low > 0.02  # a few hundred edits: wide interval
    strict = Rule(metric="persistence_rate", max_drop_points=0.5, test="non_inferiority")
    lenient = Rule(metric="persistence_rate", max_drop_points=0.5, test="regression")
    assert not check_rule(strict, m).passed  # cannot show the drop is under 0.5 pp
    assert check_rule(lenient, m).passed  # cannot show a drop beyond 0.5 pp either
    wide = Rule(metric="persistence_rate", max_drop_points=50, test="non_inferiority")
    assert check_rule(wide, m).passed
    result = check_rule(strict, m)
    assert "worst case" in result.reason and "allowed drop of 0.50 pp" in result.reason


def test_relative_and_absolute_margins() -> None:
    base = synthetic_rows(BASE, 4_000, 1, latency_median=1_000)
    faster = base + synthetic_rows(CAND, 4_000, 2, latency_median=800)
    m = compare(faster, BASE, CAND).metrics["latency_p95"]
    assert m.delta < 0 and m.rel_ci_high < 0
    assert check_rule(Rule(metric="latency_p95", max_rise_pct=5, test="non_inferiority"), m).passed
    assert check_rule(Rule(metric="latency_p95", max_rise=100, test="non_inferiority"), m).passed
    slower = base + synthetic_rows(CAND, 4_000, 3, latency_median=1_150)
    up = compare(slower, BASE, CAND).metrics["latency_p95"]
    r = check_rule(Rule(metric="latency_p95", max_rise_pct=5, test="regression"), up)
    assert not r.passed and "best case +" in r.reason and "%" in r.reason
    r = check_rule(Rule(metric="latency_p95", max_rise=50, test="regression"), up)
    assert not r.passed and " ms" in r.reason


def test_gate_on_synthetic_persistence_drop() -> None:
    rows = synthetic_rows(BASE, 6_000, 4, persist=0.70) + synthetic_rows(CAND, 6_000, 5, persist=0.66)
    rule = Rule(metric="persistence_rate", max_drop_points=0.5, test="regression")
    m = compare(rows, BASE, CAND).metrics["persistence_rate"]
    assert not check_rule(rule, m).passed
    same = synthetic_rows(BASE, 6_000, 6, persist=0.70) + synthetic_rows(CAND, 6_000, 7, persist=0.70)
    assert check_rule(rule, compare(same, BASE, CAND).metrics["persistence_rate"]).passed


def test_policy_defaults_apply_to_rules_built_in_python() -> None:
    m = compare(rewards("same"), BASE, CAND, spec_version="v1").metrics["persistence_rate"]
    rule = Rule(metric="persistence_rate", max_drop_points=0.5)
    report = compare(rewards("same"), BASE, CAND, spec_version="v1")
    lenient = evaluate(report, Policy(test="regression", confidence=0.995, rules=[rule]))
    assert lenient.passed and "99.5% CI" in lenient.results[0].reason
    assert not check_rule(rule, m).passed  # the module default is non_inferiority
