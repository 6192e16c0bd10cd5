"""A versioned reward function as data: one weight per reward component (pure, no I/O).

A spec names its ``version``; its ``content_hash`` is computed from the validated
content, so two files with the same version but different weights are detected
(:mod:`rewardflow.rewards.registry`). A broken tool call must carry a strictly
negative weight: dropping or zero-weighting it is the reward hack Cursor
published, so such a spec does not validate. Files are read by
:mod:`rewardflow.rewards.spec`.
"""

from __future__ import annotations

import hashlib

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator


class RewardWeights(BaseModel):
    """Weight of each component. A component's value is weight × its feature."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    persistence: float = Field(default=1.0, description="× mean survival score at the final horizon (turns with checked edits)")
    accept: float = Field(default=0.5, description="× accept actions")
    reject: float = Field(default=-0.5, description="× reject actions")
    undo: float = Field(default=-0.5, description="× undo actions")
    revert: float = Field(default=-1.0, description="× revert actions")
    dissatisfied: float = Field(default=-1.0, description="× dissatisfied follow-ups")
    latency_per_s: float = Field(default=-0.02, description="× total latency in seconds")
    tool_broken: float = Field(default=-0.5, description="× broken tool calls; must be < 0 (never dropped)")
    tool_error: float = Field(default=-0.1, description="× tool calls that errored")
    clarifying: float = Field(default=0.0, description="× clarifying questions asked")

    @field_validator("tool_broken")
    @classmethod
    def _broken_is_negative(cls, v: float) -> float:
        if v >= 0:
            raise ValueError(
                "must be negative: broken tool calls are negative samples, never dropped "
                "(a zero or positive weight teaches the model to break calls it expects to fail)"
            )
        return v


class RewardSpec(BaseModel):
    """A named, versioned reward function."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")
    description: str = ""
    weights: RewardWeights = RewardWeights()

    @property
    def content_hash(self) -> str:
        """sha256 (first 16 hex) of the canonical validated content."""
        body = orjson.dumps(self.model_dump(), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(body).hexdigest()[:16]
