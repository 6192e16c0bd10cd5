"""Versioned, declarative reward specs: TOML files read into :class:`~rewardflow.core.spec.RewardSpec`.

A spec names its ``version`` and gives one weight per reward component; the model
lives in the core (:mod:`rewardflow.core.spec`), reading files lives here.

Contract: :func:`load_spec` raises :class:`SpecError` naming the file and the
field. A broken tool call must carry a strictly negative weight: dropping or
zero-weighting it is the reward hack Cursor published, so it is refused.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import ValidationError

from rewardflow.core.spec import RewardSpec as RewardSpec
from rewardflow.core.spec import RewardWeights as RewardWeights

__all__ = ["RewardSpec", "RewardWeights", "SpecError", "bundled_specs_dir", "load_spec"]


class SpecError(ValueError):
    """A reward spec file is unreadable, invalid, or conflicts with a registered one."""


def load_spec(path: Path) -> RewardSpec:
    """Read and validate one spec file."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"{path}: {exc}") from None
    try:
        return RewardSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise SpecError(f"{path}: {loc}: {err['msg']}") from None


def bundled_specs_dir() -> Path:
    return Path(__file__).with_name("specs")
