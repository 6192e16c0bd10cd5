"""A self-contained HTML A/B report with a JSON summary beside it.

:func:`write_report` writes ``ab-report.html`` (inline CSS and SVG charts; no
scripts, no network) and ``ab-report.json`` into ``out_dir``. The charts plot,
per checkpoint of the report, one point per merged window
(:func:`~rewardflow.analysis.windows.merge_windows`): mean reward, edit
persistence rate (final horizon), dissatisfied follow-up rate and p95 latency.
The JSON holds the report (:meth:`Report.to_dict`), the gate result if given,
and the same series (``series[metric][checkpoint] = [{window_start,
window_end, samples, value}]``). When the report carries lineage (``rewardflow compare`` reads the
checkpoint registry), the page shows each arm's parent, generation and deployment time, or
"not registered".

Contract: creates ``out_dir`` if needed and overwrites the two files; raises
``OSError`` when they cannot be written. Deterministic for equal inputs.
"""

from __future__ import annotations

from dataclasses import asdict
from html import escape
from pathlib import Path
from typing import Any

import orjson

from rewardflow.analysis.ab import Report
from rewardflow.analysis.format import (
    fmt_conf,
    fmt_delta,
    fmt_delta_ci,
    fmt_rel,
    fmt_rel_ci,
    fmt_value,
    EXCLUSION_HEAD,
    exclusion_rows,
    lineage_rows,
)
from rewardflow.analysis.gate import GateResult
from rewardflow.analysis.svg import line_chart
from rewardflow.analysis.windows import SERIES, WindowPoint, merge_windows

HTML_NAME = "ab-report.html"
JSON_NAME = "ab-report.json"
TITLES = {
    "mean_reward": ("Mean reward per turn", lambda v: f"{v:.3f}"),
    "persistence_rate": ("Edit persistence rate (final horizon)", lambda v: f"{v * 100:.1f}%"),
    "dissatisfied_rate": ("Dissatisfied follow-up rate", lambda v: f"{v * 100:.1f}%"),
    "latency_p95": ("Latency p95 (ms)", lambda v: f"{v:,.0f}"),
}
CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ddd;padding:4px 8px;font-size:13px}
th{background:#f4f4f4}td.num{text-align:right}.better{color:#1a7f37}.worse{color:#c62828}.neutral{color:#777}
.pass{color:#1a7f37;font-weight:bold}.fail{color:#c62828;font-weight:bold}figure{margin:1em 0}"""


def series_of(points: dict[str, list[WindowPoint]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``{metric: {checkpoint: [{window_start, window_end, samples, value}]}}``."""
    return {m: {ck: [{"window_start": p.window_start, "window_end": p.window_end, "samples": p.samples,
                      "value": getattr(p, m)} for p in pts] for ck, pts in points.items()} for m in SERIES}


def metrics_table(report: Report) -> str:
    conf = fmt_conf(report.confidence)
    head = ("metric", "baseline", "candidate", "Δ", f"{conf} CI", "Δ%", f"{conf} CI (Δ%)", "n", "verdict")
    rows = ["<tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
    for m in report.metrics.values():
        cells = (fmt_value(m.baseline, m.unit), fmt_value(m.candidate, m.unit), fmt_delta(m), fmt_delta_ci(m),
                 fmt_rel(m), fmt_rel_ci(m), f"{m.n_baseline:,} / {m.n_candidate:,}")
        rows.append(f"<tr><td>{escape(m.label)}</td>" + "".join(f'<td class="num">{escape(c)}</td>' for c in cells)
                    + f'<td class="{escape(m.verdict)}">{escape(m.verdict)}</td></tr>')
    return "<table>" + "".join(rows) + "</table>"


def lineage_html(report: Report) -> str:
    """Each arm's checkpoint lineage as a table ('' when it was not looked up)."""
    rows = lineage_rows(report)
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("arm", "checkpoint", "parent", "generation", "deployed_at (UTC)"))
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<h2>Policy lineage</h2><table><tr>{head}</tr>{body}</table>"


def exclusions_html(report: Report) -> str:
    """Each arm's excluded turns by reason as a table ('' without exclusion counts)."""
    rows = exclusion_rows(report)
    if not rows:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in EXCLUSION_HEAD)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<h2>Exclusions (turns kept out of the rewards)</h2><table><tr>{head}</tr>{body}</table>"


def gate_html(gate: GateResult) -> str:
    verdict = '<span class="pass">PASS</span>' if gate.passed else '<span class="fail">FAIL</span>'
    rows = "".join(
        f"<tr><td>{escape(r.metric)}</td><td class=\"{'pass' if r.passed else 'fail'}\">{'PASS' if r.passed else 'FAIL'}"
        f"</td><td>{escape(r.reason)}</td></tr>" for r in gate.results)
    return f"<h2>Deploy gate: {verdict}</h2><table><tr><th>rule</th><th>result</th><th>reason</th></tr>{rows}</table>"


def render_html(report: Report, points: dict[str, list[WindowPoint]], gate: GateResult | None = None,
                window_size_s: int | None = None) -> str:
    """The report page as one HTML string."""
    charts = []
    for metric in SERIES:
        title, fmt = TITLES[metric]
        series = {ck: [(p.window_start, getattr(p, metric)) for p in pts] for ck, pts in points.items()}
        charts.append(f"<figure>{line_chart(title, series, fmt)}</figure>")
    size = f"{window_size_s} s windows" if window_size_s else "no windows"
    title = f"A/B report: {report.candidate} vs {report.baseline}"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>"
        f"<p>Reward spec <b>{escape(report.spec_version)}</b>; final rows only; "
        f"{report.turns[report.baseline]:,} baseline and {report.turns[report.candidate]:,} candidate turns; "
        f"intervals at {fmt_conf(report.confidence)}. Δ = candidate − baseline; Δ% = candidate / baseline − 1.</p>"
        f"{metrics_table(report)}{lineage_html(report)}{exclusions_html(report)}{gate_html(gate) if gate else ''}"
        f"<h2>Per window ({escape(size)}, event time, UTC)</h2>{''.join(charts)}</body></html>"
    )


def write_report(report: Report, windows_rows: Any, out_dir: Path | str, *, gate: GateResult | None = None,
                 size_s: int | None = None) -> tuple[Path, Path]:
    """Write ``ab-report.html`` and ``ab-report.json``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    points = merge_windows(windows_rows, checkpoints=(report.baseline, report.candidate),
                           spec_version=report.spec_version, size_s=size_s)
    starts = [p for pts in points.values() for p in pts]
    size = (starts[0].window_end - starts[0].window_start) // 1000 if starts else None
    html_path, json_path = out / HTML_NAME, out / JSON_NAME
    html_path.write_text(render_html(report, points, gate, size), encoding="utf-8")
    summary = {"report": report.to_dict(), "gate": asdict(gate) if gate else None, "window_size_s": size,
               "series": series_of(points)}
    json_path.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    return html_path, json_path
