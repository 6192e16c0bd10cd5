"""Reward and window rows made the way the stream makes them: simulator → pure core.

Scenarios are built once per test session (a few seconds in all).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from rewardflow.core.outputs import Outputs
from rewardflow.sim import ab_config, run_through_core, simulate
from rewardflow.sim.profiles import CheckpointProfile, baseline_profile, plant_hack
from rewardflow.sim.truth import GroundTruth

BASE, CAND = "ckpt-base", "ckpt-cand"


def planted_profiles() -> tuple[CheckpointProfile, CheckpointProfile]:
    """A candidate with clearly better persistence, fewer dissatisfied turns and lower latency."""
    base = baseline_profile(BASE).model_copy(update={"persistence": {30: 0.8, 120: 0.7, 300: 0.62, 600: 0.58, 900: 0.55}})
    cand = base.model_copy(update={
        "checkpoint_id": CAND, "persistence": {30: 0.95, 120: 0.9, 300: 0.86, 600: 0.83, 900: 0.8},
        "dissatisfied_rate": 0.05, "latency": base.latency.scaled(0.7), "ttft": base.ttft.scaled(0.7),
    })
    return base, cand


@cache
def scenario(name: str) -> tuple[Outputs, GroundTruth]:
    """``clean`` (planted improvement), ``same`` (identical arms), ``broken`` / ``asking`` (hacks)."""
    base, cand = planted_profiles()
    if name == "same":
        cand = base.model_copy(update={"checkpoint_id": CAND})
    elif name == "broken":
        cand = plant_hack(base.model_copy(update={"checkpoint_id": CAND}), "broken-tools")
    elif name == "asking":
        cand = plant_hack(base.model_copy(update={"checkpoint_id": CAND}), "over-ask")
    cfg = ab_config(base, cand, sessions=90, turns_per_session=6,
                    seed=17, batch_window_ms=40_000, duration_s=5_400)
    groups, truth = simulate(cfg)
    return run_through_core(groups, partitions=2), truth


def rewards(name: str) -> list[dict[str, Any]]:
    return [dict(r) for r in scenario(name)[0].rewards]


def synthetic_rows(checkpoint: str, n: int, seed: int, *, latency_median: float = 1_000.0,
                   persist: float = 0.7, dissatisfied: float = 0.1) -> list[dict[str, Any]]:
    """``n`` final v1 reward rows with lognormal latency and one checked edit per turn (fast, no core)."""
    import math
    import random

    rng = random.Random(f"{checkpoint}:{seed}")
    rows = []
    for i in range(n):
        kept = int(rng.random() < persist)
        rows.append({
            "reward_id": f"{checkpoint}-{seed}-{i}", "checkpoint_id": checkpoint, "spec_version": "v1",
            "provisional": 0, "horizon_s": 900, "reward": kept - 0.5 * (rng.random() < dissatisfied),
            "latency_ms": round(latency_median * math.exp(0.5 * rng.gauss(0, 1))), "n_edits": 1,
            "n_dissatisfied": int(rng.random() < dissatisfied), "n_clarifying": 0, "n_tool_broken": 0,
            "persisted": {900: kept}, "checked": {900: 1},
        })
    return rows
