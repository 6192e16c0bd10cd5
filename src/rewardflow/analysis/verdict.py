"""A candidate's verdict: what its A/B report, the deploy gate and the Goodhart monitors say together.

A candidate is **deployable** when the gate passes and no monitor (Goodhart, or exclusion balance:
``exclusion_<reason>``) alerted on it; otherwise it is
**blocked**, and the verdict names every failed rule and every alert. Beside the decision it lists
the significant gains and regressions among the outcome metrics (the published ones and mean
reward), and whether each published metric moved in the published direction (persistence up,
dissatisfied follow-ups down, latency down), significant or not.

Contract: pure and deterministic; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rewardflow.analysis.ab import Report
from rewardflow.analysis.gate import GateResult

# metric -> the direction of the published A/B result (+1 up, -1 down)
PUBLISHED_DIRECTIONS: dict[str, int] = {"persistence_rate": +1, "dissatisfied_rate": -1, "latency_p50": -1}
OUTCOMES = ("persistence_rate", "dissatisfied_rate", "latency_p50", "mean_reward")


@dataclass(frozen=True, slots=True)
class Verdict:
    checkpoint: str
    baseline: str
    deploy: bool
    failed_rules: list[str]  # gate rules that failed (metric names, or "min_turns")
    alerts: list[str]  # monitors that alerted on this checkpoint
    gains: list[str]  # outcome metrics significantly better
    regressions: list[str]  # outcome metrics significantly worse
    published_directions: dict[str, bool]  # published metric -> moved the published way

    @property
    def headline(self) -> str:
        """One line: the decision and why."""
        if self.deploy:
            gains = f"significant gains: {', '.join(self.gains)}" if self.gains else "no significant gain at this size"
            agreed = sum(self.published_directions.values())
            return (f"DEPLOY: gate passed, no monitor alert; {gains}; "
                    f"{agreed}/{len(self.published_directions)} published directions reproduced")
        why = []
        if self.failed_rules:
            why.append(f"gate failed on {', '.join(self.failed_rules)}")
        goodhart = [a for a in self.alerts if not a.startswith("exclusion_")]
        balance = [a for a in self.alerts if a.startswith("exclusion_")]
        if goodhart:
            why.append(f"Goodhart alerts: {', '.join(goodhart)}")
        if balance:
            why.append(f"exclusion balance alerts: {', '.join(balance)}")
        return "BLOCK: " + "; ".join(why)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "headline": self.headline}


def verdict_of(report: Report, gate: GateResult, alerts: Iterable[Mapping[str, Any]]) -> Verdict:
    """The verdict on ``report.candidate``; ``alerts`` may hold other checkpoints' alerts (ignored)."""
    mine = sorted({str(a["monitor"]) for a in alerts if a["checkpoint_id"] == report.candidate})
    failed = [r.metric for r in gate.results if not r.passed]
    outcomes = [report.metrics[m] for m in OUTCOMES if m in report.metrics]
    directions = {m: (report.metrics[m].delta > 0) == (sign > 0) and report.metrics[m].delta != 0
                  for m, sign in PUBLISHED_DIRECTIONS.items() if m in report.metrics}
    return Verdict(report.candidate, report.baseline, gate.passed and not mine, failed, mine,
                   [m.name for m in outcomes if m.verdict == "better"],
                   [m.name for m in outcomes if m.verdict == "worse"], directions)
