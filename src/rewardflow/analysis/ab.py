"""A/B comparison of a candidate checkpoint against a baseline, over reward rows.

Metrics (per arm, then candidate − baseline with a two-sided CI):

* ``persistence_rate``: edits persisted at the final horizon (900 s by
  default; survival score >= 0.5) / edits checked at that horizon, pooled
  over the arm's turns: Σ persisted[h] / Σ checked[h] with h = the row's
  ``horizon_s``. Turns without a checked edit carry no information. SE: ratio
  estimator over turns (edits of one turn are not independent).
* ``dissatisfied_rate``: turns with ``n_dissatisfied > 0`` / turns.
* ``mean_reward``: mean ``reward`` per turn (Welch interval).
* ``latency_p50`` / ``latency_p95``: quantiles of ``latency_ms`` per turn (ms),
  CI from order statistics.
* ``broken_tool_rate`` / ``clarifying_rate`` / ``edit_rate``: turns with at
  least one broken tool call / clarifying question / edit, over turns (the
  guard behaviours that reveal reward hacking).

Given each arm's exclusions (:mod:`rewardflow.analysis.balance`), the report also compares the
share of turns kept out of the rewards: ``excluded_rate`` (any reason), ``dead_letter_rate``,
``orphan_rate`` and ``late_rate`` (binomial SE over the arm's population of turns). A candidate
whose turns vanish more often than the baseline's is judged on a different population.

Relative deltas are ``candidate / baseline − 1`` (the published "+2.28 %").

Lineage: given the checkpoint registry, the report carries each arm's registered checkpoint
(parent, generation, deployment time), or None for an arm whose checkpoint is not registered;
without a registry, ``lineage`` is None (not looked up).

Contract: pure and deterministic. :func:`compare` raises
:class:`~rewardflow.analysis.rows.AnalysisError` when an arm has no final
rows under the chosen spec.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import orjson

from rewardflow.analysis.balance import ArmExclusions
from rewardflow.analysis.rows import AnalysisError, ArmSample, arm_samples, final_rows, require_columns, to_dicts
from rewardflow.analysis.stats import Difference, Estimate, difference, mean_estimate, quantile_estimate, ratio_estimate
from rewardflow.lineage.registry import Checkpoint, Registry

Unit = Literal["rate", "reward", "ms"]


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str
    label: str
    unit: Unit
    higher_is_better: bool
    estimate: Callable[[ArmSample], Estimate]


def _share(attr: str) -> Callable[[ArmSample], Estimate]:
    return lambda a: ratio_estimate(getattr(a, attr), [1] * a.turns)


METRICS: dict[str, MetricDef] = {m.name: m for m in (
    MetricDef("persistence_rate", "edit persistence", "rate", True,
              lambda a: ratio_estimate(a.persisted, a.checked)),
    MetricDef("dissatisfied_rate", "dissatisfied follow-up", "rate", False, _share("dissatisfied")),
    MetricDef("mean_reward", "mean reward", "reward", True, lambda a: mean_estimate(a.reward)),
    MetricDef("latency_p50", "latency p50", "ms", False, lambda a: quantile_estimate(a.latency_ms, 0.5)),
    MetricDef("latency_p95", "latency p95", "ms", False, lambda a: quantile_estimate(a.latency_ms, 0.95)),
    MetricDef("broken_tool_rate", "broken-tool turns", "rate", False, _share("broken")),
    MetricDef("clarifying_rate", "clarifying turns", "rate", False, _share("clarifying")),
    MetricDef("edit_rate", "edit turns", "rate", True, _share("edited")),
)}


# exclusion metric -> (the balance reason it reads, label)
EXCLUSION_METRICS: dict[str, tuple[str, str]] = {
    "excluded_rate": ("excluded", "excluded turns"),
    "dead_letter_rate": ("dead_letter", "dead-lettered turns"),
    "orphan_rate": ("orphan", "orphan turns"),
    "late_rate": ("late", "turns with late signals"),
}


@dataclass(frozen=True, slots=True)
class MetricDelta:
    """One metric in both arms and their difference (candidate − baseline)."""

    name: str
    label: str
    unit: Unit
    higher_is_better: bool
    baseline: float
    candidate: float
    n_baseline: int  # units behind the estimate (turns; turns with a checked edit for persistence)
    n_candidate: int
    delta: float
    se: float
    df: float
    ci_low: float
    ci_high: float
    rel_delta: float  # candidate / baseline − 1
    rel_se: float
    rel_ci_low: float
    rel_ci_high: float
    confidence: float

    def interval(self, confidence: float, relative: bool = False) -> tuple[float, float]:
        """Two-sided interval of the (relative) delta at another confidence level."""
        d = Difference(self.delta, self.se, self.df, self.rel_delta, self.rel_se)
        return d.rel_interval(confidence) if relative else d.interval(confidence)

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        return self.ci_low > 0 or self.ci_high < 0

    @property
    def verdict(self) -> Literal["better", "worse", "neutral", "n/a"]:
        if math.isnan(self.ci_low):
            return "n/a"
        if not self.significant:
            return "neutral"
        return "better" if (self.delta > 0) == self.higher_is_better else "worse"


@dataclass(frozen=True, slots=True)
class Report:
    """An A/B report of ``candidate`` against ``baseline`` under one reward spec."""

    baseline: str
    candidate: str
    spec_version: str
    confidence: float
    turns: dict[str, int]  # checkpoint -> final rows (turns)
    metrics: dict[str, MetricDelta]
    lineage: dict[str, Checkpoint | None] | None = None  # checkpoint -> its registration; None: not looked up
    exclusions: dict[str, dict[str, int]] | None = None  # checkpoint -> population and turns by reason; None: not given

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in asdict(self).items() if k != "metrics"}
        out["metrics"] = {n: {**asdict(m), "significant": m.significant, "verdict": m.verdict}
                          for n, m in self.metrics.items()}
        return out

    def to_json(self) -> str:
        """JSON text; ``nan``/``inf`` become ``null``."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def metric_delta(m: MetricDef, base: ArmSample, cand: ArmSample, confidence: float) -> MetricDelta:
    return estimate_delta(m.name, m.label, m.unit, m.higher_is_better, m.estimate(base), m.estimate(cand), confidence)


def estimate_delta(name: str, label: str, unit: Unit, higher_is_better: bool, a: Estimate, b: Estimate,
                   confidence: float) -> MetricDelta:
    """Baseline ``a`` and candidate ``b`` of one metric, and their difference."""
    d = difference(a, b)
    lo, hi = d.interval(confidence)
    rlo, rhi = d.rel_interval(confidence)
    return MetricDelta(name, label, unit, higher_is_better, a.value, b.value, a.n, b.n, d.delta, d.se,
                       d.df, lo, hi, d.rel, d.rel_se, rlo, rhi, confidence)


def exclusion_deltas(base: ArmExclusions, cand: ArmExclusions, confidence: float) -> dict[str, MetricDelta]:
    """The exclusion metrics of two arms (:data:`EXCLUSION_METRICS`)."""
    return {name: estimate_delta(name, label, "rate", False, base.estimate(reason), cand.estimate(reason), confidence)
            for name, (reason, label) in EXCLUSION_METRICS.items()}


def _counts(arm: ArmExclusions) -> dict[str, int]:
    return {"turns": arm.turns, "population": arm.population,
            **{reason: arm.count(reason) for reason, _ in EXCLUSION_METRICS.values()},
            "scoring_error": arm.count("scoring_error")}


def compare(rows: Any, baseline: str, candidate: str, *, spec_version: str | None = None,
            confidence: float = 0.95, registry: Registry | None = None,
            exclusions: Mapping[str, ArmExclusions] | None = None) -> Report:
    """The A/B report of ``candidate`` vs ``baseline`` from reward rows, with each arm's lineage from
    ``registry`` and the exclusion metrics from ``exclusions`` (checkpoint -> the turns it lost; its
    scored turns are its final rows here) when given (see module doc). An arm missing from
    ``exclusions`` lost no turn."""
    if baseline == candidate:
        raise AnalysisError("baseline and candidate must be different checkpoints")
    data = to_dicts(rows)
    require_columns(data)
    if not any(int(r["provisional"]) == 0 for r in data):
        raise AnalysisError(f"no final reward rows (provisional = 0) for checkpoints {baseline!r} and {candidate!r}")
    final, spec = final_rows(data, spec_version)
    arms = arm_samples(final, (baseline, candidate))
    for ck, arm in arms.items():
        if arm.turns == 0:
            raise AnalysisError(f"no final reward rows for checkpoint {ck!r} under spec {spec!r}")
    base, cand = arms[baseline], arms[candidate]
    metrics = {name: metric_delta(m, base, cand, confidence) for name, m in METRICS.items()}
    lineage = None if registry is None else {ck: registry.get(ck) for ck in (baseline, candidate)}
    counts = None
    if exclusions is not None:
        # the scored population is the arm's final rows; the exclusions give the turns it lost
        ex = {ck: ArmExclusions(arms[ck].turns, (exclusions.get(ck) or ArmExclusions()).units)
              for ck in (baseline, candidate)}
        metrics.update(exclusion_deltas(ex[baseline], ex[candidate], confidence))
        counts = {ck: _counts(arm) for ck, arm in ex.items()}
    return Report(baseline, candidate, spec, confidence, {baseline: base.turns, candidate: cand.turns}, metrics,
                  lineage, counts)
