"""The demo's one-page report: verdicts, the gate's rules per candidate, alerted windows on the charts, the replay."""

from __future__ import annotations

import re
from types import SimpleNamespace

from rewardflow.analysis.ab import compare
from rewardflow.analysis.gate import Policy, Rule, evaluate
from rewardflow.analysis.story_html import render_story
from rewardflow.analysis.svg import line_chart
from rewardflow.analysis.verdict import verdict_of
from rewardflow.analysis.windows import merge_windows
from tests.analysis.conftest import BASE, CAND, rewards, scenario

POLICY = Policy(min_turns=10, rules=[Rule(metric="clarifying_rate", max_rise_points=2, test="regression"),
                                     Rule(metric="persistence_rate", max_drop_points=0.5, confidence=0.99)])


def _judged(name: str, alerts: list[dict[str, object]]) -> SimpleNamespace:
    report = compare(rewards(name), BASE, CAND)
    gate = evaluate(report, POLICY)
    return SimpleNamespace(report=report, gate=gate, verdict=verdict_of(report, gate, alerts))


def test_bands_are_drawn_clipped_and_escaped() -> None:
    series = {"a": [(0, 1.0), (1000, 2.0)]}
    svg = line_chart("t", series, str, bands=[(500, 5000, "x<y"), (9000, 9500, "outside")])
    assert svg.count("<rect") == 3  # the frame and the one band in range
    assert "x&lt;y" in svg and "outside" not in svg
    width = float(re.findall(r'<rect x="[\d.]+" y="\d+" width="([\d.]+)" height="\d+" fill="#c62828"', svg)[0])
    assert 0 < width <= 720 / 2  # from the middle of the plot to its right edge at most


def test_page_has_verdicts_rules_bands_and_replay() -> None:
    alerts = [{"checkpoint_id": CAND, "monitor": "clarifying_rate", "window_start": 0, "window_end": 1},
              {"checkpoint_id": CAND, "monitor": "edit_rate", "window_start": 0, "window_end": 1}]
    judged = {CAND: _judged("asking", alerts)}
    windows = [dict(w) for w in scenario("asking")[0].windows]
    points = merge_windows(windows, checkpoints=[BASE, CAND], spec_version="v1")
    start = min(p.window_start for pts in points.values() for p in pts)
    for a in alerts:
        a["window_start"], a["window_end"] = start, start + 3_600_000
    shift = SimpleNamespace(baseline=BASE, candidate=CAND, spec_from="v1", spec_to="v2", command="rewardflow rewards replay <x>",
                            rows=[{"checkpoint_id": BASE, "turns": 10, "mean_from": 0.2, "mean_to": 0.19},
                                  {"checkpoint_id": CAND, "turns": 12, "mean_from": 0.25, "mean_to": 0.15}],
                            lead=lambda key: {"mean_from": 0.05, "mean_to": -0.04}[key])
    page = render_story(judged, POLICY, points, alerts, shift, {CAND: "the over-ask <hack>"}, 300)
    assert "BLOCK" in page and "Goodhart alerts: clarifying_rate, edit_rate" in page
    assert "the over-ask &lt;hack&gt;" in page and "<hack>" not in page
    rules = page[page.index("Deploy gate: the rules"):]
    assert "min_turns" in rules and "max_rise_points = 2" in rules and "99%" in rules
    assert "clarifying_rate on ckpt-cand; edit_rate on ckpt-cand" in page  # one band per window, naming both
    assert "+0.0500</b> under v1, <b>-0.0400</b> under v2" in page and "&lt;x&gt;" in page
    assert page.count("<svg") == 4


def test_page_without_alerts_or_replay() -> None:
    judged = {CAND: _judged("clean", [])}
    points = merge_windows([dict(w) for w in scenario("clean")[0].windows], checkpoints=[BASE, CAND], spec_version="v1")
    page = render_story(judged, POLICY, points, [], None, None, 300)
    assert "DEPLOY" in page and "Replay under" not in page and "fill=\"#c62828\"" not in page
