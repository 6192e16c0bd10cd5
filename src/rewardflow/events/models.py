"""Pydantic models of the events. GENERATED from ``schemas/*.avsc`` by ``rewardflow codegen``: do not edit.

Change a schema (its fields, docs or ``constraints``) and run ``rewardflow codegen``; the schema
catalogue refuses to load while this module's ``SCHEMA_DIGEST`` disagrees with the schema files.

Contract: models are frozen and forbid unknown fields; :data:`EVENT_ADAPTER` validates a plain
dict into the right model by ``event_type`` or raises ``pydantic.ValidationError`` whose ``loc``
names the field. Validation is pure and does no I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, Strict, TypeAdapter, ValidationInfo, field_validator

SCHEMA_DIGEST = "54232e234d6b907e3f659cbee7591554333e72d2268027457a49a906f9e26c4e"

Surface = Literal["tab", "composer", "agent", "chat"]
ToolStatus = Literal["ok", "error", "broken"]
UserActionKind = Literal["accept", "reject", "undo", "revert"]


class Producer(BaseModel):
    """The client software that emitted an event."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: Annotated[str, Strict(), Field(min_length=1, max_length=64)] = Field(
        description="Client name, e.g. 'vscode-ext' or 'agent-runner'. Max 64 chars.",
    )
    version: Annotated[str, Strict(), Field(min_length=1, max_length=64)] = Field(
        description="Client version string. Max 64 chars.",
    )


class Envelope(BaseModel):
    """Fields every event carries; request_id is the join key, session_id the partition key."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    event_id: Annotated[str, Strict(), Field(min_length=1, max_length=64, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="Client-generated UUID of this event; the deduplication key. Max 64 chars.",
    )
    schema_version: Annotated[int, Strict(), Field(ge=1, le=1000)] = Field(
        default=1, description="Version of this event's schema the client wrote.",
    )
    ts: Annotated[int, Strict(), Field(ge=946684800000, lt=4102444800000)] = Field(
        description="Event time: milliseconds since the Unix epoch, UTC, when it happened on the client.",
    )
    org_id: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="Tenant / organisation id. Max 128 chars.",
    )
    session_id: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="Editor or agent session; the Kafka partition key. Max 128 chars.",
    )
    request_id: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="One agent turn; the join key of every signal about that turn within its session. Make it unique (a UUID, as event_id): a reward's sample_id is its request_id. Max 128 chars.",
    )
    producer: Producer = Field(description="The client that emitted this event.")
    client_ts: Annotated[int, Strict(), Field(ge=946684800000, lt=4102444800000)] | None = Field(
        default=None, description="The event time by the client's own clock, kept when an ingestion edge (rewardflow collect) corrected ts for that clock's offset (ts = received_at - (sent_at - client_ts)); null when ts is the client's.",
    )


class InferenceServed(Envelope):
    """A model response was served for one turn: which checkpoint and arm, on which surface, how fast and how large."""

    event_type: Literal["InferenceServed"] = "InferenceServed"
    surface: Surface = Field(description="Product surface: tab, composer, agent or chat.")
    checkpoint_id: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="Model checkpoint that produced the response. Max 128 chars.",
    )
    experiment_arm: Annotated[str, Strict(), Field(min_length=1, max_length=64, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="A/B experiment arm the session was assigned to. Max 64 chars.",
    )
    ttft_ms: Annotated[int, Strict(), Field(ge=0, le=2147483647)] = Field(
        description="Time to first token, milliseconds (>= 0).",
    )
    latency_ms: Annotated[int, Strict(), Field(ge=0, le=2147483647)] = Field(
        description="Total response latency, milliseconds (>= ttft_ms).",
    )
    prompt_tokens: Annotated[int, Strict(), Field(ge=0, le=2147483647)] = Field(description="Prompt tokens (>= 0).")
    completion_tokens: Annotated[int, Strict(), Field(ge=0, le=2147483647)] = Field(
        description="Completion tokens (>= 0).",
    )

    @field_validator("latency_ms")
    @classmethod
    def _latency_ms_covers_ttft_ms(cls, value: int, info: ValidationInfo) -> int:
        """``latency_ms >= ttft_ms``."""
        other = info.data.get("ttft_ms")
        if other is not None and value < other:
            raise ValueError(f"latency_ms ({value}) must be >= ttft_ms ({other})")
        return value


class AgentEdit(Envelope):
    """The agent applied an edit to a file during the turn."""

    event_type: Literal["AgentEdit"] = "AgentEdit"
    edit_id: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="Id of this edit, unique within the turn; PersistenceCheck and UserAction refer to it. Max 128 chars.",
    )
    file_path_hash: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="Hash of the edited file's path (never the path itself). Max 128 chars.",
    )
    language: Annotated[str, Strict(), Field(min_length=1, max_length=64)] = Field(
        description="Language of the file, e.g. 'python'. Max 64 chars.",
    )
    lines_added: Annotated[int, Strict(), Field(ge=0, le=2147483647)] = Field(description="Lines added (>= 0).")
    lines_removed: Annotated[int, Strict(), Field(ge=0, le=2147483647)] = Field(description="Lines removed (>= 0).")
    chars_inserted: Annotated[int, Strict(), Field(ge=0, le=2147483647)] = Field(
        description="Characters inserted (>= 0).",
    )
    content_fingerprint: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] | None = Field(
        default=None, description="Optional fingerprint (hash) of the inserted text, for persistence matching. Max 128 chars.",
    )


class ToolCall(Envelope):
    """The agent called a tool during the turn. Broken calls are negative samples, never dropped."""

    event_type: Literal["ToolCall"] = "ToolCall"
    call_id: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="Id of this call within the turn. Max 128 chars.",
    )
    tool: Annotated[str, Strict(), Field(min_length=1, max_length=128)] = Field(
        description="Tool name, e.g. 'run_terminal'. Max 128 chars.",
    )
    status: ToolStatus = Field(description="Outcome: ok, error or broken (malformed call).")
    duration_ms: Annotated[int, Strict(), Field(ge=0, le=2147483647)] = Field(
        description="Wall time of the call, milliseconds (>= 0).",
    )
    error_kind: Annotated[str, Strict(), Field(min_length=1, max_length=128)] | None = Field(
        default=None, description="Error class when status is error or broken. Max 128 chars.",
    )


class PersistenceCheck(Envelope):
    """How much of an agent edit survives in the codebase at a time horizon after the edit."""

    event_type: Literal["PersistenceCheck"] = "PersistenceCheck"
    edit_id: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] = Field(
        description="The AgentEdit this check measures. Max 128 chars.",
    )
    horizon_s: Annotated[int, Strict(), Field(gt=0, le=604800)] = Field(
        description="Seconds after the edit when measured; clients report 30, 120, 300, 600 and 900.",
    )
    survival_score: Annotated[float, Strict(), Field(ge=0.0, le=1.0, allow_inf_nan=False)] = Field(
        description="0..1: character 4-gram similarity of the inserted text still present.",
    )
    revert_score: Annotated[float, Strict(), Field(ge=0.0, le=1.0, allow_inf_nan=False)] = Field(
        description="0..1: how far user edits moved back toward the text before the edit.",
    )
    unchanged: Annotated[bool, Strict()] = Field(
        description="True when the inserted text is unchanged or mostly unchanged.",
    )
    surviving_chars: Annotated[int, Strict(), Field(ge=0, le=2147483647)] | None = Field(
        default=None, description="Inserted characters still present (>= 0), if known.",
    )
    branch_changed: Annotated[bool, Strict()] | None = Field(
        default=None, description="Whether the git branch changed since the edit, if known.",
    )


class UserAction(Envelope):
    """The user accepted, rejected, undid or reverted the turn's work or one edit of it."""

    event_type: Literal["UserAction"] = "UserAction"
    action: UserActionKind = Field(description="accept, reject, undo or revert.")
    edit_id: Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern="^[ !#-\\[\\]-~]*$")] | None = Field(
        default=None, description="The edit acted on; null means the whole turn. Max 128 chars.",
    )


class FollowUp(Envelope):
    """The user sent a follow-up message after the turn."""

    event_type: Literal["FollowUp"] = "FollowUp"
    dissatisfied: Annotated[bool, Strict()] | None = Field(
        default=None, description="True/false when the client knows whether the follow-up expresses dissatisfaction; null if unknown.",
    )
    text_redacted: Annotated[str, Strict(), Field(max_length=16384)] | None = Field(
        default=None, description="Redacted follow-up text for server-side classification. Max 16384 chars.",
    )


class ClarifyingQuestion(Envelope):
    """The agent asked the user a clarifying question instead of acting."""

    event_type: Literal["ClarifyingQuestion"] = "ClarifyingQuestion"
    question_chars: Annotated[int, Strict(), Field(ge=0, le=2147483647)] | None = Field(
        default=None, description="Length of the question in characters (>= 0), if known.",
    )


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

EVENT_MODELS: dict[str, type[Envelope]] = {m.__name__: m for m in (
        InferenceServed,
        AgentEdit,
        ToolCall,
        PersistenceCheck,
        UserAction,
        FollowUp,
        ClarifyingQuestion,
)}

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
