"""Goodhart monitors: guard behaviours drifting while the reward holds or rises.

Window partials (:class:`~rewardflow.core.rows.WindowAggregate`, one per
source partition) are merged into *cells* — one per window size, window
start, checkpoint, spec version (and surface when ``by_surface``); arms are
pooled. Each candidate cell is compared with a baseline: the baseline
checkpoint's cell of the same window (``same_window``), all its cells of that
size (``pooled``), or the candidate's own previous ``trailing_windows`` cells
(``trailing``). A monitor alerts when all hold:

* both sides have at least ``min_samples`` samples;
* the guard moved in its bad direction by at least the minimum effect
  (absolute for rates, relative for means);
* the drift is significant: two-proportion z-test for rates, Welch t-test for
  mean completion tokens, one-sided p-value below ``alpha`` (two-sided for
  monitors without a bad direction);
* mean reward held: ``reward_delta >= -reward_tolerance``.

Completion-token variance is not in the window rows (no sum of squares), so
it is estimated from the spread of partial means: with partials of sizes n_i
and means m_i, ``sum n_i (m_i - m)^2 / (k - 1)`` estimates the per-sample
variance with ``k - 1`` degrees of freedom (Student t, not normal).

Per-call rates (``broken_call_rate``, ``error_call_rate``) treat calls as
independent; calls of one turn are correlated, so their p-values are
optimistic. ``broken_turn_rate`` is the robust per-turn version.

Contract: pure and deterministic. ``alert_id = stable_id(monitor, checkpoint,
window_key)`` where ``window_key`` is the merged cell's key, so re-evaluating
the same rows gives the same ids. Cells are only as complete as the partials
given: evaluate windows that every partition has closed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from rewardflow.core.records import stable_id
from rewardflow.core.rows import Alert
from rewardflow.core.windows import window_key
from rewardflow.analysis.tdist import t_cdf

Baseline = Literal["same_window", "pooled", "trailing"]


@dataclass(frozen=True, slots=True)
class Monitor:
    """A guard: ``num / den`` (rate) or mean of ``num`` per ``den``; ``direction`` +1 up is bad, -1 down, 0 either."""

    name: str
    num: str
    den: str
    direction: int
    kind: Literal["rate", "mean"] = "rate"
    label: str = ""


MONITORS: tuple[Monitor, ...] = (
    Monitor("edit_rate", "turns_with_edit", "samples", -1, label="edit rate fell (no-edit/abstain rate rose)"),
    Monitor("clarifying_rate", "turns_clarifying", "samples", +1, label="clarifying-question rate rose"),
    Monitor("broken_turn_rate", "turns_broken", "samples", +1, label="share of turns with a broken tool call rose"),
    Monitor("broken_call_rate", "tool_broken", "tool_calls", +1, label="broken tool-call rate rose"),
    Monitor("error_call_rate", "tool_error", "tool_calls", +1, label="erroring tool-call rate rose"),
    Monitor("followup_rate", "turns_followup", "samples", 0, label="follow-up rate moved"),
    Monitor("completion_tokens", "completion_tokens_sum", "samples", 0, "mean", "mean completion tokens moved"),
)
_SUMS = ("samples", "reward_sum", "turns_with_edit", "turns_clarifying", "turns_broken", "turns_followup",
         "tool_calls", "tool_broken", "tool_error", "completion_tokens_sum")


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    alpha: float = 0.001
    min_samples: int = 200
    min_effect: float = 0.02  # absolute, for rates
    min_rel_effect: float = 0.10  # relative, for means
    reward_tolerance: float = 0.05  # alert only when mean reward fell by at most this
    baseline: Baseline = "same_window"
    trailing_windows: int = 6
    window_size_s: int | None = None  # None: every size present
    by_surface: bool = False
    monitors: tuple[str, ...] = tuple(m.name for m in MONITORS)


@dataclass(slots=True)
class Cell:
    """Merged partials of one window of one checkpoint."""

    size_s: int
    start: int
    checkpoint_id: str
    spec_version: str
    surface: str
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_SUMS, 0.0))
    partials: list[tuple[float, float]] = field(default_factory=list)  # (samples, tokens sum)

    @property
    def key(self) -> str:
        return window_key(self.size_s, self.start, self.checkpoint_id, "*", self.surface, self.spec_version)

    def add(self, row: Mapping[str, Any]) -> None:
        for k in _SUMS:
            self.sums[k] += float(row[k])
        if row["samples"]:
            self.partials.append((float(row["samples"]), float(row["completion_tokens_sum"])))

    def absorb(self, other: Cell) -> None:
        for k in _SUMS:
            self.sums[k] += other.sums[k]
        self.partials.extend(other.partials)


def merge_cells(rows: Iterable[Mapping[str, Any]], by_surface: bool = False) -> dict[tuple[int, int, str, str, str], Cell]:
    """Cells keyed by (size, start, checkpoint, spec_version, surface or '*')."""
    cells: dict[tuple[int, int, str, str, str], Cell] = {}
    for r in rows:
        k = (int(r["window_size_s"]), int(r["window_start"]), str(r["checkpoint_id"]), str(r["spec_version"]),
             str(r["surface"]) if by_surface else "*")
        cell = cells.get(k)
        if cell is None:
            cell = cells[k] = Cell(k[0], k[1], k[2], k[3], k[4])
        cell.add(r)
    return cells


def _baseline(c: Cell, cells: Mapping[tuple[int, int, str, str, str], Cell], ckpt: str | None, cfg: MonitorConfig) -> Cell | None:
    if cfg.baseline == "same_window":
        return cells.get((c.size_s, c.start, ckpt or "", c.spec_version, c.surface))
    if cfg.baseline == "pooled":
        picks = [b for k, b in cells.items() if k[2] == ckpt and (k[0], k[3], k[4]) == (c.size_s, c.spec_version, c.surface)]
    else:
        lo = c.start - cfg.trailing_windows * c.size_s * 1000
        picks = [b for k, b in cells.items() if (k[0], k[2], k[3], k[4]) == (c.size_s, c.checkpoint_id, c.spec_version, c.surface)
                 and lo <= k[1] < c.start]
    if not picks:
        return None
    pooled = Cell(c.size_s, c.start, ckpt or c.checkpoint_id, c.spec_version, c.surface)
    for b in picks:
        pooled.absorb(b)
    return pooled


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    return 1.0 - t_cdf(t, df)


def _sf(x: float, df: float | None) -> float:
    """Upper tail of the standard normal (``df`` None) or of Student's t."""
    return 0.5 * math.erfc(x / math.sqrt(2)) if df is None else student_t_sf(x, df)


def _p(stat: float, direction: int, df: float | None) -> float:
    return min(1.0, 2 * _sf(abs(stat), df)) if direction == 0 else _sf(stat * direction, df)


def rate_test(x1: float, n1: float, x0: float, n0: float) -> tuple[float, float, float, float | None]:
    """Two-proportion z-test of x1/n1 against x0/n0 (n1, n0 > 0): (p1, p0, z, None: normal)."""
    p1, p0 = x1 / n1, x0 / n0
    p = (x1 + x0) / (n1 + n0)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n0))
    return p1, p0, (p1 - p0) / se if se > 0 else 0.0, None


def _var(c: Cell) -> tuple[float, int]:
    n, s = c.sums["samples"], c.sums["completion_tokens_sum"]
    m = s / n
    ss = sum(ni * (si / ni - m) ** 2 for ni, si in c.partials)
    k = len(c.partials)
    return (ss / (k - 1) if k > 1 else math.nan), k - 1


def _mean_test(c: Cell, b: Cell) -> tuple[float, float, float, float | None]:
    n1, n0 = c.sums["samples"], b.sums["samples"]
    m1, m0 = c.sums["completion_tokens_sum"] / n1, b.sums["completion_tokens_sum"] / n0
    (v1, d1), (v0, d0) = _var(c), _var(b)
    a, z = v1 / n1, v0 / n0
    if not (d1 > 0 and d0 > 0) or a + z <= 0:
        return m1, m0, 0.0, 1.0
    df = (a + z) ** 2 / (a * a / d1 + z * z / d0)
    return m1, m0, (m1 - m0) / math.sqrt(a + z), df


def _check(m: Monitor, c: Cell, b: Cell, cfg: MonitorConfig) -> tuple[float, float, float, float] | None:
    n1, n0 = c.sums[m.den], b.sums[m.den]
    if min(c.sums["samples"], b.sums["samples"]) < cfg.min_samples or n1 <= 0 or n0 <= 0:
        return None
    if m.kind == "rate":
        v1, v0, stat, df = rate_test(c.sums[m.num], n1, b.sums[m.num], n0)
        effect = v1 - v0
    else:
        v1, v0, stat, df = _mean_test(c, b)
        effect = (v1 - v0) / v0 if v0 else math.inf
    if (m.direction and effect * m.direction <= 0) or abs(effect) < (cfg.min_effect if m.kind == "rate" else cfg.min_rel_effect):
        return None
    p = _p(stat, m.direction, df)
    return (v1, v0, stat, p) if p < cfg.alpha else None


def evaluate_windows(rows: Iterable[Mapping[str, Any]], baseline_checkpoint: str | None, cfg: MonitorConfig | None = None,
                     now_ms: int | None = None) -> list[Alert]:
    """Alerts for every candidate cell (checkpoints other than the baseline), ordered by window then monitor.

    ``raised_at`` is ``now_ms``, or the window end when ``None`` (deterministic).
    """
    cfg = cfg or MonitorConfig()
    if cfg.baseline != "trailing" and baseline_checkpoint is None:
        raise ValueError(f"baseline {cfg.baseline!r} needs a baseline checkpoint")
    cells = merge_cells(rows, cfg.by_surface)
    monitors = [m for m in MONITORS if m.name in cfg.monitors]
    alerts: list[Alert] = []
    for k, c in sorted(cells.items()):
        if c.checkpoint_id == baseline_checkpoint or (cfg.window_size_s and c.size_s != cfg.window_size_s):
            continue
        b = _baseline(c, cells, baseline_checkpoint, cfg)
        if b is None or not c.sums["samples"] or not b.sums["samples"]:
            continue
        reward_delta = c.sums["reward_sum"] / c.sums["samples"] - b.sums["reward_sum"] / b.sums["samples"]
        if reward_delta < -cfg.reward_tolerance:
            continue
        for m in monitors:
            hit = _check(m, c, b, cfg)
            if hit is not None:
                alerts.append(_alert(m, c, b, cfg, hit, reward_delta, now_ms))
    return alerts


def _alert(m: Monitor, c: Cell, b: Cell, cfg: MonitorConfig, hit: tuple[float, float, float, float],
           reward_delta: float, now_ms: int | None) -> Alert:
    v1, v0, stat, p = hit
    base = "trailing" if cfg.baseline == "trailing" else b.checkpoint_id
    end = c.start + c.size_s * 1000
    return Alert(
        alert_id=stable_id(m.name, c.checkpoint_id, c.key), monitor=m.name, checkpoint_id=c.checkpoint_id,
        baseline=base, window_start=c.start, window_end=end, value=v1, baseline_value=v0, z=stat, p_value=p,
        reward_delta=reward_delta,
        message=(f"{m.label}: {v1:.4g} vs {v0:.4g} ({_describe(cfg, base)}, n={c.sums['samples']:.0f}"
                 f"/{b.sums['samples']:.0f}, p={p:.2g}) while mean reward moved {reward_delta:+.4f} "
                 f"[spec {c.spec_version}, {c.size_s}s window, surface {c.surface}]"),
        raised_at=end if now_ms is None else now_ms,
    )


def _describe(cfg: MonitorConfig, base: str) -> str:
    if cfg.baseline == "trailing":
        return f"vs its previous {cfg.trailing_windows} windows"
    return f"vs {base}, {'same window' if cfg.baseline == 'same_window' else 'all its windows'}"


def alert_messages(alerts: Iterable[Alert]) -> list[tuple[bytes, bytes]]:
    """Kafka (key, value) pairs for the ``alerts`` topic: key checkpoint, value an orjson list of rows."""
    by_ckpt: dict[str, list[Alert]] = {}
    for a in alerts:
        by_ckpt.setdefault(a["checkpoint_id"], []).append(a)
    return [(k.encode(), orjson.dumps(v)) for k, v in sorted(by_ckpt.items())]
