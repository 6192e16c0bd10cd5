"""Ground truth of an uninterrupted run: the raw topic replayed through fresh processors.

Contract: :func:`replay` feeds each partition's records (ticks included) in
offset order, with their broker timestamps, to a new :class:`PartitionProcessor`
over a :class:`DictStore`, with the worker's settings and tick key, and returns
all their outputs. The core is
deterministic in the record sequence, so these are exactly the rows a worker
that never crashed would have emitted (up to wall-clock fields).
"""

from __future__ import annotations

from typing import Any

import orjson

from rewardflow.kafka import topics as T
from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import PartitionProcessor
from rewardflow.rewards.registry import active_specs
from rewardflow.settings import Settings, tick_key
from tests.streams.kafka_io import RawRecord

# The id column of each output topic, and the columns that hold the wall clock (not deterministic).
ID_OF = {T.VALID: "event_id", T.REWARDS: "reward_id", T.WINDOWS: "window_id", T.DEADLETTERS: "dead_letter_id",
         T.LATE: "exclusion_id", T.EXCLUSIONS: "exclusion_id"}
WALL_CLOCK = {T.DEADLETTERS: ("dead_lettered_at",)}
# Late and duplicate rows carry the partition watermark when the record was processed; a record
# re-read after a restart sees the restored, later watermark (test_restart.py: the xfail test).
REREAD_DEPENDENT = {T.LATE: ("watermark",), T.EXCLUSIONS: ("watermark",)}
FIELD_OF = {T.VALID: "valid", T.REWARDS: "rewards", T.WINDOWS: "windows", T.DEADLETTERS: "dead",
            T.LATE: "late", T.EXCLUSIONS: "excluded"}


def replay(settings: Settings, raw: dict[int, list[RawRecord]]) -> Outputs:
    cfg, specs = JoinConfig.from_settings(settings, tick_key=tick_key(settings)), active_specs(settings)
    total = Outputs()
    for partition, records in sorted(raw.items()):
        proc = PartitionProcessor(cfg, specs, DictStore(), settings.topic(T.RAW), partition)
        for r in records:
            total.extend(proc.process(r.value, r.headers, r.offset, 0, r.timestamp))
    return total


def on_wire(rows: list[Any]) -> list[dict[str, Any]]:
    """Rows as a consumer of the output topics sees them (orjson: int map keys become strings)."""
    return orjson.loads(orjson.dumps(rows, option=orjson.OPT_NON_STR_KEYS))  # type: ignore[no-any-return]


def comparable(topic: str, row: dict[str, Any]) -> dict[str, Any]:
    """A row without its wall-clock fields, nor the watermark of a late or duplicate exclusion."""
    drop = WALL_CLOCK.get(topic, ())
    if topic in REREAD_DEPENDENT and row["reason"] in ("late", "duplicate"):
        drop = REREAD_DEPENDENT[topic]
    return {k: v for k, v in row.items() if k not in drop}


def rows_by_id(topic: str, rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Final rows only (provisional rewards are best effort), grouped by id."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if topic == T.REWARDS and row["provisional"]:
            continue
        out.setdefault(row[ID_OF[topic]], []).append(comparable(topic, row))
    return out
