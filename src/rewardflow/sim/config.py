"""What to simulate: sessions, arms (checkpoint assignment), noise and pacing.

An *arm* is a checkpoint assignment: sessions are assigned to an arm (sticky
for the whole session) in proportion to its ``share``, and every turn of the
session is served by that arm's checkpoint, with ``experiment_arm`` = the
arm's name. :func:`ab_config` builds the usual two arms, ``control`` (the
baseline checkpoint) and ``treatment`` (the candidate).

Contract: pure validated data. Unsafe combinations fail at construction with
a message naming the field (e.g. a jitter that would make events late).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rewardflow.sim.noise import NoiseConfig
from rewardflow.sim.profiles import (
    CandidateKind,
    CheckpointProfile,
    Hack,
    LogNormal,
    baseline_profile,
    candidate_of_kind,
    plant_hack,
)

START_MS = 1_790_000_000_000  # 2026-09-21T13:33:20Z; the CLI passes "now"
CONTROL = "control"
TREATMENT = "treatment"
TREATMENT_B = "treatment-b"
STORY_SHARES = (0.4, 0.4, 0.2)  # baseline, candidate, gaming candidate: see docs/demo.md (sizing)


class Arm(BaseModel):
    """One experiment arm: a name, the checkpoint it serves, and its share of sessions."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    profile: CheckpointProfile
    share: float = Field(default=1.0, gt=0)


class SimConfig(BaseModel):
    """A whole simulation. Deterministic: equal configs give equal streams."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    sessions: int = Field(default=100, ge=1, le=10_000_000)
    turns_per_session: int = Field(default=8, ge=1, le=10_000)
    seed: int = 0
    start_ms: int = Field(default=START_MS, ge=946_684_800_000, lt=4_000_000_000_000)
    duration_s: float = Field(default=3_600.0, gt=0, description="session starts are spread uniformly over this")
    arms: tuple[Arm, ...] = Field(min_length=1)
    noise: NoiseConfig = NoiseConfig()
    time_scale: float = Field(default=0.0, ge=0, description="event seconds per wall second when sending; 0 = no pacing")
    batch_window_ms: int = Field(default=1_000, ge=0, description="a session's events due within this go in one send group")
    max_group_events: int = Field(default=400, ge=1, le=100_000)
    orgs: int = Field(default=20, ge=1, le=100_000)
    think_time: LogNormal = LogNormal(median=40_000.0, sigma=0.8)
    grace_ms: int = Field(default=60_000, ge=0, description="the pipeline's grace (REWARDFLOW_GRACE_MS)")
    lateness_ms: int = Field(default=5_000, ge=0, description="the pipeline's allowed lateness")
    correction_ms: int = Field(default=0, ge=0, description="the pipeline's correction window "
                                                            "(REWARDFLOW_CORRECTION_WINDOW_MS; 0: off)")

    @model_validator(mode="after")
    def _coherent(self) -> SimConfig:
        names = [a.name for a in self.arms]
        ckpts = [a.profile.checkpoint_id for a in self.arms]
        if len(set(names)) != len(names) or len(set(ckpts)) != len(ckpts):
            raise ValueError("arms need distinct names and distinct checkpoints")
        if len({a.profile.horizons_s for a in self.arms}) != 1:
            raise ValueError("every arm's profile must use the same persistence horizons")
        jitter = self.noise.max_jitter_ms if self.noise.out_of_order_rate else 0
        if self.batch_window_ms + jitter + 7_000 >= self.grace_ms - self.lateness_ms:
            raise ValueError("batch_window_ms + noise.max_jitter_ms + 7000 must stay below grace_ms - lateness_ms, "
                             "or delayed events would turn late")
        return self

    @property
    def final_horizon_s(self) -> int:
        return self.arms[0].profile.horizons_s[-1]

    @property
    def settle_ms(self) -> int:
        """From a turn's anchor to its final deadline in the pipeline."""
        return self.final_horizon_s * 1000 + self.grace_ms

    @property
    def end_of_starts_ms(self) -> int:
        return self.start_ms + int(self.duration_s * 1000)


def default_start_ms(now_ms: int, *, duration_s: float, turns_per_session: int, time_scale: float = 0.0,
                     align_s: int = 1) -> int:
    """Where a simulation started at wall time ``now_ms`` should begin in event time.

    The pipeline dead-letters events dated after their broker timestamp plus the allowed clock
    skew, so an unpaced simulation (``time_scale`` 0), whose hours of event time are sent in
    seconds, starts early enough for its whole span to lie before ``now_ms``: the session starts,
    ten minutes per turn and the final horizon, plus an hour. A paced one starts that much earlier
    less what the sending takes (at 1x, now). Rounded down to ``align_s`` seconds.
    """
    span_ms = int((duration_s + turns_per_session * 600 + 3_600) * 1000) + 3_600_000
    lead = span_ms if time_scale <= 0 else max(0, int(span_ms * (1 - 1 / time_scale)))
    start = now_ms - lead
    return start - start % (align_s * 1000)


def ab_config(baseline: str | CheckpointProfile = "ckpt-base", candidate: str | CheckpointProfile = "ckpt-cand",
              *, hack: Hack | None = None, candidate_kind: CandidateKind = "published",
              noise: bool | NoiseConfig = False, **fields: object) -> SimConfig:
    """Two arms, 50/50: ``control`` serves ``baseline``, ``treatment`` serves ``candidate``.

    Each is a checkpoint id or a full :class:`CheckpointProfile`. A baseline id
    gets :func:`~rewardflow.sim.profiles.baseline_profile`; a candidate id gets
    the baseline improved by the published figures
    (:func:`~rewardflow.sim.profiles.candidate_profile`), or made clearly
    worse with ``candidate_kind="regress"``
    (:func:`~rewardflow.sim.profiles.regressed_profile`). ``hack`` plants a
    reward hack in the candidate. ``noise=True`` uses
    :meth:`NoiseConfig.realistic`. Other keyword arguments are
    :class:`SimConfig` fields. Raises ``pydantic.ValidationError``.
    """
    base = baseline if isinstance(baseline, CheckpointProfile) else baseline_profile(baseline)
    if isinstance(candidate, CheckpointProfile):
        cand = candidate
    else:
        cand = candidate_of_kind(candidate_kind, candidate, base.model_copy(update={"checkpoint_id": candidate}))
    if hack is not None:
        cand = plant_hack(cand, hack)
    noise_cfg = noise if isinstance(noise, NoiseConfig) else NoiseConfig.realistic() if noise else NoiseConfig()
    arms = (Arm(name=CONTROL, profile=base), Arm(name=TREATMENT, profile=cand))
    return SimConfig.model_validate({**fields, "arms": arms, "noise": noise_cfg})


def story_config(baseline: str = "ckpt-base", candidate: str = "ckpt-cand", gaming: str = "ckpt-cand-b", *,
                 hack: Hack = "over-ask", candidate_kind: CandidateKind = "published",
                 shares: tuple[float, float, float] = STORY_SHARES, noise: bool | NoiseConfig = False,
                 **fields: object) -> SimConfig:
    """Three arms, the published loop: ``control`` serves ``baseline``, ``treatment`` a candidate with
    the published gains (or ``candidate_kind``), and ``treatment-b`` the same gains with ``hack``
    planted: a candidate that games the reward.

    ``shares`` split the sessions between them (baseline, candidate, gaming). Other keyword
    arguments are :class:`SimConfig` fields. Raises ``pydantic.ValidationError``.
    """
    base = baseline_profile(baseline)
    cand = candidate_of_kind(candidate_kind, candidate, base.model_copy(update={"checkpoint_id": candidate}))
    game = plant_hack(candidate_of_kind("published", gaming, base.model_copy(update={"checkpoint_id": gaming})), hack)
    noise_cfg = noise if isinstance(noise, NoiseConfig) else NoiseConfig.realistic() if noise else NoiseConfig()
    arms = (Arm(name=CONTROL, profile=base, share=shares[0]), Arm(name=TREATMENT, profile=cand, share=shares[1]),
            Arm(name=TREATMENT_B, profile=game, share=shares[2]))
    return SimConfig.model_validate({**fields, "arms": arms, "noise": noise_cfg})
