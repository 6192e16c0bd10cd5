"""The worker's state values must fit in one changelog record.

The stream shell stores each state key as one record of a Faust changelog
topic, and refuses values over ``2 x max_record_bytes`` (the producer's limit)
rather than letting Faust drop the write silently. Pure core, no broker.
"""

from __future__ import annotations

import random

import orjson

from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.processor import PartitionProcessor
from rewardflow.rewards.spec import RewardSpec
from tests.factories import T0, ev
from tests.core.feed import json_record, tick_record

CHANGELOG_LIMIT = 2 * 1_000_000 - 4096  # TableStore's limit at the default max_record_bytes


def test_partition_meta_state_fits_a_changelog_record_with_many_window_keys() -> None:
    cfg = JoinConfig()  # production defaults: windows of 300 s and 3600 s
    specs = [RewardSpec(version="v1"), RewardSpec(version="v2")]
    store, rng, largest_meta = DictStore(), random.Random(1), 0
    proc = PartitionProcessor(cfg, specs, store, "raw", 0)
    offset = 0
    for w in range(18):  # 18 five-minute windows, each with 8 turns of each of 25 checkpoints
        at = T0 + w * 300_000
        for k in range(25):
            for j in range(8):
                served = ev("InferenceServed", f"r{w}-{k}-{j}", f"s{k}", at + 10 * k + j, checkpoint_id=f"ck-{k}",
                            experiment_arm=rng.choice(("control", "treat")), surface=rng.choice(("agent", "tab")),
                            latency_ms=rng.randrange(100, 20_000))
                proc.process(*json_record(served), offset, 0)
                offset += 1
        proc.process(*tick_record(at + cfg.settle_ms + 300_000), offset, 0)  # closes a window
        offset += 1
        largest_meta = max(largest_meta, _size(store.data["m:0"]))
    assert max(_size(v) for v in store.data.values()) < CHANGELOG_LIMIT  # sessions and stored window closes
    # the meta key is written with every batch: it holds the clock and offsets, no window aggregates
    assert largest_meta < 2_000, f"meta state value of {largest_meta:,} bytes"


def _size(value: object) -> int:
    return len(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS))
