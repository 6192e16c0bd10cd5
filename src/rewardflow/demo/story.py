"""The demo's judgement of its candidates, read back from what the pipeline stored.

For each candidate against the baseline: the A/B report, the deploy gate
(:data:`~rewardflow.analysis.gate.DEFAULT_POLICY` unless another policy is given), the Goodhart
alerts, the exclusion balance (:mod:`rewardflow.analysis.balance`) and the verdict
(:mod:`rewardflow.analysis.verdict`). For every candidate that was blocked by a Goodhart alert, the window of its first alert is replayed under the *next* reward spec version (the
first registered version after the active one), with the baseline's turns of the same window, as
``rewardflow rewards replay --spec … --from … --to … --checkpoint … --dry-run`` would: the stored
events through the stream's own core. The result is each checkpoint's mean reward under both
versions, so the page shows what the fix would change before anyone activates it.

Contract: reads only (nothing is written); blocks while querying and replaying. Raises
:class:`~rewardflow.analysis.source.SourceError` when the reward tables cannot be read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewardflow.analysis.ab import Report, compare
from rewardflow.analysis.gate import DEFAULT_POLICY, GateResult, Policy, evaluate, load_policy
from rewardflow.analysis.verdict import Verdict, verdict_of
from rewardflow.lineage.registry import Registry
from rewardflow.settings import Settings


@dataclass(frozen=True, slots=True)
class Judged:
    report: Report
    gate: GateResult
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class ReplayShift:
    """Mean reward per turn of each replayed checkpoint in one window, stored vs the next spec."""

    baseline: str
    candidate: str
    spec_from: str
    spec_to: str
    window_start: int
    window_end: int
    rows: list[dict[str, Any]]  # {checkpoint_id, turns, mean_from, mean_to}
    command: str  # the equivalent CLI call

    def lead(self, key: str) -> float:
        """The candidate's mean reward minus the baseline's under ``key`` ('mean_from' or 'mean_to')."""
        by = {r["checkpoint_id"]: r for r in self.rows}
        return float(by[self.candidate][key]) - float(by[self.baseline][key])


def judge(rows: Any, baseline: str, candidates: list[str], spec: str, alerts: list[Any],
          policy: Policy, registry: Registry | None = None, exclusions: Any = None) -> dict[str, Judged]:
    """Report, gate and verdict of every candidate (pure, over final reward rows), each report with
    its arms' lineage when ``registry`` is given and their exclusions when ``exclusions`` is
    (checkpoint -> :class:`~rewardflow.analysis.balance.ArmExclusions`)."""
    out = {}
    for cand in candidates:
        report = compare(rows, baseline, cand, spec_version=spec, registry=registry, exclusions=exclusions)
        gate = evaluate(report, policy)
        out[cand] = Judged(report, gate, verdict_of(report, gate, alerts))
    return out


@dataclass(frozen=True, slots=True)
class Corrections:
    """Turns re-scored by signals that came after they were finalised, within the correction window."""

    by_checkpoint: dict[str, int]  # checkpoint -> corrected samples
    examples: list[dict[str, Any]]  # the largest changes: sample_id, checkpoint_id, revision, first/latest reward

    @property
    def total(self) -> int:
        return sum(self.by_checkpoint.values())


def corrections_of(rows: list[dict[str, Any]], examples: int = 3) -> Corrections:
    """Summary of :func:`~rewardflow.analysis.source.fetch_corrections` rows (pure)."""
    by: Counter[str] = Counter(str(r["checkpoint_id"]) for r in rows)
    top = sorted(rows, key=lambda r: (-abs(float(r["latest_reward"]) - float(r["first_reward"])), str(r["sample_id"])))
    return Corrections(dict(sorted(by.items())), top[:examples])


def load_gate(path: Path | None) -> Policy:
    return load_policy(path or DEFAULT_POLICY)


def next_spec(settings: Settings, active: str) -> Any | None:
    """The first spec file whose version sorts after ``active`` in the spec directory, or None."""
    from rewardflow.rewards.registry import load_dir, specs_dir

    later = sorted((f for f in load_dir(specs_dir(settings)) if f.spec.version > active), key=lambda f: f.spec.version)
    return later[0] if later else None


def replay_shift(settings: Settings, spec_file: Any, active: str, baseline: str, candidate: str,
                 window: tuple[int, int]) -> ReplayShift:
    """Replay ``candidate``'s and ``baseline``'s turns served in ``window`` under ``spec_file`` (dry run)."""
    from rewardflow.cli.rewards import open_store, run_replay, stored_rows
    from rewardflow.core.config import JoinConfig
    from rewardflow.rewards.replay import ReplayRange

    rows = []
    with open_store(settings) as store:
        for ck in (baseline, candidate):
            rng = ReplayRange(window[0], window[1], ck)
            tally: Counter[str] = Counter()
            new = run_replay(store, spec_file.spec, JoinConfig.from_settings(settings), rng, tally)
            old = stored_rows(store, active, rng)
            rows.append({"checkpoint_id": ck, "turns": len(new), "turns_stored": len(old),
                         "mean_from": _mean(float(r["reward"]) for r in old),
                         "mean_to": _mean(float(r["reward"]) for r in new)})
    command = (f"rewardflow rewards replay --spec {spec_file.path} --from {window[0]} --to {window[1]} "
               f"--checkpoint {candidate} --against {active} --dry-run")
    return ReplayShift(baseline, candidate, active, spec_file.spec.version, window[0], window[1], rows, command)


def _mean(values: Any) -> float:
    xs = list(values)
    return sum(xs) / len(xs) if xs else float("nan")
