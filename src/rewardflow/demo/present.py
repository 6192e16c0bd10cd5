"""How the demo shows its result: the terminal story and the one-page HTML report.

The terminal prints, in order: each candidate's A/B table (with its arms' lineage and exclusions),
the reconciliation of counts, the turns corrected by late signals, the Goodhart and
exclusion-balance alerts, the replay under the next spec, and last a verdict per candidate, so
the final lines a newcomer reads are the decisions.

Contract: :func:`write_story` writes ``report.html`` into ``out_dir`` (created if needed; raises
``OSError`` when it cannot); :func:`print_story` writes to standard output only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from rewardflow.analysis.gate import Policy
from rewardflow.analysis.render import exclusion_table, lineage_table, report_table
from rewardflow.analysis.story_html import render_story
from rewardflow.analysis.windows import merge_windows
from rewardflow.demo.reconcile import Check, reconcile_table

HTML_NAME = "report.html"


def correction_line(c: Any) -> str:
    """One paragraph on the turns corrected by late signals, with the largest change."""
    if not c.total:
        return "corrections: no signal came after its turn was finalised"
    per = ", ".join(f"{ck} {n:,}" for ck, n in c.by_checkpoint.items())
    text = f"corrections: {c.total:,} turns re-scored by a signal after they were finalised ({per}); the A/B counts " \
           "each with its latest revision"
    if c.examples:
        e = c.examples[0]
        text += (f"; e.g. {e['sample_id'][:12]}… ({e['checkpoint_id']}): reward {float(e['first_reward']):+.3f} → "
                 f"{float(e['latest_reward']):+.3f} at revision {e['revision']}")
    return text


def write_story(out_dir: Path, judged: Mapping[str, Any], policy: Policy, windows: Any, alerts: Sequence[Any],
                shift: Any, planted: Mapping[str, str], spec: str, corrections: Any = None) -> Path:
    """The HTML page over every checkpoint's windows (the smallest window size); returns its path."""
    first = next(iter(judged.values()))
    checkpoints = [first.report.baseline, *judged]
    points = merge_windows(windows, checkpoints=checkpoints, spec_version=spec)
    starts = [p for pts in points.values() for p in pts]
    size = (starts[0].window_end - starts[0].window_start) // 1000 if starts else None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / HTML_NAME
    path.write_text(render_story(judged, policy, points, alerts, shift, planted, size, corrections), encoding="utf-8")
    return path


def console(stderr: bool = False) -> Console:
    """The demo's console: the terminal's width, or 200 columns when its output goes to a file or a pipe
    (rich would wrap at 80, splitting the commands it prints and cutting the checkpoint names)."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=200)


def print_story(judged: Mapping[str, Any], checks: list[Check], alerts: Sequence[Any], shift: Any,
                planted: Mapping[str, str], html: Path, summary: Path, corrections: Any = None) -> None:
    out = console()
    for j in judged.values():
        out.print(report_table(j.report))
        lineage = lineage_table(j.report)
        if lineage is not None:
            out.print(lineage)
        excluded = exclusion_table(j.report)
        if excluded is not None:
            out.print(excluded)
    out.print(reconcile_table(checks))
    if corrections is not None:
        out.print(correction_line(corrections))
    if alerts:
        out.print(f"[bold red]{len(alerts)} monitor alert(s) (Goodhart and exclusion balance):")
        for a in alerts:
            out.print(f"  {a['monitor']} on {a['checkpoint_id']}: {a['message']}")
    else:
        out.print("Goodhart monitors and exclusion balance: no alerts")
    if shift is not None:
        out.print(f"[bold]replay of {shift.candidate}'s alerted window under {shift.spec_to}[/] (the next spec): its "
                  f"lead in mean reward over {shift.baseline} goes from {shift.lead('mean_from'):+.4f} "
                  f"({shift.spec_from}) to {shift.lead('mean_to'):+.4f} ({shift.spec_to})\n"
                  f"  the same, by hand: {shift.command}")
    out.print(f"HTML report: {html}\nJSON summary: {summary}")
    out.print("[bold]verdicts")
    for ck, j in judged.items():
        style = "green" if j.verdict.deploy else "red"
        failed = [r for r in j.gate.results if not r.passed]
        out.print(f"  [bold {style}]{ck}[/] ({planted.get(ck, '?')}): [{style}]{j.verdict.headline}[/]")
        for r in failed:
            out.print(f"      {r.reason}")
