"""Batch replay: recompute final rewards from stored raw events under a spec.

Replay runs the *stream's own* pure core. Stored events (rows of the
``events`` table: ``payload`` is the validated event JSON) are grouped by
``source_partition``; each original Kafka record — the rows sharing
``(source_partition, source_offset)`` — is re-encoded with
:func:`~rewardflow.events.wire.encode_json` and fed, in offset order, to a
fresh :class:`~rewardflow.core.processor.PartitionProcessor` of that
partition. A final tick then advances the watermark past every turn's final
deadline. Watermarks therefore evolve as they did in the stream (never
ahead of it on a subset of the events), so an event the stream accepted is
never late in replay.

Contracts:

* :func:`replay_events` is pure and deterministic: the same rows (in any
  order, duplicated rows included) give the same records in the same order.
  Only final records (``provisional == 0``) are returned, with the stream's reward ids.
* Turns finalised by the closing tick carry ``finalised_by = 'replay'``.
* :func:`replay_token` names a replay run (spec version, content hash and
  range); writing with it as ``insert_deduplication_token`` makes a second
  identical run a no-op.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Any

import orjson

from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.processor import PartitionProcessor
from rewardflow.core.ticks import TICK
from rewardflow.core.records import stable_id
from rewardflow.core.rows import RewardRecord
from rewardflow.events.wire import FORMAT_HEADER, JSON, encode_json
from rewardflow.rewards.spec import RewardSpec

_JSON_HEADERS = [(FORMAT_HEADER, JSON.encode())]
_TICK_HEADERS = [(FORMAT_HEADER, TICK.encode())]
REPLAY_TOPIC = "replay"


@dataclass(frozen=True, slots=True)
class ReplayRange:
    """Which turns a replay covers: served time in ``[start_ms, end_ms)`` and a checkpoint."""

    start_ms: int | None = None
    end_ms: int | None = None
    checkpoint_id: str | None = None

    def describe(self) -> str:
        return f"from={self.start_ms} to={self.end_ms} checkpoint={self.checkpoint_id or '*'}"


def replay_token(spec: RewardSpec, rng: ReplayRange, part: int = 0) -> str:
    """Deterministic insert deduplication token of one replay run (and insert block ``part``)."""
    return stable_id("replay", spec.version, spec.content_hash, rng.start_ms, rng.end_ms, rng.checkpoint_id, part)


def records_by_partition(rows: Iterable[Mapping[str, Any]]) -> dict[int, list[tuple[int, list[dict[str, Any]]]]]:
    """partition → [(offset, events of that record)], offsets ascending, duplicates dropped (a row is an
    event by the table's key: org, session, request and event id).

    Events of one record are ordered by ``(ts, event_id)``: the table does not
    keep the in-record index, and the join is order-independent within a record.
    """
    unique: dict[tuple[int, int, str, str, str, str], Mapping[str, Any]] = {}
    for r in rows:
        key = (int(r["source_partition"]), int(r["source_offset"]), str(r["org_id"]), str(r["session_id"]),
               str(r["request_id"]), str(r["event_id"]))
        unique.setdefault(key, r)
    out: dict[int, list[tuple[int, list[dict[str, Any]]]]] = {}
    for (part, off), grp in groupby(sorted(unique.items(), key=lambda kv: kv[0]), key=lambda kv: kv[0][:2]):
        events = [orjson.loads(r["payload"]) for _, r in grp]
        events.sort(key=lambda e: (e.get("ts", 0), str(e.get("event_id", ""))))
        out.setdefault(part, []).append((off, events))
    return out


def replay_partition(records: list[tuple[int, list[dict[str, Any]]]], spec: RewardSpec, cfg: JoinConfig,
                     partition: int, progress: Callable[[int], None] | None = None,
                     tally: Counter[str] | None = None) -> list[RewardRecord]:
    """Final reward records of one partition's records, via a fresh processor: one per turn, its latest
    revision when a stored signal corrected it.

    The record size and batch limits are lifted (the events were accepted
    once; re-encoding Avro as JSON may grow a record). ``tally`` counts what
    the processor set aside again (``dead``, ``late``, ``excluded``): all zero
    when the stored events replay as they streamed.
    """
    cfg = replace(cfg, max_record_bytes=2**62, max_batch_events=2**62)
    proc = PartitionProcessor(cfg, [spec], DictStore(), REPLAY_TOPIC, partition)
    final: list[RewardRecord] = []

    def feed(value: bytes, headers: list[tuple[str, bytes]], offset: int, by: str | None) -> None:
        out = proc.process(value, headers, offset, 0)
        final.extend(RewardRecord(**{**r, "finalised_by": by or r["finalised_by"]}) for r in out.rewards if not r["provisional"])
        if tally is not None:
            tally.update({k: n for k, n in out.counts().items() if k in ("dead", "late", "excluded") and n})

    for offset, events in records:
        feed(encode_json(events), _JSON_HEADERS, offset, None)
        if progress is not None:
            progress(len(events))
    if records:
        feed(orjson.dumps({"wm": proc.maxts + cfg.settle_ms}), _TICK_HEADERS, records[-1][0] + 1, "replay")
    latest: dict[tuple[str, str, str], RewardRecord] = {}  # a corrected turn counts once, as its latest revision
    for r in final:
        latest[(r["org_id"], r["session_id"], r["sample_id"])] = r
    return list(latest.values())


def replay_events(rows: Iterable[Mapping[str, Any]], spec: RewardSpec, cfg: JoinConfig,
                  progress: Callable[[int], None] | None = None, tally: Counter[str] | None = None) -> list[RewardRecord]:
    """Final reward records of every turn in ``rows`` (``events`` rows: ``org_id``, ``session_id``, ``request_id``,
    ``event_id``, ``source_partition``, ``source_offset``, ``payload``) under ``spec`` (partitions ascending)."""
    out: list[RewardRecord] = []
    for part, records in sorted(records_by_partition(rows).items()):
        out.extend(replay_partition(records, spec, cfg, part, progress, tally))
    return out


def in_range(records: Iterable[RewardRecord], rng: ReplayRange) -> list[RewardRecord]:
    """The records whose turn was served inside ``rng``."""
    return [
        r for r in records
        if (rng.start_ms is None or r["served_ts"] >= rng.start_ms)
        and (rng.end_ms is None or r["served_ts"] < rng.end_ms)
        and (rng.checkpoint_id is None or r["checkpoint_id"] == rng.checkpoint_id)
    ]
