"""What one processed record produces, and the builders of its rows.

Contract: pure. Every id is a function of the inputs only (source topic,
partition, offset, index, event id), so reprocessing a record reproduces them.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from rewardflow.core.records import stable_id
from rewardflow.core.rows import DeadLetter, EventRow, Exclusion, RewardRecord, WindowAggregate
from rewardflow.core.turn import TurnState
from rewardflow.core.session import Tombstone, tombstone_checkpoint
from rewardflow.events.models import Envelope, InferenceServed
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

    def lengths(self) -> list[int]:
        """How many rows each field holds now (for :meth:`truncate`)."""
        return [len(getattr(self, name)) for name in self.__slots__]

    def truncate(self, lengths: list[int]) -> None:
        """Drop every row added since :meth:`lengths` returned ``lengths``."""
        for name, n in zip(self.__slots__, lengths, strict=True):
            del getattr(self, name)[n:]

    def counts(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in self.__slots__}


def dead_letter(topic: str, partition: int, offset: int, index: int, code: str, reason: str,
                raw: dict[str, Any] | None, original: bytes | None, now_ms: int, keep: int) -> DeadLetter:
    """The dead letter of a refused record (``index`` -1) or event, carrying ``original`` (the record's bytes,
    or the event as JSON) whole when it is at most ``keep`` bytes (the processor passes what the raw topic
    takes, :func:`~rewardflow.core.limits.raw_record_limit`, for which the dead-letter topic is sized).
    A longer one (a record over the limit that compression got past the broker, a tick of any size, an
    event whose JSON escapes make it several times its record's size) is cut to its first ``keep`` bytes,
    and the reason gives its length and SHA-256: a dead letter must never be too large to send, or the
    worker could not go past its record."""
    raw = raw or {}
    original = original or b""
    if len(original) > keep:
        note = (f" [original cut to its first {keep:,} of {len(original):,} bytes, sha256 "
                f"{hashlib.sha256(original).hexdigest()}]")
        reason, original = reason[:1000 - len(note)] + note, original[:keep]
    return DeadLetter(
        dead_letter_id=stable_id(topic, partition, offset, index),
        source_topic=topic, source_partition=partition, source_offset=offset, index=index,
        reason_code=code, reason=reason[:1000],
        event_type=shown(raw.get("event_type", ""), 64), event_id=shown(raw.get("event_id", ""), 128),
        session_id=shown(raw.get("session_id", ""), 128),
        original_b64=base64.b64encode(original).decode(), dead_lettered_at=now_ms,
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


def failed_record(topic: str, partition: int, offset: int, exc: Exception, value: bytes | None,
                  now_ms: int, keep: int) -> DeadLetter:
    """The dead letter of a record whose processing raised (``processing_error``, the record's bytes)."""
    return dead_letter(topic, partition, offset, -1, "processing_error",
                       f"processing the record raised {type(exc).__name__}: {exc}", None, value, now_ms, keep)


def event_json(raw: Any, record: bytes | None) -> bytes:
    """A rejected event as JSON for its dead letter; ``record`` (b"" for None) when orjson cannot write
    it (nested deeper than its limit of 255, which a JSON record of up to 1024 levels can be). The
    processor gives a record's bytes to one dead letter only, however many of its events are such."""
    try:
        return orjson.dumps(raw, default=str)
    except TypeError:  # orjson.JSONEncodeError
        return record or b""


def turn_exclusion(turn: TurnState, wm: int, partition: int, failure: str = "") -> dict[str, Any]:
    """The exclusion of a finalised turn without a reward: ``orphan`` (no served event), or
    ``scoring_error`` when outcome or scoring raised (``failure`` names the exception in the payload)."""
    payload: dict[str, Any] = {"edits": len(turn.edits), "counts": turn.counts}
    if failure:
        payload["error"] = failure
    return {  # (a plain dict: the tombstone keeps it as such, and the stream emits it as an Exclusion row)
        "exclusion_id": stable_id("orphan", turn.org_id, turn.session_id, turn.request_id),
        "reason": "scoring_error" if failure else "orphan",
        "request_id": turn.request_id, "session_id": turn.session_id, "org_id": turn.org_id,
        "event_id": "", "event_type": "", "checkpoint_id": "", "ts": turn.first_ts, "watermark": wm,
        "source_partition": partition, "payload": orjson.dumps(payload).decode(),
    }


def checkpoint_of(ev: Envelope, turn: TurnState | None, done: Tombstone | None) -> str:
    """The checkpoint an excluded event is attributed to: its own (InferenceServed), its open turn's or
    its finalised turn's; '' when none is known (the turn's state is gone)."""
    if isinstance(ev, InferenceServed):
        return ev.checkpoint_id
    if turn is not None and turn.served:
        return str(turn.served["checkpoint_id"])
    return tombstone_checkpoint(done) if done is not None else ""
