"""One self-contained HTML page for several candidates against one baseline (the demo's report).

Top to bottom: a verdict per candidate (deploy or block, and why; what was planted when the caller
knows it); the gate's rule table with each candidate's result per rule; the per-window charts of
every checkpoint with the windows a Goodhart monitor alerted on shaded and named; the replay of
a blocked candidate's window under the next reward spec; the turns corrected by late signals; then each candidate's full A/B table and
gate reasons, with the policy lineage of its arms when the registry was read and their excluded
turns by reason. Inline CSS and SVG, no
scripts, no network.

Contract: pure; every text is HTML-escaped. Deterministic for equal inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from rewardflow.analysis.format import fmt_conf
from rewardflow.analysis.gate import Policy
from rewardflow.analysis.report_html import CSS, TITLES, exclusions_html, gate_html, lineage_html, metrics_table
from rewardflow.analysis.svg import Band, line_chart
from rewardflow.analysis.windows import SERIES, WindowPoint


def _verdicts(judged: Mapping[str, Any], planted: Mapping[str, str]) -> str:
    rows = []
    for ck, j in judged.items():
        v = j.verdict
        cls = "pass" if v.deploy else "fail"
        truth = f"<td>{escape(planted[ck])}</td>" if planted else ""
        rows.append(f'<tr><td><b>{escape(ck)}</b></td><td class="{cls}">{"DEPLOY" if v.deploy else "BLOCK"}</td>'
                    f"<td>{escape(v.headline)}</td>{truth}</tr>")
    head = "<th>candidate</th><th>verdict</th><th>why</th>" + ("<th>what was simulated</th>" if planted else "")
    return f"<h2>Verdicts</h2><table><tr>{head}</tr>{''.join(rows)}</table>"


def _rules(policy: Policy, judged: Mapping[str, Any]) -> str:
    head = "<th>rule</th><th>bound</th><th>test</th><th>confidence</th>" + "".join(
        f"<th>{escape(ck)}</th>" for ck in judged)
    rows = [f"<tr><td>min_turns</td><td>≥ {policy.min_turns:,} final turns per arm</td><td></td><td></td>"
            + "".join(_cell(j.gate.results, "min_turns", default=True) for j in judged.values()) + "</tr>"]
    for r in policy.rules:
        kind, limit = r.margin
        rows.append(f"<tr><td>{escape(r.metric)}</td><td>{escape(kind)} = {limit:g}</td><td>{escape(r.test or policy.test)}</td>"
                    f"<td>{escape(fmt_conf(r.confidence or policy.confidence))}</td>"
                    + "".join(_cell(j.gate.results, r.metric) for j in judged.values()) + "</tr>")
    return f"<h2>Deploy gate: the rules</h2><table><tr>{head}</tr>{''.join(rows)}</table>"


def _cell(results: Sequence[Any], metric: str, default: bool = False) -> str:
    hits = [r for r in results if r.metric == metric]
    passed = all(r.passed for r in hits) if hits else default
    title = escape(" | ".join(r.reason for r in hits))
    return f'<td class="{"pass" if passed else "fail"}" title="{title}">{"PASS" if passed else "FAIL"}</td>'


def _charts(points: Mapping[str, list[WindowPoint]], alerts: Sequence[Mapping[str, Any]]) -> str:
    bands: list[Band] = [(int(a["window_start"]), int(a["window_end"]), f"{a['monitor']} on {a['checkpoint_id']}")
                         for a in alerts]
    out = []
    for metric in SERIES:
        title, fmt = TITLES[metric]
        series = {ck: [(p.window_start, getattr(p, metric)) for p in pts] for ck, pts in points.items()}
        out.append(f"<figure>{line_chart(title, series, fmt, bands=_stacked(bands))}</figure>")
    return "".join(out)


def _stacked(bands: list[Band]) -> list[Band]:
    """One band per window, its label naming every alert raised on it."""
    merged: dict[tuple[int, int], list[str]] = {}
    for start, end, label in bands:
        merged.setdefault((start, end), []).append(label)
    return [(s, e, "; ".join(labels)) for (s, e), labels in sorted(merged.items())]


def _replay(shift: Any, baseline: str) -> str:
    if shift is None:
        return ""
    rows = "".join(
        f"<tr><td>{escape(r['checkpoint_id'])}</td><td class=\"num\">{r['turns']:,}</td>"
        f"<td class=\"num\">{r['mean_from']:+.4f}</td><td class=\"num\">{r['mean_to']:+.4f}</td>"
        f"<td class=\"num\">{r['mean_to'] - r['mean_from']:+.4f}</td></tr>" for r in shift.rows)
    cand = shift.candidate
    lead_from, lead_to = shift.lead("mean_from"), shift.lead("mean_to")
    return (f"<h2>Replay under the next spec: {escape(shift.spec_from)} → {escape(shift.spec_to)}</h2>"
            f"<p>The alerted window's turns, replayed from the stored events by the stream's own core "
            f"(<code>{escape(shift.command)}</code>). {escape(cand)}'s lead over {escape(baseline)} in mean reward: "
            f"<b>{lead_from:+.4f}</b> under {escape(shift.spec_from)}, <b>{lead_to:+.4f}</b> under {escape(shift.spec_to)}.</p>"
            f"<table><tr><th>checkpoint</th><th>turns</th><th>mean reward {escape(shift.spec_from)}</th>"
            f"<th>mean reward {escape(shift.spec_to)}</th><th>change</th></tr>{rows}</table>")


def _corrections(c: Any) -> str:
    if c is None:
        return ""
    rows = "".join(f"<tr><td>{escape(str(e['sample_id']))}</td><td>{escape(str(e['checkpoint_id']))}</td>"
                   f"<td class=\"num\">{int(e['revision'])}</td><td class=\"num\">{float(e['first_reward']):+.4f}</td>"
                   f"<td class=\"num\">{float(e['latest_reward']):+.4f}</td></tr>" for e in c.examples)
    per = ", ".join(f"{escape(ck)}: {n:,}" for ck, n in c.by_checkpoint.items()) or "none"
    table = (f"<table><tr><th>sample</th><th>checkpoint</th><th>revision</th><th>first reward</th>"
             f"<th>latest reward</th></tr>{rows}</table>") if rows else ""
    return (f"<h2>Corrections</h2><p>{c.total:,} turns re-scored by a signal that came after they were finalised, "
            f"within the correction window ({per}). Each counts with its latest revision; the largest changes:</p>"
            f"{table}")


def render_story(judged: Mapping[str, Any], policy: Policy, points: Mapping[str, list[WindowPoint]],
                 alerts: Sequence[Mapping[str, Any]], shift: Any = None, planted: Mapping[str, str] | None = None,
                 window_size_s: int | None = None, corrections: Any = None) -> str:
    """The page. ``judged`` maps each candidate to its :class:`~rewardflow.demo.story.Judged`."""
    first = next(iter(judged.values()))
    baseline, spec = first.report.baseline, first.report.spec_version
    size = f"{window_size_s} s windows" if window_size_s else "no windows"
    details = "".join(f"<h2>{escape(ck)} vs {escape(baseline)}</h2>{metrics_table(j.report)}"
                      f"{lineage_html(j.report)}{exclusions_html(j.report)}{gate_html(j.gate)}" for ck, j in judged.items())
    title = f"rewardflow: {len(judged)} candidate(s) against {baseline}"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>"
        f"<p>Reward spec <b>{escape(spec)}</b>; final rows only; intervals at {fmt_conf(first.report.confidence)}. "
        f"Δ = candidate − baseline.</p>{_verdicts(judged, planted or {})}{_rules(policy, judged)}"
        f"<h2>Per window ({escape(size)}, event time, UTC); shaded: windows a Goodhart or exclusion-balance "
        f"monitor alerted on</h2>"
        f"{_charts(points, alerts)}{_replay(shift, baseline)}{_corrections(corrections)}{details}</body></html>"
    )
