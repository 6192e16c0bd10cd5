"""The deploy gate: a TOML policy of rules evaluated against an A/B :class:`Report`.

A rule bounds how far one metric may move the wrong way, with exactly one
margin: ``max_drop_points`` / ``max_rise_points`` (percentage points, rate
metrics only: 0.5 = 0.005), ``max_drop_pct`` / ``max_rise_pct`` (relative,
percent of the baseline value) or ``max_drop`` / ``max_rise`` (absolute, in
the metric's unit: ms, reward).

Each rule reads the two-sided interval of the delta at its ``confidence``:

* ``test = "non_inferiority"`` (the default): pass only if the interval's bound on
  the bad side is within the margin, i.e. the data shows the change is no
  worse than allowed. Too little data fails.
* ``test = "regression"``: fail only if even the good-side bound is beyond
  the margin, i.e. the data shows a regression larger than allowed.

A rule without its own ``confidence`` / ``test`` takes the policy-level value
(defaults 0.95 and ``non_inferiority``). ``min_turns`` (policy level) fails
the gate when an arm has fewer final rows. A rule on an exclusion metric
(``excluded_rate``, ``dead_letter_rate``, ``orphan_rate``, ``late_rate``)
needs a report made with exclusion counts (``rewardflow compare`` reads them
from ClickHouse); on a report without them (rows from a file) it is not
evaluated, and its result says so.

Contract: :func:`load_policy` raises :class:`PolicyError` with a one-line
message naming the file and field; :func:`evaluate` is pure.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rewardflow.analysis.ab import EXCLUSION_METRICS, METRICS, MetricDelta, Report
from rewardflow.analysis.format import delta_suffix, fmt_change, fmt_conf

Test = Literal["non_inferiority", "regression"]
MARGINS = ("max_drop_points", "max_rise_points", "max_drop_pct", "max_rise_pct", "max_drop", "max_rise")


DEFAULT_POLICY = Path(__file__).with_name("deploy-gate.toml")  # the example gate, shipped with the package


class PolicyError(ValueError):
    """A gate policy file is missing, unreadable or invalid."""


class Rule(BaseModel):
    """One bound on one metric (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    metric: str
    max_drop_points: float | None = Field(default=None, ge=0)
    max_rise_points: float | None = Field(default=None, ge=0)
    max_drop_pct: float | None = Field(default=None, ge=0)
    max_rise_pct: float | None = Field(default=None, ge=0)
    max_drop: float | None = Field(default=None, ge=0)
    max_rise: float | None = Field(default=None, ge=0)
    confidence: float | None = Field(default=None, gt=0, lt=1, description="default: the policy's")
    test: Test | None = Field(default=None, description="default: the policy's")

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in METRICS and v not in EXCLUSION_METRICS:
            raise ValueError(f"unknown metric {v!r}; expected one of {', '.join([*METRICS, *EXCLUSION_METRICS])}")
        return v

    @model_validator(mode="after")
    def _one_margin(self) -> Rule:
        given = [m for m in MARGINS if getattr(self, m) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(MARGINS)} (got {len(given)})")
        if given[0].endswith("_points") and self.metric in METRICS and METRICS[self.metric].unit != "rate":
            raise ValueError(f"{given[0]} applies to rate metrics only; use max_drop/max_rise or *_pct for {self.metric}")
        return self

    @property
    def margin(self) -> tuple[str, float]:
        name = next(m for m in MARGINS if getattr(self, m) is not None)
        value = getattr(self, name)
        assert value is not None
        return name, float(value)


class Policy(BaseModel):
    """A gate policy: defaults for its rules, the rules, and the fewest final rows per arm."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    min_turns: int = Field(default=1, ge=1)
    confidence: float = Field(default=0.95, gt=0, lt=1)
    test: Test = "non_inferiority"
    rules: list[Rule] = Field(default_factory=list, alias="rule")

    @model_validator(mode="before")
    @classmethod
    def _inherit(cls, data: Any) -> Any:
        """Rules without their own ``confidence`` / ``test`` take the policy's."""
        if not isinstance(data, dict) or not isinstance(data.get("rule"), list):
            return data
        defaults = {k: data[k] for k in ("confidence", "test") if k in data}
        rules = [{**defaults, **r} if isinstance(r, dict) else r for r in data["rule"]]
        return {**data, "rule": rules}


@dataclass(frozen=True, slots=True)
class RuleResult:
    metric: str
    passed: bool
    reason: str


@dataclass(frozen=True, slots=True)
class GateResult:
    passed: bool
    results: list[RuleResult]


def load_policy(path: Path) -> Policy:
    """Read and validate a TOML policy (``default``: :data:`DEFAULT_POLICY`); raises :class:`PolicyError` (one line)."""
    if str(path) == "default":
        path = DEFAULT_POLICY
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{path}: {exc}") from None
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise PolicyError(f"{path}: {loc or 'policy'}: {err['msg']}") from None


def check_rule(rule: Rule, m: MetricDelta, *, confidence: float = 0.95, test: Test = "non_inferiority") -> RuleResult:
    """Pass/fail of one rule on one metric, with the reason in words.

    ``confidence`` and ``test`` apply when the rule does not set its own.
    """
    kind, limit = rule.margin
    drop = "_drop" in kind
    relative = kind.endswith("_pct")
    suffix = "pp" if kind.endswith("_points") else "%" if relative else delta_suffix(m.unit)
    scale = 100.0 if suffix in ("pp", "%") else 1.0
    conf, mode = rule.confidence or confidence, rule.test or test
    lo, hi = m.interval(conf, relative=relative)
    if math.isnan(lo):
        return RuleResult(rule.metric, False, f"{rule.metric}: no data to decide ({m.n_baseline} vs {m.n_candidate} samples)")
    lo, hi = lo * scale, hi * scale
    bad, good = (-lo, -hi) if drop else (hi, lo)  # movement the wrong way: worst and best case
    sign = -1.0 if drop else 1.0
    if mode == "non_inferiority":
        passed, what = bad <= limit, f"worst case {fmt_change(sign * bad, suffix)}"
    else:
        passed, what = good <= limit, f"best case {fmt_change(sign * good, suffix)}"
    ci = f"{fmt_conf(conf)} CI {fmt_change(lo, suffix)} to {fmt_change(hi, suffix)}"
    allowed = f"the allowed {'drop' if drop else 'rise'} of {fmt_change(limit, suffix, signed=False)}"
    verb = "is within" if passed else "exceeds"
    return RuleResult(rule.metric, passed, f"{rule.metric}: {what} ({ci}) {verb} {allowed} [{mode}]")


def evaluate(report: Report, policy: Policy) -> GateResult:
    """Every rule's result; the gate passes only if all rules and ``min_turns`` pass."""
    results = []
    for ck, n in report.turns.items():
        if n < policy.min_turns:
            results.append(RuleResult("min_turns", False, f"min_turns: {ck} has {n} final rows, fewer than {policy.min_turns}"))
    for r in policy.rules:
        m = report.metrics.get(r.metric)
        if m is None:  # an exclusion metric of a report made without exclusion counts
            results.append(RuleResult(r.metric, True, f"{r.metric}: not evaluated: the report has no exclusion "
                                                      "counts (rows read from a file)"))
            continue
        results.append(check_rule(r, m, confidence=policy.confidence, test=policy.test))
    return GateResult(all(r.passed for r in results), results)
