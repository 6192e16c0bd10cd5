"""The HTML + JSON report and the window merge behind its charts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from rewardflow.analysis.ab import compare
from rewardflow.analysis.gate import evaluate, load_policy
from rewardflow.analysis.report_html import write_report
from rewardflow.analysis.windows import SERIES, merge_windows
from rewardflow.sim import ab_config, run_through_core, simulate
from tests.analysis.conftest import BASE, CAND, rewards, scenario
from tests.analysis.test_gate import EXAMPLE


def test_write_report_files_and_series(tmp_path: Path) -> None:
    out, truth = scenario("clean")
    report = compare(rewards("clean"), BASE, CAND, spec_version="v1")
    gate = evaluate(report, load_policy(EXAMPLE))
    html_path, json_path = write_report(report, list(out.windows), tmp_path / "r", gate=gate)
    html = html_path.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") == 4
    assert "<script" not in html and "https://" not in html and "<link" not in html
    for title in ("Mean reward", "Edit persistence", "Dissatisfied", "Latency p95"):
        assert title in html
    assert BASE in html and CAND in html and "Deploy gate" in html
    doc = orjson.loads(json_path.read_bytes())
    assert doc["report"]["baseline"] == BASE and doc["gate"]["passed"] == gate.passed
    assert doc["window_size_s"] == 300
    assert set(doc["series"]) == set(SERIES)
    for metric in SERIES:
        assert set(doc["series"][metric]) == {BASE, CAND}
    samples = {ck: sum(p["samples"] for p in pts) for ck, pts in doc["series"]["mean_reward"].items()}
    assert samples == truth.turns_per_checkpoint
    values = [p["value"] for p in doc["series"]["persistence_rate"][CAND]]
    assert values and all(v is None or 0 <= v <= 1 for v in values)


def test_merge_is_exact_and_idempotent() -> None:
    cfg = ab_config(sessions=20, turns_per_session=4, seed=5, batch_window_ms=30_000)
    groups, truth = simulate(cfg)
    one = run_through_core(groups, partitions=1).windows
    three = run_through_core(groups, partitions=3).windows
    merged_1 = merge_windows(one, spec_version="v1")
    merged_3 = merge_windows(three, spec_version="v1")
    as_dicts = lambda m: {ck: [p.to_dict() for p in pts] for ck, pts in m.items()}  # noqa: E731
    assert as_dicts(merge_windows(list(reversed(three)) + list(three), spec_version="v1")) == as_dicts(merged_3)
    for ck, pts in merged_1.items():  # partials of 3 partitions merge to the 1-partition windows
        for a, b in zip(pts, merged_3[ck], strict=True):
            da, db = a.to_dict(), b.to_dict()
            assert da.pop("mean_reward") == pytest.approx(db.pop("mean_reward"))
            assert da == db
    assert Counter({ck: sum(p.samples for p in pts) for ck, pts in merged_1.items()}) == Counter(truth.turns_per_checkpoint)
    persisted = sum(p.persisted for pts in merged_1.values() for p in pts)
    assert persisted == sum(t.edits_persisted for t in truth.checkpoints.values())


def test_no_windows_still_writes_a_report(tmp_path: Path) -> None:
    report = compare(rewards("clean"), BASE, CAND, spec_version="v1")
    html_path, json_path = write_report(report, [], tmp_path)
    assert "no data" in html_path.read_text()
    assert orjson.loads(json_path.read_bytes())["series"]["mean_reward"] == {BASE: [], CAND: []}
