"""Pydantic v2 mirrors of the Avro event schemas in ``schemas/``.

The Avro schema is the contract; these models add the value constraints Avro
cannot express (lengths, ranges). ``tests/events/test_schema_agreement.py``
proves each model agrees with its schema field by field, so the two cannot
drift apart silently.

Contract: models are frozen; :data:`EVENT_ADAPTER` validates a plain dict into
the right model by ``event_type`` or raises ``pydantic.ValidationError`` whose
``loc`` names the field. Validation is pure and does no I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, Strict, TypeAdapter, ValidationInfo, field_validator

# Leaf types are strict, as the Avro types are: a boolean is true/false (not
# "yes" or 1), an int is an int (not "5", 3.0 or True). A float accepts an int.
Id = Annotated[str, Strict(), Field(min_length=1, max_length=128)]
ShortStr = Annotated[str, Strict(), Field(min_length=1, max_length=64)]
NonNeg = Annotated[int, Strict(), Field(ge=0, le=2**31 - 1)]
Score = Annotated[float, Strict(), Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Flag = Annotated[bool, Strict()]
# Event time must be a plausible epoch-ms value: after 2000-01-01, before 2100.
EpochMs = Annotated[int, Strict(), Field(ge=946_684_800_000, lt=4_102_444_800_000)]

Surface = Literal["tab", "composer", "agent", "chat"]
ToolStatus = Literal["ok", "error", "broken"]
UserActionKind = Literal["accept", "reject", "undo", "revert"]


class Producer(BaseModel):
    """The client software that emitted an event."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: ShortStr
    version: ShortStr


class Envelope(BaseModel):
    """Fields every event carries. ``request_id`` is the join key, ``session_id`` the partition key."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    event_id: ShortStr
    schema_version: Annotated[int, Strict()] = Field(1, ge=1, le=1000)
    ts: EpochMs
    org_id: Id
    session_id: Id
    request_id: Id
    producer: Producer


class InferenceServed(Envelope):
    event_type: Literal["InferenceServed"] = "InferenceServed"
    surface: Surface
    checkpoint_id: Id
    experiment_arm: ShortStr
    ttft_ms: NonNeg
    latency_ms: NonNeg
    prompt_tokens: NonNeg
    completion_tokens: NonNeg

    @field_validator("latency_ms")
    @classmethod
    def _latency_covers_ttft(cls, value: int, info: ValidationInfo) -> int:
        """The schema documents ``latency_ms >= ttft_ms``; the first token cannot come after the last."""
        ttft = info.data.get("ttft_ms")
        if ttft is not None and value < ttft:
            raise ValueError(f"latency_ms ({value}) must be >= ttft_ms ({ttft})")
        return value


class AgentEdit(Envelope):
    event_type: Literal["AgentEdit"] = "AgentEdit"
    edit_id: Id
    file_path_hash: Id
    language: ShortStr
    lines_added: NonNeg
    lines_removed: NonNeg
    chars_inserted: NonNeg
    content_fingerprint: Id | None = None


class ToolCall(Envelope):
    event_type: Literal["ToolCall"] = "ToolCall"
    call_id: Id
    tool: Id
    status: ToolStatus
    duration_ms: NonNeg
    error_kind: Id | None = None


class PersistenceCheck(Envelope):
    event_type: Literal["PersistenceCheck"] = "PersistenceCheck"
    edit_id: Id
    horizon_s: Annotated[int, Strict(), Field(gt=0, le=7 * 86_400)]
    survival_score: Score
    revert_score: Score
    unchanged: Flag
    surviving_chars: NonNeg | None = None
    branch_changed: Flag | None = None


class UserAction(Envelope):
    event_type: Literal["UserAction"] = "UserAction"
    action: UserActionKind
    edit_id: Id | None = None


class FollowUp(Envelope):
    event_type: Literal["FollowUp"] = "FollowUp"
    dissatisfied: Flag | None = None
    text_redacted: Annotated[str, Strict(), Field(max_length=16_384)] | None = None


class ClarifyingQuestion(Envelope):
    event_type: Literal["ClarifyingQuestion"] = "ClarifyingQuestion"
    question_chars: NonNeg | None = None


Event = Annotated[
    Union[
        InferenceServed,
        AgentEdit,
        ToolCall,
        PersistenceCheck,
        UserAction,
        FollowUp,
        ClarifyingQuestion,
    ],
    Field(discriminator="event_type"),
]

EVENT_MODELS: dict[str, type[Envelope]] = {
    m.__name__: m
    for m in (
        InferenceServed,
        AgentEdit,
        ToolCall,
        PersistenceCheck,
        UserAction,
        FollowUp,
        ClarifyingQuestion,
    )
}

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
