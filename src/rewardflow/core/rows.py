"""Output record shapes of the pipeline, one TypedDict per table record. GENERATED from the table
definitions in ``rewardflow.clickhouse`` by ``rewardflow codegen``: do not edit.

These are the rows that travel on the output topics (orjson) and land in the ClickHouse tables,
field for column. Change a table's columns and run ``rewardflow codegen``; migrations refuse to
run while ``TABLES_DIGEST`` disagrees with the definitions.
"""

from __future__ import annotations

from typing import TypedDict

TABLES_DIGEST = "b620868ed6f5253b7ef96bde8ba18bfc18bfd2f364bf882b7c7e52d60f847145"


class EventRow(TypedDict):
    """A row of ``events``: Validated client events (one row per event), kept events_ttl_days after
    they were stored (not after their event time, so a backfill is kept as long as fresh data) for
    replay and analysis.
    """

    # Client-assigned unique event id.
    event_id: str
    # InferenceServed, AgentEdit, ToolCall, PersistenceCheck, UserAction, FollowUp, ClarifyingQuestion.
    event_type: str
    # Version of the event schema the client used.
    schema_version: int
    # Event time, epoch ms (client clock).
    ts: int
    # Organisation.
    org_id: str
    # Agent session.
    session_id: str
    # Agent turn (= sample id) the event belongs to.
    request_id: str
    # SDK or service that produced the event.
    producer_name: str
    # Its version.
    producer_version: str
    # The whole validated event as JSON; replay re-validates it.
    payload: str
    # Partition of events.raw the event was read from.
    source_partition: int
    # Offset of the record in that partition.
    source_offset: int


class RewardRecord(TypedDict):
    """A row of ``rewards``: One scored sample (agent turn) per reward spec version; provisional
    outcomes are separate rows (distinct reward_id). Keyed by (spec_version, sample_id, reward_id);
    the first copy is kept.
    """

    # stable_id(spec_version, org_id, session_id, sample_id, horizon or 'final'[, 'r<revision>']); unique per row.
    reward_id: str
    # The scored agent turn (= request_id).
    sample_id: str
    # Reward spec version that scored it.
    spec_version: str
    # Hash of that spec's content.
    spec_hash: str
    # Organisation.
    org_id: str
    # Agent session.
    session_id: str
    # Model checkpoint that served the turn.
    checkpoint_id: str
    # A/B arm.
    experiment_arm: str
    # Product surface (agent, tab, ...).
    surface: str
    # Event time of InferenceServed, epoch ms.
    served_ts: int
    # Watermark (epoch ms) that finalised the outcome.
    finalised_wm: int
    # 'watermark' | 'idle' | 'replay' | 'correction' (a signal after finalisation re-scored the turn).
    finalised_by: str
    # 1 = provisional outcome at an earlier horizon, 0 = final.
    provisional: int
    # Last persistence horizon covered, seconds.
    horizon_s: int
    # 0 = the outcome as first scored; n = its n-th correction by signals that came after it was finalised, within the correction window (same sample_id, own reward_id; the highest is current). Numbers increase; a restart may deliver only the latest of several it re-made.
    revision: int
    # The scalar reward.
    reward: float
    # Named reward components (spec-defined).
    components: dict[str, float]
    # End-to-end latency of the turn.
    latency_ms: int
    # Time to first token.
    ttft_ms: int
    # Tokens generated.
    completion_tokens: int
    # Agent edits in the turn.
    n_edits: int
    # Tool calls.
    n_tool_calls: int
    # Malformed tool calls (counted as negative, never dropped).
    n_tool_broken: int
    # Tool calls that ran and failed.
    n_tool_error: int
    # Clarifying questions asked.
    n_clarifying: int
    # Follow-up messages.
    n_followups: int
    # Dissatisfied follow-ups.
    n_dissatisfied: int
    # Accept actions.
    n_accept: int
    # Reject actions.
    n_reject: int
    # Undo actions.
    n_undo: int
    # Reverts.
    n_revert: int
    # horizon_s -> mean survival score of the edits checked.
    persistence: dict[int, float]
    # horizon_s -> edits persisted (survival >= threshold).
    persisted: dict[int, int]
    # horizon_s -> edits with a check at that horizon.
    checked: dict[int, int]


class WindowAggregate(TypedDict):
    """A row of ``reward_windows``: Partial aggregates of tumbling windows, one row per (window, source
    partition); merge the partials of one window_key (view windows_merged). A re-emitted partial
    replaces the older one. A corrected turn adds a delta partial (samples 0; its latest revision
    minus its first scoring, so counts may be negative), which its next correction replaces.
    """

    # stable_id(window_key, source_partition); a correction's delta: stable_id(window_key, source_partition, 'rev', org_id, session_id, sample_id).
    window_id: str
    # stable_id(size, start, checkpoint, arm, surface, spec_version); groups partials.
    window_key: str
    # Window start, epoch ms (inclusive).
    window_start: int
    # Window end, epoch ms (exclusive).
    window_end: int
    # Window size, seconds.
    window_size_s: int
    # Model checkpoint.
    checkpoint_id: str
    # A/B arm.
    experiment_arm: str
    # Product surface.
    surface: str
    # Reward spec version.
    spec_version: str
    # Partition whose samples this partial covers.
    source_partition: int
    # Samples in the partial.
    samples: int
    # Sum of rewards.
    reward_sum: float
    # Sum of squared rewards.
    reward_sq_sum: float
    # Turns with at least one edit.
    turns_with_edit: int
    # Turns with a dissatisfied follow-up.
    turns_dissatisfied: int
    # Turns with a follow-up.
    turns_followup: int
    # Turns with a clarifying question.
    turns_clarifying: int
    # Turns with a broken tool call.
    turns_broken: int
    # Tool calls.
    tool_calls: int
    # Broken tool calls.
    tool_broken: int
    # Failed tool calls.
    tool_error: int
    # Tokens generated.
    completion_tokens_sum: int
    # horizon_s -> edits persisted.
    persisted: dict[int, int]
    # horizon_s -> edits checked.
    checked: dict[int, int]
    # Log-bucket index -> turns; mergeable latency histogram.
    latency_hist: dict[int, int]
    # Partial's own p50 latency, ms (not mergeable; use latency_hist).
    latency_p50: float
    # Partial's own p95 latency, ms.
    latency_p95: float
    # Partial's own p99 latency, ms.
    latency_p99: float


class DeadLetter(TypedDict):
    """A row of ``dead_letters``: Inputs that could not be used, with the reason and the original
    bytes. Written by the stream worker (invalid events) and by the sink itself (rows a table
    rejected, reason_code 'sink_rejected').
    """

    # stable_id(source_topic, source_partition, source_offset, index).
    dead_letter_id: str
    # Topic the input was read from.
    source_topic: str
    # Its partition.
    source_partition: int
    # Its offset.
    source_offset: int
    # Position in a batch record; -1 = the whole record.
    index: int
    # Stable machine-readable reason (bad_json, invalid_event, sink_rejected, ...).
    reason_code: str
    # Human-readable reason (for sink_rejected: ClickHouse's error).
    reason: str
    # Event type when known, else ''.
    event_type: str
    # Event id (or row id) when known, else ''.
    event_id: str
    # Session when known, else ''.
    session_id: str
    # Base64 of the original record bytes (index -1) or of the event/row JSON. An event that JSON cannot hold (nested deeper than 255 levels) has its record's bytes instead, in the first such dead letter of the record only; the others' reason names that one. At most what the raw topic takes (REWARDFLOW_MAX_RECORD_BYTES plus 64 KiB, at least 1 MiB) of them: a longer original (a record over the limit, an event whose JSON escapes make it larger than its record, a tick) is cut there, and the reason gives its whole length and SHA-256.
    original_b64: str
    # Wall time, epoch ms.
    dead_lettered_at: int


class Exclusion(TypedDict):
    """A row of ``late_events``: Events that arrived after their turn was finalised (reason 'late');
    kept out of rewards.
    """

    # stable_id(reason, event_id, source position) for an event; stable_id('orphan', org_id, session_id, request_id) for a turn.
    exclusion_id: str
    # 'late' | 'orphan' | 'duplicate'.
    reason: str
    # Agent turn concerned.
    request_id: str
    # Agent session.
    session_id: str
    # Organisation.
    org_id: str
    # Event concerned ('' for a turn-level exclusion).
    event_id: str
    # Its type.
    event_type: str
    # Checkpoint that served the turn: the event's own for an InferenceServed, else its turn's; '' when no served event is known (orphans, or a late event whose turn's state was already pruned).
    checkpoint_id: str
    # Event time, epoch ms.
    ts: int
    # Epoch ms. Late event of a finalised turn: the watermark that finalised the turn. Otherwise the partition watermark when excluded (a replay after a crash may report a later one).
    watermark: int
    # Partition of the stream that excluded it.
    source_partition: int
    # The event as JSON.
    payload: str


class Alert(TypedDict):
    """A row of ``alerts``: Goodhart monitor alerts: a guard behaviour drifted while reward held or
    rose.
    """

    # stable_id(monitor, checkpoint, window_key).
    alert_id: str
    # Monitor name, e.g. clarifying_rate, tool_broken_rate.
    monitor: str
    # Checkpoint under watch.
    checkpoint_id: str
    # Baseline checkpoint id or 'trailing'.
    baseline: str
    # Window start, epoch ms.
    window_start: int
    # Window end, epoch ms.
    window_end: int
    # Observed value of the guard metric.
    value: float
    # Baseline value.
    baseline_value: float
    # z statistic.
    z: float
    # p value.
    p_value: float
    # Reward change over the same window.
    reward_delta: float
    # Human-readable summary.
    message: str
    # Wall time, epoch ms.
    raised_at: int
