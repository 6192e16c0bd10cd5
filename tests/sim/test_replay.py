"""The simulator's ground truth reconciles exactly with the pure core's outputs."""

from __future__ import annotations

import random
from collections import Counter

import orjson
import pytest

from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import PartitionProcessor
from rewardflow.events.wire import FORMAT_HEADER
from rewardflow.sim import NoiseConfig, ab_config, run_through_core, simulate
from rewardflow.sim.noise import MALFORMED_KINDS, malformed_record
from rewardflow.sim.profiles import Hack
from rewardflow.sim.replay import default_specs
from rewardflow.sim.truth import GroundTruth

NOISY = NoiseConfig(duplicate_rate=0.03, out_of_order_rate=0.1, late_rate=0.05, malformed_rate=0.03, orphan_rate=0.04)


def _reconcile(out: Outputs, truth: GroundTruth, specs: int) -> None:
    excluded = Counter(e["reason"] for e in out.excluded)
    assert len(out.valid) == truth.valid_events
    assert len(out.late) == truth.late
    assert excluded["duplicate"] == truth.duplicates
    assert excluded["orphan"] == truth.orphan_turns
    assert len(out.dead) == truth.malformed
    final = [r for r in out.rewards if not r["provisional"]]
    assert len({r["reward_id"] for r in final}) == len(final)
    by_ck = Counter(r["checkpoint_id"] for r in final)
    assert by_ck == {ck: specs * n for ck, n in truth.turns_per_checkpoint.items()}
    h = truth.final_horizon_s
    for ck, t in truth.checkpoints.items():
        rows = [r for r in final if r["checkpoint_id"] == ck and r["spec_version"] == "v1"]
        assert sum(r["checked"].get(h, 0) for r in rows) == t.edits_checked
        assert sum(r["persisted"].get(h, 0) for r in rows) == t.edits_persisted
        assert sum(r["n_dissatisfied"] > 0 for r in rows) == t.turns_dissatisfied
        assert sum(r["n_clarifying"] > 0 for r in rows) == t.turns_clarifying
        assert sum(r["n_tool_broken"] > 0 for r in rows) == t.turns_broken
        assert sorted(r["latency_ms"] for r in rows) == sorted(t.latencies_ms)


@pytest.mark.parametrize("partitions", [1, 3])
def test_noisy_stream_reconciles_with_the_core(partitions: int) -> None:
    cfg = ab_config(sessions=30, turns_per_session=4, seed=21, noise=NOISY, batch_window_ms=10_000)
    groups, truth = simulate(cfg)
    assert truth.late and truth.duplicates and truth.malformed and truth.orphan_turns
    out = run_through_core(groups, partitions=partitions)
    _reconcile(out, truth, specs=len(default_specs()))


@pytest.mark.parametrize("hack", ["broken-tools", "over-ask"])
def test_hacked_stream_reconciles_with_the_core(hack: Hack) -> None:
    cfg = ab_config(sessions=30, turns_per_session=6, seed=22, noise=NOISY, batch_window_ms=10_000, hack=hack)
    groups, truth = simulate(cfg)
    assert truth.checkpoints["ckpt-cand"].hard_turns > 0
    _reconcile(run_through_core(groups, partitions=2), truth, specs=len(default_specs()))


def test_every_malformed_kind_dead_letters_once() -> None:
    rng = random.Random(0)
    proc = PartitionProcessor(JoinConfig(), default_specs(), DictStore(), "raw", 0)
    for offset, kind in enumerate(MALFORMED_KINDS):
        out = proc.process(malformed_record(rng, kind, "sess-x", 1_790_000_000_000), [(FORMAT_HEADER, b"json")],
                           offset, 0)
        assert len(out.dead) == 1, kind
        assert not out.valid
    tick = proc.process(orjson.dumps({"wm": 2**61}), [(FORMAT_HEADER, b"tick")], 99, 0)
    assert not tick.rewards


def test_noise_leaves_the_rewards_of_served_turns_unchanged() -> None:
    clean_cfg = ab_config(sessions=20, turns_per_session=4, seed=31, batch_window_ms=10_000)
    noisy_cfg = clean_cfg.model_copy(update={"noise": NOISY})
    clean = run_through_core(simulate(clean_cfg)[0])
    noisy_groups, truth = simulate(noisy_cfg)
    noisy = run_through_core(noisy_groups)

    def final(out: Outputs) -> dict[str, tuple[object, ...]]:
        return {r["reward_id"]: (r["reward"], r["latency_ms"], r["n_edits"], r["persisted"], r["n_dissatisfied"])
                for r in out.rewards if not r["provisional"]}

    a, b = final(clean), final(noisy)
    assert truth.orphan_turns > 0 and truth.late > 0
    assert set(b) < set(a)  # orphans lose their rewards; nothing else changes
    assert {k: a[k] for k in b} == b
    assert len(a) - len(b) == truth.orphan_turns * len(default_specs())
