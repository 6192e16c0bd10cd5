"""The fault suite's workload and what a correct pipeline must make of it. Pure (no I/O).

:func:`build_workload` simulates a few hundred agent turns (two arms, with
client duplicates, out-of-order deliveries, orphan turns and malformed
records) and interleaves *planted* bad records of every decode/validation
kind, client batch resends and duplicated Kafka records. The expectation is
computed by the pure core (:func:`rewardflow.sim.run_through_core`), which is
what an uninterrupted worker computes:

* ``finals``: (spec_version, sample_id, revision) -> the final reward row, without the
  fields that depend on when it was finalised (``finalised_wm``, ``finalised_by``); the
  planted late signals (within the correction window) make revisions > 0;
* ``orphans``, ``valid_ids``: orphan exclusions and the distinct valid event ids;
* every planted record's expected dead-letter reason code (one dead letter each).

Event-time knobs (:data:`FAULT_SETTINGS`) keep a turn's life short (horizons
30 and 120 s, grace 20 s) and disable the worker's wall-clock ticks: the test
ends the stream with one tick per partition, so the raw topic alone decides
every output and the expectation is exact.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.processor import PartitionProcessor
from rewardflow.events.wire import encode_avro, encode_json
from rewardflow.rewards.registry import active_specs
from rewardflow.kafka import topics as T
from rewardflow.settings import Settings, tick_key
from rewardflow.sim import NoiseConfig, SendGroup, ab_config, run_through_core, simulate
from rewardflow.sim.profiles import CheckpointProfile

FAULT_SETTINGS: dict[str, Any] = {
    "partitions": 2, "horizons_s": [30, 120], "grace_ms": 20_000, "allowed_lateness_ms": 2_000, "max_clock_skew_ms": 10_000,
    "window_sizes_s": [60, 600], "idle_timeout_s": 3_600.0, "idle_clock_rate": 1.0, "provisional": True,
    "dedup_horizon_ms": 3_600_000, "tombstone_ms": 3_600_000, "max_record_bytes": 262_144, "max_batch_events": 500,
}
TIMING = ("finalised_wm", "finalised_by")
JSON_H = [("rf-format", b"json")]
AVRO_H = [("rf-format", b"avro")]


@dataclass(frozen=True)
class Planted:
    """A bad record sent raw (the SDK refuses such data); ``code`` is its dead letter's reason."""

    kind: str
    value: bytes | None
    headers: list[tuple[str, bytes]]
    key: str
    code: str


@dataclass(frozen=True)
class Item:
    """One step of the send schedule: a send group, a planted record, or a duplicate delivery.

    ``op``: ``group`` (through the SDK), ``plant`` (raw), ``resend`` (the group's events again
    through a second SDK client: a client resending a whole batch) or ``twice`` (the group's
    events as one Avro record produced twice: a non-idempotent retry).
    """

    op: str
    group: SendGroup | None = None
    planted: Planted | None = None


@dataclass
class Workload:
    settings: Settings
    items: list[Item]
    finals: dict[tuple[str, str], dict[str, Any]]
    orphans: int
    valid_ids: set[str]
    occurrences: int  # valid event deliveries scheduled, duplicates and resends included
    seed: int
    summary: dict[str, Any] = field(default_factory=dict)
    late: int = 0  # late rows: planted late signals of orphan turns (a served turn's are corrections)
    late_deliveries: int = 0  # their deliveries (a resent late event is late again, not a duplicate)

    @property
    def planted(self) -> list[Planted]:
        return [i.planted for i in self.items if i.planted is not None]

    def chunks(self, n: int) -> list[list[Item]]:
        size = -(-len(self.items) // n)
        return [self.items[k:k + size] for k in range(0, len(self.items), size)]


def dead_letter_code(settings: Settings, value: bytes | None, headers: Any) -> str:
    """The reason code the core gives ``value`` (asserting it yields exactly one dead letter)."""
    cfg = JoinConfig.from_settings(settings, tick_key=tick_key(settings))
    proc = PartitionProcessor(cfg, active_specs(settings), DictStore(), settings.topic(T.RAW), 0)
    out = proc.process(value, headers, 0, 0, record_ts=int(time.time() * 1000))
    assert len(out.dead) == 1 and not out.valid, (value, out.counts())
    return out.dead[0]["reason_code"]


def planted_records(settings: Settings, sample: dict[str, Any]) -> list[Planted]:
    """One bad record per kind the ingest path must dead-letter (and survive)."""
    sid = sample["session_id"]
    avro = encode_avro([sample])
    big = encode_json([{**sample, "event_type": "FollowUp", "text_redacted": "x" * 100}])
    deep = orjson.dumps({**sample, "tool": "DEEP"}).replace(b'"DEEP"', b"[" * 300 + b"]" * 300)
    kinds: list[tuple[str, bytes | None, list[tuple[str, bytes]]]] = [
        ("truncated_avro", avro[:-3], AVRO_H),
        ("unknown_schema_id", b"\x00" + struct.pack(">I", 123_456_789) + avro[5:], AVRO_H),
        ("bad_magic", b"\x07" + avro[1:], AVRO_H),
        ("too_large", big + b" " * settings.max_record_bytes, JSON_H),
        ("batch_too_large", encode_json([sample] * (settings.max_batch_events + 1)), JSON_H),
        ("invalid_utf8", orjson.dumps(sample).replace(b'"tool":"', b'"tool":"\xff\xfe', 1), JSON_H),
        ("json_bomb", b"[" * 5_000 + b"]" * 5_000, JSON_H),
        ("deeply_nested_field", deep, JSON_H),  # crashed the core before (orjson's 255-level limit)
        ("non_utf8_format_header", orjson.dumps(sample), [("rf-format", b"\xff\xfe")]),  # crashed it too
        ("nan", orjson.dumps(sample).replace(b'"duration_ms":', b'"duration_ms":NaN,"x":', 1), JSON_H),
        ("empty", b"", JSON_H),
        ("empty_batch", b'{"events": []}', JSON_H),
        ("mixed_sessions", encode_json([sample, {**sample, "event_id": "other-1", "session_id": sid + "-other"}]), JSON_H),
        ("future_ts", encode_json([{**sample, "event_id": "future-1", "ts": int(time.time() * 1000) + 86_400_000}]), JSON_H),
        ("forged_tick", orjson.dumps({"wm": 4_102_444_799_999}), [("rf-format", b"tick")]),
        ("forged_tick_max", orjson.dumps({"wm": 18_446_744_073_709_551_615, "mac": "00"}), [("rf-format", b"tick")]),
    ]
    return [Planted(k, v, h, sid, dead_letter_code(settings, v, h)) for k, v, h in kinds]


def build_workload(settings: Settings, seed: int, *, sessions: int = 30, turns: int = 10) -> Workload:
    """The send schedule and its exact expectation (see the module docstring)."""
    base = CheckpointProfile(checkpoint_id="ck-base", persistence={30: 0.9, 120: 0.8})
    noise = NoiseConfig(duplicate_rate=0.03, out_of_order_rate=0.05, max_jitter_ms=3_000, malformed_rate=0.04,
                        orphan_rate=0.02, late_rate=0.5, late_extra_ms=(60_000, 90_000))
    sim = ab_config(base, "ck-cand", noise=noise, sessions=sessions,
                    turns_per_session=turns, duration_s=600.0, seed=seed, grace_ms=settings.grace_ms,
                    lateness_ms=settings.allowed_lateness_ms, start_ms=int(time.time() * 1000) - 6 * 3_600_000,
                    correction_ms=settings.correction_window_ms)
    groups, truth = simulate(sim)
    groups = _robust_late(groups)
    cfg, specs = JoinConfig.from_settings(settings), active_specs(settings)
    out = run_through_core(groups, cfg=cfg, specs=specs, partitions=settings.partitions)
    orphaned = {x["request_id"] for x in out.excluded if x["reason"] == "orphan"}
    # the workload must not depend on partitioning: nothing is late but signals of orphan turns
    assert all(x["request_id"] in orphaned for x in out.late), [x["request_id"] for x in out.late]
    finals = {(r["spec_version"], r["sample_id"], r["revision"]): _comparable(r) for r in out.rewards
              if not r["provisional"]}
    assert sum(1 for k in finals if k[2] == 0) == sum(truth.turns_per_checkpoint.values()) * len(specs)

    sample = next(e for g in groups for e in g.events if e.event_type == "ToolCall").model_dump()
    extras = planted_records(settings, sample)
    items: list[Item] = []
    every = max(1, len(groups) // (len(extras) + 1))
    occurrences = 0
    for i, g in enumerate(groups):
        if g.raw is not None:
            items.append(Item("plant", planted=Planted("sim_malformed", g.raw, JSON_H, g.session_id,
                                                       dead_letter_code(settings, g.raw, JSON_H))))
            continue
        twice = i % 97 == 50 and not g.late  # (a late event delivered again is late again, not a duplicate)
        items.append(Item("twice" if twice else "group", group=g))
        occurrences += len(g.events) * (2 if twice else 1)
        if i % 89 == 40 and not g.late:
            items.append(Item("resend", group=g))
            occurrences += len(g.events)
        if i % every == every - 1 and extras:
            items.append(Item("plant", planted=extras.pop()))
    items.extend(Item("plant", planted=p) for p in extras)
    valid_ids = {e.event_id for g in groups for e in g.events} - {x["event_id"] for x in out.late}
    orphans = sum(1 for x in out.excluded if x["reason"] == "orphan")
    assert orphans == truth.orphan_turns
    w = Workload(settings, items, finals, orphans, valid_ids, occurrences, seed,
                 late=len({x["exclusion_id"] for x in out.late}), late_deliveries=len(out.late))
    w.summary = {"seed": seed, "turns": sum(truth.turns_per_checkpoint.values()), "final_rewards": len(finals),
                 "revisions": sum(1 for k in finals if k[2]), "late": len(out.late),
                 "valid_events": len(valid_ids), "deliveries": occurrences, "planted": len(w.planted),
                 "orphans": orphans, "resends": sum(i.op == "resend" for i in items),
                 "twice": sum(i.op == "twice" for i in items)}
    return w


def _robust_late(groups: list[SendGroup]) -> list[SendGroup]:
    """``groups`` without the planted late signals whose turn might still be open when they arrive.

    Where a late signal (at least 60 s after its turn's deadline) lands depends on the watermark of
    its partition when it arrives, so on which sessions share the partition (the SDK's partitioner is
    not the oracle's) and on how the sender interleaved them (it flushes every 10 s of event time). A
    signal is kept only when its own session has a record due at least 15 s before it with an event
    dated at most 50 s before it: that record precedes it on any partitioning and in any order, and
    moves the watermark past the deadline, so the signal corrects the turn whatever the deployment."""
    due: dict[str, list[tuple[int, int]]] = {}
    for g in groups:
        if g.events and not g.late:
            due.setdefault(g.session_id, []).append((g.due_ms, max(e.ts for e in g.events)))
    return [g for g in groups if not g.late or any(
        d <= g.due_ms - 15_000 and ts >= g.due_ms - 50_000 for d, ts in due.get(g.session_id, []))]


def _comparable(row: Any) -> dict[str, Any]:
    """A reward row as read back from ClickHouse (map keys as str), without its timing fields."""
    wire = orjson.loads(orjson.dumps(row, option=orjson.OPT_NON_STR_KEYS))
    return {k: v for k, v in wire.items() if k not in TIMING}

