"""Exclusion balance: are one arm's turns kept out of the rewards more often than another's?

An A/B compares the turns that were scored. When a candidate's turns are dead-lettered, orphaned or
late more often than the baseline's, the two arms are different populations, and a candidate whose
failing turns vanish looks better than it is. This module counts the turns each checkpoint lost,
by reason, and tests the difference against the baseline in each window and over the whole run.

* **Units are turns** (``org_id``, ``session_id``, ``request_id``). An exclusion row names its turn;
  a dead letter names it when its original JSON does. Several rows of one turn count once per reason. A dead letter whose turn
  is unknown (a body that is not JSON, a whole refused record) counts as one unit of its own.
* **Attribution.** A row the worker attributed (a late event: the checkpoint of its finalised
  turn) keeps its checkpoint; any other takes the checkpoint of its session's scored turns
  (``sessions``, by org and session id: two orgs' sessions that share an id are two sessions). A dead letter's body is what a producer wrote, refused: its ``checkpoint_id``
  is never believed, so a forged body cannot charge a checkpoint with exclusions beyond the
  sessions that checkpoint really served. Rows attributable to no checkpoint are counted apart
  (:attr:`Balance.unattributed`), never guessed.
* **Rates.** The population of an arm is its scored turns plus its distinct turns lost outright
  (``dead_letter``, ``orphan``, ``scoring_error``). ``rate(reason) = units / population``;
  ``excluded`` is the union of every reason. ``late`` turns were scored without their late signals,
  so they are a share of the same population.
* **The monitor** (:func:`balance_alerts`): in every window where both the candidate and the baseline
  have at least ``min_samples`` turns, a two-sided two-proportion z-test per reason; an alert when
  ``p < alpha`` and the rates differ by at least ``min_effect``. Its alerts are ``Alert`` rows with
  ``monitor = exclusion_<reason>``.

Events refused at the ingestion edge never reach a table: the client was told, and only the edge's
metrics count them. A turn whose served event was refused there still shows here, as an orphan.

Contract: pure and deterministic; inputs are plain rows as stored in ClickHouse.
"""

from __future__ import annotations

import base64
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from rewardflow.analysis.goodhart import rate_test, merge_cells
from rewardflow.analysis.stats import Estimate
from rewardflow.core.records import stable_id
from rewardflow.core.rows import Alert
from rewardflow.core.windows import window_start

REASONS = ("dead_letter", "orphan", "scoring_error", "late")
LOST = frozenset({"dead_letter", "orphan", "scoring_error"})  # turns that got no reward at all
ALL = "excluded"


@dataclass(frozen=True, slots=True)
class Excluded:
    """One excluded row, reduced to what the balance needs."""

    reason: str  # one of REASONS
    checkpoint_id: str  # '' when the row does not name it
    org_id: str  # '' when unknown
    session_id: str
    unit: str  # the turn (org, session and request id, tab-separated), or the row's own id when the turn is unknown
    ts: int | None  # event time, epoch ms; None when unknown


def from_exclusions(rows: Iterable[Mapping[str, Any]]) -> list[Excluded]:
    """``late_events`` rows (duplicates are not exclusions of a turn: their first copy was scored)."""
    return [Excluded(str(r["reason"]), str(r["checkpoint_id"]), str(r["org_id"]), str(r["session_id"]),
                     _unit(str(r["org_id"]), str(r["session_id"]), str(r["request_id"])), int(r["ts"]))
            for r in rows if str(r["reason"]) in REASONS]


def _unit(org: str, session: str, request: str) -> str:
    return f"{org}\t{session}\t{request}"


def from_dead_letters(rows: Iterable[Mapping[str, Any]]) -> list[Excluded]:
    """``dead_letters`` rows; the session, turn and event time come from the original JSON when it has them
    (the checkpoint never does: see the module doc)."""
    out = []
    for r in rows:
        doc = _json_object(str(r.get("original_b64") or ""))
        rid, ts, org = doc.get("request_id"), doc.get("ts"), doc.get("org_id")
        org = org if isinstance(org, str) else ""
        session = doc.get("session_id") if isinstance(doc.get("session_id"), str) else str(r.get("session_id") or "")
        unit = _unit(org, str(session), rid) if isinstance(rid, str) and rid else "dl:" + str(r["dead_letter_id"])
        out.append(Excluded("dead_letter", "", org, str(session), unit,
                            ts if isinstance(ts, int) and not isinstance(ts, bool) else None))
    return out


def _json_object(b64: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(base64.b64decode(b64, validate=False))
    except (ValueError, orjson.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass(slots=True)
class ArmExclusions:
    """Scored turns and distinct excluded turns by reason, of one checkpoint (in one window or overall)."""

    turns: int = 0
    units: dict[str, set[str]] = field(default_factory=lambda: {r: set() for r in REASONS})

    @property
    def lost(self) -> set[str]:
        return set().union(*(self.units[r] for r in LOST))

    @property
    def population(self) -> int:
        return self.turns + len(self.lost)

    def count(self, reason: str) -> int:
        """Distinct turns excluded for ``reason`` (``excluded``: for any reason)."""
        return len(set().union(*self.units.values())) if reason == ALL else len(self.units[reason])

    def rate(self, reason: str) -> float:
        n = self.population
        return self.count(reason) / n if n else math.nan

    def estimate(self, reason: str) -> Estimate:
        """The rate with its binomial standard error."""
        n = self.population
        if not n:
            return Estimate(math.nan, math.nan, 0)
        p = self.count(reason) / n
        return Estimate(p, math.sqrt(p * (1 - p) / n), n)


@dataclass(frozen=True, slots=True)
class Balance:
    """Exclusions per checkpoint over the whole run, and per window of ``window_s``."""

    overall: dict[str, ArmExclusions]
    windows: dict[tuple[int, str], ArmExclusions]  # (window start, checkpoint) -> counts
    window_s: int
    unattributed: dict[str, int]  # reason -> rows attributable to no checkpoint


def attribute(items: Iterable[Excluded], sessions: Mapping[tuple[str, str], str]) -> tuple[list[Excluded], Counter[str]]:
    """Items with their checkpoint filled from their session ((org, session) -> checkpoint) where they lack
    one; the rest are counted."""
    kept, lost = [], Counter[str]()
    for x in items:
        ck = x.checkpoint_id or sessions.get((x.org_id, x.session_id), "")
        if ck:
            kept.append(x if ck == x.checkpoint_id else Excluded(x.reason, ck, x.org_id, x.session_id, x.unit, x.ts))
        else:
            lost[x.reason] += 1
    return kept, lost


def balance(window_rows: Iterable[Mapping[str, Any]], items: Iterable[Excluded], sessions: Mapping[tuple[str, str], str], *,
            window_s: int, spec_version: str | None = None) -> Balance:
    """Scored turns from the window partials of ``window_s`` under ``spec_version`` (None: the highest present;
    every active spec scores the same turns), excluded turns from ``items``."""
    overall: dict[str, ArmExclusions] = {}
    windows: dict[tuple[int, str], ArmExclusions] = {}
    cells = merge_cells(window_rows)
    if spec_version is None:
        spec_version = max((k[3] for k in cells), default="")
    for (size, start, ck, spec, _), cell in cells.items():
        if size == window_s and spec == spec_version:
            n = int(cell.sums["samples"])
            windows.setdefault((start, ck), ArmExclusions()).turns += n
            overall.setdefault(ck, ArmExclusions()).turns += n
    kept, lost = attribute(items, sessions)
    for x in kept:
        overall.setdefault(x.checkpoint_id, ArmExclusions()).units[x.reason].add(x.unit)
        if x.ts is not None:
            key = (window_start(x.ts, window_s * 1000), x.checkpoint_id)
            windows.setdefault(key, ArmExclusions()).units[x.reason].add(x.unit)
    return Balance(overall, windows, window_s, dict(lost))


@dataclass(frozen=True, slots=True)
class BalanceConfig:
    alpha: float = 0.001
    min_samples: int = 200
    min_effect: float = 0.02  # absolute difference of rates


def balance_alerts(b: Balance, baseline: str, cfg: BalanceConfig | None = None,
                   rewards: Mapping[tuple[int, str], float] | None = None) -> list[Alert]:
    """Alerts for every window where a checkpoint's exclusion rate differs from the baseline's (see module doc).

    ``rewards`` maps (window start, checkpoint) to mean reward, for the alert's ``reward_delta`` (0 without).
    Ordered by window, checkpoint, reason; ``raised_at`` is the window end (deterministic).
    """
    cfg = cfg or BalanceConfig()
    rewards = rewards or {}
    out: list[Alert] = []
    for (start, ck), arm in sorted(b.windows.items()):
        base = b.windows.get((start, baseline))
        if ck == baseline or base is None or min(arm.population, base.population) < max(1, cfg.min_samples):
            continue
        for reason in (*REASONS, ALL):
            x1, n1, x0, n0 = arm.count(reason), arm.population, base.count(reason), base.population
            p1, p0, z, _ = rate_test(x1, n1, x0, n0)
            p = min(1.0, math.erfc(abs(z) / math.sqrt(2)))
            if abs(p1 - p0) < cfg.min_effect or p >= cfg.alpha:
                continue
            end = start + b.window_s * 1000
            delta = rewards.get((start, ck), 0.0) - rewards.get((start, baseline), 0.0)
            monitor = f"exclusion_{reason}"
            out.append(Alert(
                alert_id=stable_id(monitor, ck, baseline, start, b.window_s), monitor=monitor, checkpoint_id=ck,
                baseline=baseline, window_start=start, window_end=end, value=p1, baseline_value=p0, z=z, p_value=p,
                reward_delta=delta,
                message=(f"{reason.replace('_', ' ')} turns: {p1:.2%} of {ck}'s vs {p0:.2%} of {baseline}'s "
                         f"(n={n1}/{n0}, p={p:.2g}): the arms are compared on different populations "
                         f"[{b.window_s}s window]"),
                raised_at=end,
            ))
    return out


def mean_rewards(window_rows: Iterable[Mapping[str, Any]], *, window_s: int, spec_version: str) -> dict[tuple[int, str], float]:
    """Mean reward per (window start, checkpoint) from window partials."""
    out = {}
    for (size, start, ck, spec, _), cell in merge_cells(window_rows).items():
        if size == window_s and spec == spec_version and cell.sums["samples"]:
            out[(start, ck)] = cell.sums["reward_sum"] / cell.sums["samples"]
    return out
