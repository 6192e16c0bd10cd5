"""Deterministic simulated traffic of coding-agent sessions, with its ground truth.

Pure: no I/O (``rewardflow simulate`` does the sending). Entry points:

* :func:`ab_config` → :class:`SimConfig`: two arms, ``control`` (baseline
  checkpoint) and ``treatment`` (candidate), optional reward hack and noise;
  :func:`story_config`: three, the second candidate gaming the reward;
* :class:`Simulator` (``.stream()`` yields :class:`SendGroup` in send order,
  then ``.truth`` is the :class:`GroundTruth`), or :func:`simulate` (both in
  memory) and :func:`ground_truth` (the truth alone);
* :func:`run_through_core`: the stream through the pure stream core, as the
  worker would process it (tests, offline demos).
"""

from rewardflow.sim.config import CONTROL, TREATMENT, TREATMENT_B, Arm, SimConfig, ab_config, story_config
from rewardflow.sim.generator import SendGroup, Simulator, ground_truth, simulate
from rewardflow.sim.noise import NoiseConfig
from rewardflow.sim.profiles import (
    CheckpointProfile,
    baseline_profile,
    candidate_profile,
    plant_hack,
    regressed_profile,
)
from rewardflow.sim.replay import run_through_core
from rewardflow.sim.truth import CheckpointTruth, GroundTruth

__all__ = [
    "CONTROL", "TREATMENT", "TREATMENT_B", "Arm", "CheckpointProfile", "CheckpointTruth", "GroundTruth", "NoiseConfig",
    "SendGroup", "SimConfig", "Simulator", "ab_config", "baseline_profile", "candidate_profile",
    "ground_truth", "plant_hack", "regressed_profile", "run_through_core", "simulate",
    "story_config",
]
