"""Verdicts: the gate and the monitors together decide; gains and published directions are reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rewardflow.analysis.ab import compare
from rewardflow.analysis.gate import DEFAULT_POLICY, Policy, Rule, evaluate, load_policy
from rewardflow.analysis.verdict import PUBLISHED_DIRECTIONS, verdict_of
from tests.analysis.conftest import BASE, CAND, rewards, synthetic_rows


def _alert(checkpoint: str, monitor: str) -> dict[str, Any]:
    return {"checkpoint_id": checkpoint, "monitor": monitor}


def test_clean_candidate_deploys_with_its_gains_and_directions() -> None:
    report = compare(rewards("clean"), BASE, CAND)
    gate = evaluate(report, Policy(rules=[Rule(metric="persistence_rate", max_drop_points=0.5, test="regression")]))
    v = verdict_of(report, gate, [_alert("ckpt-other", "edit_rate")])  # another checkpoint's alert is not ours
    assert v.deploy and v.failed_rules == [] and v.alerts == []
    assert "persistence_rate" in v.gains and v.regressions == []
    assert set(v.published_directions) == set(PUBLISHED_DIRECTIONS) and all(v.published_directions.values())
    assert v.headline.startswith("DEPLOY") and "3/3 published directions" in v.headline


def test_an_alert_alone_blocks_a_candidate_that_passes_the_gate() -> None:
    report = compare(rewards("clean"), BASE, CAND)
    gate = evaluate(report, Policy())
    v = verdict_of(report, gate, [_alert(CAND, "clarifying_rate"), _alert(CAND, "edit_rate")])
    assert gate.passed and not v.deploy
    assert v.alerts == ["clarifying_rate", "edit_rate"]
    assert v.headline == "BLOCK: Goodhart alerts: clarifying_rate, edit_rate"


def test_a_failed_rule_is_named_and_regressions_listed() -> None:
    rows = synthetic_rows(BASE, 3000, 1, persist=0.8) + synthetic_rows(CAND, 3000, 2, persist=0.6, latency_median=1500)
    report = compare(rows, BASE, CAND)
    gate = evaluate(report, load_policy(DEFAULT_POLICY))
    v = verdict_of(report, gate, [])
    assert not v.deploy and "persistence_rate" in v.failed_rules
    assert {"persistence_rate", "latency_p50"} <= set(v.regressions)
    assert v.published_directions["persistence_rate"] is False and v.published_directions["latency_p50"] is False
    assert v.headline.startswith("BLOCK: gate failed on ") and "persistence_rate" in v.headline
    doc = v.to_dict()
    assert doc["headline"] == v.headline and doc["deploy"] is False


def test_the_shipped_policy_is_package_data() -> None:
    assert DEFAULT_POLICY.is_file() and DEFAULT_POLICY.parent.name == "analysis"
    assert load_policy(Path("default")) == load_policy(DEFAULT_POLICY)
