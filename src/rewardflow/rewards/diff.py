"""What changes when samples are rescored under another spec: a pure reward diff.

:func:`diff_rewards` pairs old and new final reward rows by turn (``org_id``,
``session_id``, ``sample_id``; rows without the first two pair by ``sample_id``) and reports the mean and quantile shift, each component's change, the share of
samples whose reward changes sign, and the samples that moved most.

Contract: pure, deterministic (ties broken by turn); :func:`render_diff`
only builds rich tables. Only paired
samples enter the statistics; unpaired ones are counted in ``only_old`` /
``only_new``. Provisional rows (``provisional != 0``) are ignored. The sign of
a reward is -1, 0 or +1 (``|r| <= eps`` counts as 0), so a flip is any change
of that sign, including to or from exactly zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ComponentChange:
    """Mean contribution of one component before and after, over paired samples."""

    name: str
    old_mean: float
    new_mean: float
    changed: int  # paired samples whose contribution of this component changed

    @property
    def delta(self) -> float:
        return self.new_mean - self.old_mean


@dataclass(frozen=True, slots=True)
class SampleChange:
    sample_id: str
    checkpoint_id: str
    old: float
    new: float
    session_id: str = ""
    org_id: str = ""

    @property
    def delta(self) -> float:
        return self.new - self.old


@dataclass(frozen=True, slots=True)
class RewardDiff:
    """Summary of a rescoring; ``quantiles`` holds ``(q, old, new)``."""

    old_version: str
    new_version: str
    paired: int
    only_old: int
    only_new: int
    old_mean: float
    new_mean: float
    quantiles: list[tuple[float, float, float]]
    components: list[ComponentChange]
    changed: int  # paired samples whose reward changed
    sign_flips: int
    top: list[SampleChange]

    @property
    def mean_delta(self) -> float:
        return self.new_mean - self.old_mean

    @property
    def flip_fraction(self) -> float:
        return self.sign_flips / self.paired if self.paired else 0.0

    @property
    def changed_fraction(self) -> float:
        return self.changed / self.paired if self.paired else 0.0


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _sign(x: float) -> int:
    return 0 if abs(x) <= EPS else (1 if x > 0 else -1)


def _final(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """Final rows by turn: two sessions' turns that share a request id are two samples."""
    return {(str(r.get("org_id") or ""), str(r.get("session_id") or ""), str(r["sample_id"])): r
            for r in rows if not r.get("provisional", 0)}


def _versions(rows: Iterable[Mapping[str, Any]]) -> str:
    return ",".join(sorted({str(r.get("spec_version", "")) for r in rows})) or "-"


def diff_rewards(old_rows: Iterable[Mapping[str, Any]], new_rows: Iterable[Mapping[str, Any]], top: int = 10) -> RewardDiff:
    """Diff the final rewards of the same samples under two specs."""
    old, new = _final(old_rows), _final(new_rows)
    ids = sorted(old.keys() & new.keys())
    pairs = [(old[i], new[i]) for i in ids]
    o_vals = [float(o["reward"]) for o, _ in pairs]
    n_vals = [float(n["reward"]) for _, n in pairs]
    names = sorted({k for o, n in pairs for k in (*o["components"], *n["components"])})
    comps = []
    for name in names:
        oc = [float(o["components"].get(name, 0.0)) for o, _ in pairs]
        nc = [float(n["components"].get(name, 0.0)) for _, n in pairs]
        comps.append(ComponentChange(name, _mean(oc), _mean(nc), sum(abs(a - b) > EPS for a, b in zip(oc, nc, strict=True))))
    moves = [SampleChange(i[2], str(n["checkpoint_id"]), a, b, i[1], i[0])
             for i, (o, n), a, b in zip(ids, pairs, o_vals, n_vals, strict=True)]
    moved = sorted((m for m in moves if abs(m.delta) > EPS),
                   key=lambda m: (-abs(m.delta), m.sample_id, m.session_id, m.org_id))
    so, sn = sorted(o_vals), sorted(n_vals)
    return RewardDiff(
        old_version=_versions(old.values()), new_version=_versions(new.values()),
        paired=len(ids), only_old=len(old) - len(ids), only_new=len(new) - len(ids),
        old_mean=_mean(o_vals), new_mean=_mean(n_vals),
        quantiles=[(q, quantile(so, q), quantile(sn, q)) for q in QUANTILES],
        components=comps, changed=len(moved),
        sign_flips=sum(_sign(a) != _sign(b) for a, b in zip(o_vals, n_vals, strict=True)),
        top=moved[:top],
    )


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else 0.0


def render_diff(d: RewardDiff) -> list[Table]:
    """Rich tables of a diff: summary, quantiles, components, top samples by |change|."""
    summary = Table(title=f"reward diff {d.old_version} → {d.new_version}", show_header=False)
    for k, v in (("paired samples", f"{d.paired}"), ("only in old / new", f"{d.only_old} / {d.only_new}"),
                 ("mean old → new", f"{d.old_mean:+.4f} → {d.new_mean:+.4f} ({d.mean_delta:+.4f})"),
                 ("samples changed", f"{d.changed} ({d.changed_fraction:.2%})"),
                 ("sign flips", f"{d.sign_flips} ({d.flip_fraction:.2%})")):
        summary.add_row(k, v)
    quant = Table("quantile", d.old_version, d.new_version, "shift", title="distribution")
    for q, o, n in d.quantiles:
        quant.add_row(f"p{q * 100:g}", f"{o:+.4f}", f"{n:+.4f}", f"{n - o:+.4f}")
    comps = Table("component", "mean old", "mean new", "change", "samples changed", title="per component")
    for c in d.components:
        comps.add_row(c.name, f"{c.old_mean:+.4f}", f"{c.new_mean:+.4f}", f"{c.delta:+.4f}", str(c.changed))
    top = Table("sample", "session", "checkpoint", "old", "new", "change", title=f"top {len(d.top)} samples by |change|")
    for s in d.top:
        top.add_row(s.sample_id, s.session_id, s.checkpoint_id, f"{s.old:+.4f}", f"{s.new:+.4f}", f"{s.delta:+.4f}")
    return [summary, quant, comps, top]
