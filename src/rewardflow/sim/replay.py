"""Run a simulated stream through the pure core, exactly as the stream worker would.

Each :class:`~rewardflow.sim.generator.SendGroup` becomes one raw record (a
JSON session batch, or the malformed bytes) on partition
``crc32(session_id) % partitions``, processed in send order by that
partition's :class:`~rewardflow.core.processor.PartitionProcessor`. After the
last group every partition receives a tick record whose watermark finalises
everything still open.

Contract: pure (no Kafka, no ClickHouse); deterministic; returns the merged
:class:`~rewardflow.core.outputs.Outputs` of all partitions.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import orjson

from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import PartitionProcessor
from rewardflow.events.wire import FORMAT_HEADER, encode_json
from rewardflow.rewards.spec import RewardSpec, bundled_specs_dir, load_spec
from rewardflow.sim.generator import SendGroup

FINAL_WATERMARK = 2**61
RAW_TOPIC = "rewardflow.events.raw"


def default_specs() -> list[RewardSpec]:
    """The bundled reward specs (``v1`` …), sorted by version."""
    return sorted((load_spec(p) for p in bundled_specs_dir().glob("*.toml")), key=lambda s: s.version)


def partition_of(session_id: str, partitions: int) -> int:
    return zlib.crc32(session_id.encode()) % partitions


def run_through_core(groups: Iterable[SendGroup], *, cfg: JoinConfig | None = None,
                     specs: list[RewardSpec] | None = None, partitions: int = 1) -> Outputs:
    """Process ``groups`` as raw records, then finalise every partition with a tick."""
    cfg = cfg or JoinConfig()
    specs = specs or default_specs()
    procs = [PartitionProcessor(cfg, specs, DictStore(), RAW_TOPIC, p) for p in range(partitions)]
    offsets = [0] * partitions
    out = Outputs()
    now = 0
    for g in groups:
        p = partition_of(g.session_id, partitions)
        if g.raw is not None:
            value = g.raw
        else:
            value = encode_json([e.model_dump() for e in g.events])
        now = g.due_ms
        out.extend(procs[p].process(value, [(FORMAT_HEADER, b"json")], offsets[p], now))
        offsets[p] += 1
    tick = orjson.dumps({"wm": FINAL_WATERMARK})
    for p, proc in enumerate(procs):
        out.extend(proc.process(tick, [(FORMAT_HEADER, b"tick")], offsets[p], now))
    return out
