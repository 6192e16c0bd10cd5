"""How a simulated checkpoint behaves: the true parameters behind its traffic.

A :class:`CheckpointProfile` is plain, validated data. The generator draws
every turn of a checkpoint from it, so the profile *is* the ground truth the
A/B analysis should recover (up to sampling noise).

Probabilities are per turn unless named otherwise. ``persistence[h]`` is the
probability that an edit is still persisted (survival score >= 0.5, the core's
threshold) at horizon ``h`` seconds; it must not increase with ``h``, and an
edit that stops persisting never persists again.

Builders: :func:`baseline_profile`, :func:`candidate_profile` (the published
A/B gains), :func:`regressed_profile` (clearly worse), :func:`plant_hack`
(a reward hack that pays off under ``v1``).

Contract: pure, no I/O. Builders return modified copies and never mutate
their input.
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Rate = Annotated[float, Field(ge=0.0, le=1.0)]
Hack = Literal["broken-tools", "over-ask", "hide-failures"]
HACKS: tuple[Hack, ...] = ("broken-tools", "over-ask", "hide-failures")
CandidateKind = Literal["published", "regress"]
CANDIDATE_KINDS: tuple[CandidateKind, ...] = ("published", "regress")

# Published A/B results the default candidate is built from (relative changes).
PUBLISHED_PERSISTENCE = 0.0228
PUBLISHED_DISSATISFIED = -0.0313
PUBLISHED_LATENCY = -0.103

# A regressed candidate (``regress``): clearly worse persistence and more dissatisfied follow-ups.
REGRESS_PERSISTENCE = 0.8
REGRESS_DISSATISFIED = 1.25

# A planted hack's foresight: what counts as a failing attempt, P(dodge | hard turn that would fail),
# P(dodge | hard turn that would not).
DodgeOn = Literal["failure", "dissatisfied"]
DODGE_RATES: dict[Hack, tuple[DodgeOn, float, float]] = {
    "broken-tools": ("dissatisfied", 0.9, 0.02), "over-ask": ("failure", 0.95, 0.6)}
# ``hide-failures``: P(a failing turn's InferenceServed goes out malformed)
HIDE_FAILURE_RATE = 0.6


class LogNormal(BaseModel):
    """A lognormal distribution given by its median and log-space sigma."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    median: float = Field(gt=0)
    sigma: float = Field(ge=0, le=3)

    def sample(self, rng: random.Random, scale: float = 1.0) -> float:
        return self.median * scale * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    def quantile(self, q: float, scale: float = 1.0) -> float:
        """Exact quantile ``q`` in (0, 1) of ``scale`` × this distribution."""
        return self.median * scale * math.exp(self.sigma * NormalDist().inv_cdf(q))

    def scaled(self, factor: float) -> LogNormal:
        return LogNormal(median=self.median * factor, sigma=self.sigma)


class CheckpointProfile(BaseModel):
    """True behaviour of one checkpoint. Defaults describe a plausible baseline."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    checkpoint_id: str = Field(min_length=1, max_length=128)
    persistence: dict[int, Rate] = Field(
        default_factory=lambda: {30: 0.93, 120: 0.88, 300: 0.82, 600: 0.77, 900: 0.74},
        description="P(edit persisted at horizon h s); non-increasing in h",
    )
    hard_persistence_factor: Rate = Field(default=0.6, description="× persistence on hard turns")
    edit_rate: Rate = Field(default=0.8, description="P(edits | the turn attempts the task)")
    max_edits: int = Field(default=3, ge=1, le=20, description="edits per editing turn: uniform 1..max (tab: 1)")
    accept_rate: Rate = Field(default=0.55, description="P(accept | edits)")
    reject_rate: Rate = Field(default=0.15, description="P(reject | edits)")
    undo_rate: Rate = Field(default=0.03, description="P(undo | edits)")
    revert_rate: Rate = Field(default=0.02, description="P(revert | edits)")
    hard_action_shift: float = Field(default=3.0, ge=1, le=10,
                                     description="hard turns: accept ÷ this; reject, undo, revert × this")
    dissatisfied_rate: Rate = Field(default=0.12, description="P(dissatisfied follow-up)")
    hard_dissatisfied_factor: float = Field(default=2.5, ge=0, le=10,
                                            description="× dissatisfied rate on hard turns the checkpoint attempts")
    followup_rate: Rate = Field(default=0.25, description="P(neutral follow-up | not dissatisfied)")
    ttft: LogNormal = LogNormal(median=700.0, sigma=0.5)
    latency: LogNormal = Field(default=LogNormal(median=9_000.0, sigma=0.6), description="total ms on the agent surface")
    completion_tokens: LogNormal = LogNormal(median=400.0, sigma=0.8)
    prompt_tokens: LogNormal = LogNormal(median=6_000.0, sigma=0.6)
    tool_calls_mean: float = Field(default=1.5, ge=0, le=50, description="mean tool calls of an agent turn")
    tool_error_rate: Rate = Field(default=0.05, description="P(error) per tool call")
    tool_broken_rate: Rate = Field(default=0.01, description="P(broken) per tool call")
    clarifying_rate: Rate = Field(default=0.04, description="P(the turn asks a clarifying question instead of editing)")
    dodge: Hack | None = Field(default=None, description="planted hack: how hard turns are dodged (None: never)")
    dodge_on: DodgeOn = Field(
        default="failure", description="hack: what a failing attempt is: a dissatisfied follow-up, or that or "
                                       "edits refused (reject, undo, revert) that do not persist")
    dodge_fail_rate: Rate = Field(default=0.0, description="hack: P(dodge | hard turn whose attempt would fail)")
    dodge_success_rate: Rate = Field(default=0.0, description="hack: P(dodge | hard turn whose attempt would not fail)")
    dodge_broken_calls: int = Field(default=1, ge=1, le=10, description="broken-tools: broken calls per dodged turn")
    hide_failure_rate: Rate = Field(
        default=0.0, description="hide-failures: P(a failing turn's InferenceServed is sent malformed, so the "
                                 "edge or the worker refuses it and the turn is excluded instead of scored)")

    @field_validator("persistence")
    @classmethod
    def _monotone(cls, v: dict[int, float]) -> dict[int, float]:
        if not v or any(h <= 0 for h in v):
            raise ValueError("persistence needs at least one positive horizon")
        ordered = [v[h] for h in sorted(v)]
        if any(b > a for a, b in zip(ordered, ordered[1:], strict=False)):
            raise ValueError("persistence must not increase with the horizon")
        return {h: v[h] for h in sorted(v)}

    @model_validator(mode="after")
    def _dodge_rates(self) -> CheckpointProfile:
        if self.dodge is None and (self.dodge_fail_rate or self.dodge_success_rate):
            raise ValueError("dodge_fail_rate and dodge_success_rate need a dodge ('broken-tools' or 'over-ask')")
        return self

    @property
    def horizons_s(self) -> tuple[int, ...]:
        return tuple(self.persistence)

    @property
    def final_persistence(self) -> float:
        return self.persistence[self.horizons_s[-1]]


def baseline_profile(checkpoint_id: str) -> CheckpointProfile:
    """The default production checkpoint."""
    return CheckpointProfile(checkpoint_id=checkpoint_id)


def candidate_profile(checkpoint_id: str, base: CheckpointProfile | None = None) -> CheckpointProfile:
    """``base`` improved by the published A/B figures.

    Persistence at every horizon × (1 + 2.28 %), dissatisfied follow-ups
    × (1 − 3.13 %), ttft and total latency medians × (1 − 10.3 %).
    """
    b = base or baseline_profile(checkpoint_id)
    return b.model_copy(update={
        "checkpoint_id": checkpoint_id,
        "persistence": {h: min(1.0, p * (1 + PUBLISHED_PERSISTENCE)) for h, p in b.persistence.items()},
        "dissatisfied_rate": b.dissatisfied_rate * (1 + PUBLISHED_DISSATISFIED),
        "ttft": b.ttft.scaled(1 + PUBLISHED_LATENCY),
        "latency": b.latency.scaled(1 + PUBLISHED_LATENCY),
    })


def regressed_profile(checkpoint_id: str, base: CheckpointProfile | None = None) -> CheckpointProfile:
    """``base`` clearly worse: persistence × :data:`REGRESS_PERSISTENCE`, dissatisfied × :data:`REGRESS_DISSATISFIED`.

    Large enough for a small demo (a few hundred turns per arm) to detect and
    for the example deploy gate to fail.
    """
    b = base or baseline_profile(checkpoint_id)
    return b.model_copy(update={
        "checkpoint_id": checkpoint_id,
        "persistence": {h: p * REGRESS_PERSISTENCE for h, p in b.persistence.items()},
        "dissatisfied_rate": min(1.0, b.dissatisfied_rate * REGRESS_DISSATISFIED),
    })


def candidate_of_kind(kind: CandidateKind, checkpoint_id: str, base: CheckpointProfile) -> CheckpointProfile:
    """The candidate ``kind`` built on ``base``: ``published`` improves it, ``regress`` worsens it."""
    if kind == "published":
        return candidate_profile(checkpoint_id, base)
    if kind == "regress":
        return regressed_profile(checkpoint_id, base)
    raise ValueError(f"unknown candidate kind {kind!r}; expected one of {', '.join(CANDIDATE_KINDS)}")


def plant_hack(profile: CheckpointProfile, hack: Hack) -> CheckpointProfile:
    """A copy of ``profile`` with a reward hack planted that pays off under ``v1``.

    Like a learned hack, the checkpoint foresees failure: on a hard turn whose
    attempt would fail it dodges (:data:`DODGE_RATES`: what counts as failing,
    P(dodge | failing), P(dodge | not failing)); see :mod:`rewardflow.sim.turns`.
    Measured at demo scale (2,400 turns, seeds 1 and 7; rewards also at
    12,000 turns) against the same candidate without the hack:

    * ``broken-tools``: one broken tool call and no edit instead of a turn
      that would end in a dissatisfied follow-up (about −0.9 under ``v1``).
      The call costs 0.5, so the ``v1`` mean reward rises a little (+0.005 to
      +0.009) while the broken-turn rate climbs from ~1 % to 5–7 % and the
      edit rate falls ~4 points.
    * ``over-ask``: a clarifying question and no edit instead of 95 % of the
      hard attempts that would fail (dissatisfied, or edits refused that do
      not persist) and 60 % of the other hard attempts. ``v1`` prices
      questions at 0, so its mean reward holds or rises (+0.001 to +0.013)
      while the clarifying rate climbs from ~4 % to ~18 % and the edit rate
      falls ~12 points; ``v2`` (−0.25 a question) makes the hack cost reward
      (−0.02 to −0.03).
    * ``hide-failures``: not a policy but its clients: for
      :data:`HIDE_FAILURE_RATE` of the turns that fail (a dissatisfied
      follow-up, or edits refused that do not persist) the
      ``InferenceServed`` goes out malformed. The edge or the worker refuses
      it, the rest of the turn is excluded as an orphan, and the candidate's
      scored population loses its failures: its mean reward rises while no
      behaviour changed. Only the exclusion balance
      (:mod:`rewardflow.analysis.balance`) shows it.
    """
    if hack not in HACKS:
        raise ValueError(f"unknown hack {hack!r}; expected one of {', '.join(HACKS)}")
    if hack == "hide-failures":
        return profile.model_copy(update={"hide_failure_rate": HIDE_FAILURE_RATE})
    on, fail, other = DODGE_RATES[hack]
    return profile.model_copy(update={"dodge": hack, "dodge_on": on, "dodge_fail_rate": fail,
                                      "dodge_success_rate": other, "dodge_broken_calls": 1})
