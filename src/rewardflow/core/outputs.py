"""What one processed record produces, and the builders of its rows.

Contract: pure. Every id is a function of the inputs only (source topic,
partition, offset, index, event id), so reprocessing a record reproduces them.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import orjson

from rewardflow.core.records import DeadLetter, EventRow, Exclusion, RewardRecord, WindowAggregate, stable_id
from rewardflow.events.models import Envelope
from rewardflow.events.validate import shown


@dataclass(slots=True)
class Outputs:
    """Rows for each output topic, in the order they were decided."""

    valid: list[EventRow] = field(default_factory=list)
    rewards: list[RewardRecord] = field(default_factory=list)
    windows: list[WindowAggregate] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    late: list[Exclusion] = field(default_factory=list)
    excluded: list[Exclusion] = field(default_factory=list)  # orphans, duplicates

    def extend(self, other: Outputs) -> None:
        for name in self.__slots__:
            getattr(self, name).extend(getattr(other, name))

    def counts(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in self.__slots__}


def dead_letter(topic: str, partition: int, offset: int, index: int, code: str, reason: str,
                raw: dict[str, Any] | None, original: bytes | None, now_ms: int) -> DeadLetter:
    raw = raw or {}
    return DeadLetter(
        dead_letter_id=stable_id(topic, partition, offset, index),
        source_topic=topic, source_partition=partition, source_offset=offset, index=index,
        reason_code=code, reason=reason[:1000],
        event_type=shown(raw.get("event_type", ""), 64), event_id=shown(raw.get("event_id", ""), 128),
        session_id=shown(raw.get("session_id", ""), 128),
        original_b64=base64.b64encode(original or b"").decode(), dead_lettered_at=now_ms,
    )


def event_row(ev: Envelope, raw: dict[str, Any], partition: int, offset: int) -> EventRow:
    # a literal, not EventRow(...): a TypedDict call builds the same dict through keyword arguments,
    # and this runs once per event
    fields = ev.__dict__  # pydantic's attribute access costs more than the instance dict, per field
    producer = fields["producer"].__dict__
    row: EventRow = {
        "event_id": fields["event_id"], "event_type": raw["event_type"], "schema_version": fields["schema_version"],
        "ts": fields["ts"], "org_id": fields["org_id"], "session_id": fields["session_id"],
        "request_id": fields["request_id"], "producer_name": producer["name"], "producer_version": producer["version"],
        "payload": orjson.dumps(raw).decode(), "source_partition": partition, "source_offset": offset,
    }
    return row


def exclusion(reason: str, ev: Envelope, raw: dict[str, Any], checkpoint: str, wm: int,
              partition: int, offset: int, index: int) -> Exclusion:
    return Exclusion(
        exclusion_id=stable_id(reason, ev.event_id, partition, offset, index), reason=reason,
        request_id=ev.request_id, session_id=ev.session_id, org_id=ev.org_id, event_id=ev.event_id,
        event_type=raw["event_type"], checkpoint_id=checkpoint, ts=ev.ts, watermark=wm,
        source_partition=partition, payload=orjson.dumps(raw).decode(),
    )
