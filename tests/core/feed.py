"""Test driver of a PartitionProcessor: numbered records in, collected outputs out (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from rewardflow.core.config import DictStore, JoinConfig, StateStore
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import PartitionProcessor
from rewardflow.events.wire import encode_avro, encode_json
from rewardflow.rewards.spec import RewardSpec, RewardWeights

# settle = 120 s + 1 s; windows of one minute. Seen ids and tombstones keep their default hour of
# event time, longer than any replay after a restart in these tests (a replay reaching further back
# than the dedup horizon cannot recognise redelivered events: bounding that is the horizon's job).
CFG = JoinConfig(horizons_s=(30, 120), grace_ms=1000, lateness_ms=500, window_sizes_s=(60,))
SPECS = [RewardSpec(version="v1"), RewardSpec(version="v2", weights=RewardWeights(persistence=2.0, tool_broken=-3.0))]
JSON_H = [("rf-format", b"json")]
AVRO_H = [("rf-format", b"avro")]
TICK_H = [("rf-format", b"tick")]
TOPIC = "raw"

Record = tuple[bytes | None, Any]


def json_record(*events: dict[str, Any]) -> Record:
    return encode_json(list(events)), JSON_H


def avro_record(*events: dict[str, Any]) -> Record:
    return encode_avro(list(events), batch_id="b" if len(events) > 1 else None), AVRO_H


def tick_record(wm: int) -> Record:
    return orjson.dumps({"wm": wm}), TICK_H


def session_runs(events: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``events`` cut into runs of consecutive events of the same session, in order."""
    runs: list[list[dict[str, Any]]] = []
    for e in events:
        if runs and runs[-1][0].get("session_id") == e.get("session_id"):
            runs[-1].append(e)
        else:
            runs.append([e])
    return runs


def now_of(offset: int) -> int:
    """Deterministic wall clock, so reprocessing a record reproduces its dead letters."""
    return 1_000_000 + offset


class Feed:
    """One partition's processor fed records at consecutive offsets."""

    def __init__(self, cfg: JoinConfig = CFG, specs: Sequence[RewardSpec] = SPECS,
                 store: StateStore | None = None, partition: int = 0, offset: int = 0) -> None:
        self.store: Any = store if store is not None else DictStore()
        self.proc = PartitionProcessor(cfg, list(specs), self.store, TOPIC, partition)
        self.offset = offset
        self.total = Outputs()

    def record(self, value: bytes | None, headers: Any, offset: int | None = None) -> Outputs:
        off = self.offset if offset is None else offset
        out = self.proc.process(value, headers, off, now_of(off))
        if offset is None:
            self.offset += 1
        self.total.extend(out)
        return out

    def send(self, *events: dict[str, Any]) -> Outputs:
        """Send ``events`` in order, one record per run of consecutive events of one session (a record
        carries one session's events)."""
        out = Outputs()
        for run in session_runs(events):
            out.extend(self.record(*json_record(*run)))
        return out

    def tick(self, wm: int) -> Outputs:
        return self.record(*tick_record(wm))

    def final(self, spec: str = "v1") -> list[Any]:
        return [r for r in self.total.rewards if not r["provisional"] and r["spec_version"] == spec]
