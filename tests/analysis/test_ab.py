"""A/B report over reward rows computed by the pure core from simulated traffic."""

from __future__ import annotations

import math

import orjson
import pyarrow as pa
import pytest

from rewardflow.analysis.ab import METRICS, compare
from rewardflow.analysis.rows import AnalysisError
from rewardflow.sim.truth import nearest_rank
from tests.analysis.conftest import BASE, CAND, rewards, scenario


def test_planted_differences_show_with_the_right_sign() -> None:
    rep = compare(rewards("clean"), BASE, CAND, spec_version="v1")
    m = rep.metrics
    assert m["persistence_rate"].delta > 0 and m["persistence_rate"].verdict == "better"
    assert m["latency_p50"].delta < 0 and m["latency_p95"].delta < 0
    assert m["dissatisfied_rate"].delta < 0
    assert m["mean_reward"].delta > 0
    assert set(m) == set(METRICS)


def test_values_equal_the_ground_truth() -> None:
    out, truth = scenario("clean")
    rep = compare(rewards("clean"), BASE, CAND, spec_version="v1")
    for ck, value in ((BASE, "baseline"), (CAND, "candidate")):
        t = truth.checkpoints[ck].to_dict()
        assert rep.turns[ck] == t["turns"]
        for name in ("persistence_rate", "dissatisfied_rate", "clarifying_rate", "broken_tool_rate", "edit_rate"):
            assert getattr(rep.metrics[name], value) == pytest.approx(t[name]), name
        assert getattr(rep.metrics["latency_p95"], value) == nearest_rank(truth.checkpoints[ck].latencies_ms, 0.95)
    m = rep.metrics["persistence_rate"]
    assert m.rel_delta == pytest.approx(m.candidate / m.baseline - 1)
    assert m.ci_low < m.delta < m.ci_high


def test_identical_arms_are_neutral() -> None:
    rep = compare(rewards("same"), BASE, CAND, spec_version="v1")
    significant = [n for n, m in rep.metrics.items() if m.significant]
    assert len(significant) <= 1  # 8 metrics at 95 %: at most a chance hit


def test_hacks_show_in_guard_metrics() -> None:
    broken = compare(rewards("broken"), BASE, CAND).metrics
    # the hack replaces only the worst hard turns, so the edit rate falls but not significantly at this size
    assert broken["broken_tool_rate"].verdict == "worse" and broken["edit_rate"].delta < 0
    asking = compare(rewards("asking"), BASE, CAND).metrics
    assert asking["clarifying_rate"].verdict == "worse" and asking["edit_rate"].verdict == "worse"


def test_only_final_rows_once_per_reward_id() -> None:
    rows = rewards("clean")
    assert any(r["provisional"] for r in rows)
    final = [r for r in rows if not r["provisional"]]
    a = compare(final, BASE, CAND, spec_version="v1")
    b = compare(rows + final[:200], BASE, CAND, spec_version="v1")  # provisional rows and redeliveries
    assert a == b


def test_spec_choice() -> None:
    rows = rewards("clean")
    assert compare(rows, BASE, CAND).spec_version == "v2"  # the highest present by default
    with pytest.raises(AnalysisError, match="present: v1, v2"):
        compare(rows, BASE, CAND, spec_version="v9")
    with pytest.raises(AnalysisError, match="ckpt-nope"):
        compare(rows, BASE, "ckpt-nope")
    with pytest.raises(AnalysisError, match="lack column"):
        compare([{"reward_id": "x"}], BASE, CAND)


def test_arrow_rows_with_map_columns_give_the_same_report() -> None:
    rows = [r for r in rewards("clean") if not r["provisional"]]
    cols = ("reward_id", "checkpoint_id", "spec_version", "provisional", "horizon_s", "reward", "latency_ms",
            "n_edits", "n_dissatisfied", "n_clarifying", "n_tool_broken")
    data = {c: [r[c] for r in rows] for c in cols}
    mtype = pa.map_(pa.uint32(), pa.uint32())
    for c in ("persisted", "checked"):
        data[c] = pa.array([list(r[c].items()) for r in rows], type=mtype)
    table = pa.table(data)
    assert compare(table, BASE, CAND, spec_version="v1") == compare(rows, BASE, CAND, spec_version="v1")


def test_to_json_is_valid_json_with_nulls_for_nan() -> None:
    rows = [dict(r, n_edits=0, persisted={}, checked={}) for r in rewards("same")]
    rep = compare(rows, BASE, CAND, spec_version="v1")
    assert math.isnan(rep.metrics["persistence_rate"].baseline)
    doc = orjson.loads(rep.to_json())
    assert doc["metrics"]["persistence_rate"]["baseline"] is None
    assert doc["metrics"]["persistence_rate"]["verdict"] == "n/a"
    assert doc["turns"] == rep.turns and doc["spec_version"] == "v1"


def test_two_sessions_turns_sharing_a_request_id_are_two_samples() -> None:
    from rewardflow.analysis.rows import final_rows

    row = {**[r for r in rewards("clean") if not r["provisional"]][0], "org_id": "org-a", "session_id": "s1"}
    other = {**row, "reward_id": "other", "session_id": "s2", "reward": row["reward"] + 1}
    kept, _ = final_rows([row, other, {**row}], spec_version=row["spec_version"])  # (the copy is a redelivery)
    assert sorted(r["session_id"] for r in kept) == ["s1", "s2"]
