"""Human formatting of metric values and changes (tables, gate reasons, HTML).

Rates print as percentages and their changes in percentage points (``pp``);
relative changes as signed percentages (``+2.28%``); latencies in ms.
``nan`` prints as ``n/a``. :func:`lineage_rows` gives the cells of each arm's lineage
(terminal and HTML show the same). Contract: pure.
"""

from __future__ import annotations

import math

from rewardflow.analysis.ab import MetricDelta, Report, Unit
from rewardflow.lineage.registry import iso_ms


def fmt_change(value: float, suffix: str, signed: bool = True) -> str:
    """``value`` with a unit suffix: ``pp``, ``%``, ``ms`` or none."""
    if math.isnan(value):
        return "n/a"
    sign = "+" if signed else ""
    if suffix == "ms":
        return f"{value:{sign},.0f} ms"
    if suffix in ("pp", "%"):
        return f"{value:{sign}.2f}{' pp' if suffix == 'pp' else '%'}"
    return f"{value:{sign}.4f}"


def fmt_conf(confidence: float) -> str:
    """``0.95`` → ``95%``, ``0.995`` → ``99.5%``."""
    return f"{confidence * 100:.4g}%"


def fmt_value(value: float, unit: Unit) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "rate":
        return f"{value * 100:.2f}%"
    if unit == "ms":
        return f"{value:,.0f} ms"
    return f"{value:.4f}"


def delta_suffix(unit: Unit) -> str:
    return {"rate": "pp", "ms": "ms", "reward": ""}[unit]


def fmt_delta(m: MetricDelta) -> str:
    """Absolute delta, rates in percentage points."""
    scale = 100.0 if m.unit == "rate" else 1.0
    return fmt_change(m.delta * scale, delta_suffix(m.unit))


def fmt_delta_ci(m: MetricDelta) -> str:
    scale = 100.0 if m.unit == "rate" else 1.0
    sfx = delta_suffix(m.unit)
    return f"[{fmt_change(m.ci_low * scale, sfx)}, {fmt_change(m.ci_high * scale, sfx)}]"


def fmt_rel(m: MetricDelta) -> str:
    return fmt_change(m.rel_delta * 100, "%")


def fmt_rel_ci(m: MetricDelta) -> str:
    return f"[{fmt_change(m.rel_ci_low * 100, '%')}, {fmt_change(m.rel_ci_high * 100, '%')}]"


def lineage_rows(report: Report) -> list[tuple[str, str, str, str, str]]:
    """Per arm: (arm, checkpoint, parent, generation, deployed_at), or "not registered" in the last three.
    Empty when the report's lineage was not looked up."""
    if report.lineage is None:
        return []
    rows = []
    for arm, ck in (("baseline", report.baseline), ("candidate", report.candidate)):
        c = report.lineage.get(ck)
        if c is None:
            rows.append((arm, ck, "not registered", "", ""))
        else:
            rows.append((arm, ck, c.parent_id or "(root)", str(c.generation), iso_ms(c.deployed_at_ms)))
    return rows


EXCLUSION_HEAD = ("arm", "checkpoint", "scored turns", "dead-lettered", "orphan", "scoring error", "late signals",
                  "excluded")


def exclusion_rows(report: Report) -> list[tuple[str, ...]]:
    """Per arm: its scored turns, its excluded turns by reason, and the excluded share of its population.
    Empty when the report was made without exclusion counts."""
    if report.exclusions is None:
        return []
    rows: list[tuple[str, ...]] = []
    for arm, ck in (("baseline", report.baseline), ("candidate", report.candidate)):
        c = report.exclusions[ck]
        share = c["excluded"] / c["population"] if c["population"] else 0.0
        rows.append((arm, ck, f"{c['turns']:,}", f"{c['dead_letter']:,}", f"{c['orphan']:,}",
                     f"{c['scoring_error']:,}", f"{c['late']:,}", f"{c['excluded']:,} ({share:.2%})"))
    return rows
