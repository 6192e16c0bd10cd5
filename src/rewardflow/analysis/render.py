"""Rich tables of an A/B :class:`Report`, of its arms' lineage and exclusions, and of a gate result (terminal output).

Contract: pure; builds renderables, prints nothing itself.
"""

from __future__ import annotations

from rich.table import Table

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

_STYLE = {"better": "green", "worse": "red", "neutral": "dim", "n/a": "yellow"}


def report_table(report: Report) -> Table:
    """One row per metric: both arms, absolute and relative delta (CI beneath), samples, verdict."""
    conf = fmt_conf(report.confidence)
    table = Table(
        title=f"{report.candidate} vs {report.baseline}  (spec {report.spec_version}, "
              f"{report.turns[report.candidate]:,} vs {report.turns[report.baseline]:,} turns, {conf} CI)",
        title_justify="left",
    )
    table.add_column("metric")
    table.add_column(report.baseline, justify="right")
    table.add_column(report.candidate, justify="right")
    table.add_column(f"Δ\n[dim]{conf} CI[/]", justify="right")
    table.add_column(f"Δ%\n[dim]{conf} CI[/]", justify="right")
    table.add_column("n", justify="right")
    table.add_column("verdict")
    for m in report.metrics.values():
        style = _STYLE[m.verdict]
        table.add_row(
            m.label, fmt_value(m.baseline, m.unit), fmt_value(m.candidate, m.unit),
            f"{fmt_delta(m)}\n[dim]{fmt_delta_ci(m)}[/]", f"[{style}]{fmt_rel(m)}[/]\n[dim]{fmt_rel_ci(m)}[/]",
            f"{m.n_baseline:,}\n{m.n_candidate:,}", f"[{style}]{m.verdict}[/]",
        )
    return table


def lineage_table(report: Report) -> Table | None:
    """Each arm's checkpoint lineage (parent, generation, deployed_at); None when it was not looked up."""
    rows = lineage_rows(report)
    if not rows:
        return None
    table = Table("arm", "checkpoint", "parent", "generation", "deployed_at (UTC)", title="policy lineage",
                  title_justify="left")
    for row in rows:
        table.add_row(*row)
    return table


def exclusion_table(report: Report) -> Table | None:
    """Each arm's turns kept out of the rewards, by reason; None without exclusion counts."""
    rows = exclusion_rows(report)
    if not rows:
        return None
    table = Table(*EXCLUSION_HEAD, title="exclusions (turns kept out of the rewards)", title_justify="left")
    for row in rows:
        table.add_row(*row)
    return table


def gate_table(result: GateResult) -> Table:
    """One row per rule: PASS/FAIL and the reason."""
    table = Table(title=f"gate: {'PASS' if result.passed else 'FAIL'}", title_justify="left",
                  title_style="bold green" if result.passed else "bold red")
    table.add_column("rule")
    table.add_column("result")
    table.add_column("reason", overflow="fold")
    for r in result.results:
        table.add_row(r.metric, "[green]PASS[/]" if r.passed else "[red]FAIL[/]", r.reason)
    return table
