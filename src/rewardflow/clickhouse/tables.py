"""Every ClickHouse table of rewardflow, as data (see :mod:`.columns`).

Time: the records carry epoch **milliseconds** as ints, and the tables store
them as ``Int64`` milliseconds under the same names, so a row read back is
exactly the record that was produced (the trainer gets what the stream
emitted, no conversion on either side). Each such column has a
``DateTime64(3, 'UTC')`` ``ALIAS`` (``served_at``, ``ts_at`` ...) for analysts;
partition keys and TTLs use the same conversion.

Deduplication: every sink-fed table is a ReplacingMergeTree keyed by the
record's deterministic id, so a row delivered twice collapses at merge time,
and readers use ``FINAL`` or ``argMax`` until then. Insert tokens
(:mod:`rewardflow.sink.writer`) drop a replayed batch before it is even stored. Partition
keys are functions of a row's identity (event time, never wall time), so all
copies of a key share a partition - merges only collapse within one.
"""

from __future__ import annotations

from rewardflow.clickhouse.columns import MERGE_MEMORY, Column, Projection, TableDef, ms_alias, replacing, sink_columns, sink_settings

C = Column
S = "String"
LC = "LowCardinality(String)"
U32 = "UInt32"


def _day(ms_col: str) -> str:
    return f"toDate(fromUnixTimestamp64Milli({ms_col}, 'UTC'))"


def _month(ms_col: str) -> str:
    return f"toYYYYMM(fromUnixTimestamp64Milli({ms_col}, 'UTC'))"


EVENTS = TableDef(
    name="events",
    record="EventRow",
    doc="Validated client events (one row per event), kept events_ttl_days after they were stored (not after "
    "their event time, so a backfill is kept as long as fresh data) for replay and analysis.",
    columns=(
        C("event_id", S, "Client-assigned unique event id."),
        C("event_type", LC, "InferenceServed, AgentEdit, ToolCall, PersistenceCheck, UserAction, FollowUp, ClarifyingQuestion."),
        C("schema_version", "UInt16", "Version of the event schema the client used."),
        C("ts", "Int64", "Event time, epoch ms (client clock)."),
        C("org_id", LC, "Organisation."),
        C("session_id", S, "Agent session."),
        C("request_id", S, "Agent turn (= sample id) the event belongs to."),
        C("producer_name", LC, "SDK or service that produced the event."),
        C("producer_version", LC, "Its version."),
        C("payload", S, "The whole validated event as JSON; replay re-validates it."),
        C("source_partition", U32, "Partition of events.raw the event was read from."),
        C("source_offset", "UInt64", "Offset of the record in that partition."),
        ms_alias("ts", "ts_at"),
        *sink_columns(),
    ),
    engine=replacing(),
    order_by="(org_id, session_id, request_id, event_id)",
    partition_by=_day("ts"),
    ttl="toDateTime(_inserted_at) + INTERVAL {events_ttl_days} DAY",
    settings=sink_settings(ttl_only_drop_parts=1),
    merge_settings=MERGE_MEMORY,
    id_column="event_id",
)

BY_SEQ = Projection(
    "by_seq",
    "SELECT * ORDER BY _seq",
    "The rows again, sorted by _seq, written with every insert (the rows of an insert already come in "
    "_seq order) and merged, not rebuilt, when parts merge: the trainer pull (cursor < _seq <= horizon, "
    "in _seq order) reads them in order without sorting. A duplicate a merge removes from the table stays "
    "here; the trainer pull keeps only the rows whose _seq survives FINAL.",
    table_settings={
        "deduplicate_merge_projection_mode": "ignore",
        "lightweight_mutation_projection_mode": "rebuild",
        "materialize_projections_on_insert": 1,
        "materialize_projections_on_merge": 1,
    },
)
"""Projection of ``rewards`` in ``_seq`` order (migrations 5 and 9). The table is sorted by its dedup
key, which has nothing to do with insertion order; without it every trainer pull sorts the wide rows
(maps included) by ``_seq``, most of an export's time on a realistic table (random sample ids).

Merges merge it as they merge the table (``deduplicate_merge_projection_mode = ignore``), a streaming
merge of sorted parts. Rebuilding it instead (``rebuild``) sorts the merged rows in memory, up to
256 MB of them at a time: hundreds of MB of the engine's memory for every large merge. So it holds
every row ever inserted, copies a merge removed included; a read without ``FINAL`` that uses it sees
the table as if it were never merged, and the trainer pull deduplicates against ``FINAL``
(:func:`rewardflow.trainer.query.rewards_sql`). Inserts pay for it (a second, already sorted copy of
the rows); disk pays about 40% of the table's bytes more."""

REWARDS = TableDef(
    name="rewards",
    record="RewardRecord",
    doc="One scored sample (agent turn) per reward spec version; provisional outcomes are separate rows "
    "(distinct reward_id). Keyed by (spec_version, sample_id, reward_id); the first copy is kept.",
    columns=(
        C("reward_id", S, "stable_id(spec_version, org_id, session_id, sample_id, horizon or 'final'[, 'r<revision>']); unique per row."),
        C("sample_id", S, "The scored agent turn (= request_id)."),
        C("spec_version", LC, "Reward spec version that scored it."),
        C("spec_hash", LC, "Hash of that spec's content."),
        C("org_id", LC, "Organisation."),
        C("session_id", S, "Agent session."),
        C("checkpoint_id", LC, "Model checkpoint that served the turn."),
        C("experiment_arm", LC, "A/B arm."),
        C("surface", LC, "Product surface (agent, tab, ...)."),
        C("served_ts", "Int64", "Event time of InferenceServed, epoch ms."),
        C("finalised_wm", "Int64", "Watermark (epoch ms) that finalised the outcome."),
        C("finalised_by", LC, "'watermark' | 'idle' | 'replay' | 'correction' (a signal after finalisation re-scored the turn)."),
        C("provisional", "UInt8", "1 = provisional outcome at an earlier horizon, 0 = final."),
        C("horizon_s", U32, "Last persistence horizon covered, seconds."),
        C("revision", U32, "0 = the outcome as first scored; n = its n-th correction by signals that came after "
          "it was finalised, within the correction window (same sample_id, own reward_id; the highest is "
          "current). Numbers increase; a restart may deliver only the latest of several it re-made."),
        C("reward", "Float64", "The scalar reward."),
        C("components", "Map(String, Float64)", "Named reward components (spec-defined)."),
        C("latency_ms", U32, "End-to-end latency of the turn."),
        C("ttft_ms", U32, "Time to first token."),
        C("completion_tokens", U32, "Tokens generated."),
        C("n_edits", U32, "Agent edits in the turn."),
        C("n_tool_calls", U32, "Tool calls."),
        C("n_tool_broken", U32, "Malformed tool calls (counted as negative, never dropped)."),
        C("n_tool_error", U32, "Tool calls that ran and failed."),
        C("n_clarifying", U32, "Clarifying questions asked."),
        C("n_followups", U32, "Follow-up messages."),
        C("n_dissatisfied", U32, "Dissatisfied follow-ups."),
        C("n_accept", U32, "Accept actions."),
        C("n_reject", U32, "Reject actions."),
        C("n_undo", U32, "Undo actions."),
        C("n_revert", U32, "Reverts."),
        C("persistence", "Map(UInt32, Float64)", "horizon_s -> mean survival score of the edits checked."),
        C("persisted", "Map(UInt32, UInt32)", "horizon_s -> edits persisted (survival >= threshold)."),
        C("checked", "Map(UInt32, UInt32)", "horizon_s -> edits with a check at that horizon."),
        ms_alias("served_ts", "served_at"),
        ms_alias("finalised_wm", "finalised_at"),
        *sink_columns(),
    ),
    engine=replacing(),
    order_by="(spec_version, sample_id, reward_id)",
    partition_by=_month("served_ts"),
    settings=sink_settings(),
    merge_settings=MERGE_MEMORY,
    id_column="reward_id",
    projections=(BY_SEQ,),
)

SIGNED_WINDOW_COLUMNS = ("turns_with_edit", "turns_dissatisfied", "turns_followup", "turns_clarifying", "turns_broken",
                         "tool_calls", "tool_broken", "tool_error", "persisted", "checked")
"""Columns a correction's delta partial may make negative, hence Int64 (migration 8 gives a database made earlier these types)."""

REWARD_WINDOWS = TableDef(
    name="reward_windows",
    record="WindowAggregate",
    doc="Partial aggregates of tumbling windows, one row per (window, source partition); merge the "
    "partials of one window_key (view windows_merged). A re-emitted partial replaces the older one. A corrected "
    "turn adds a delta partial (samples 0; its latest revision minus its first scoring, so counts may be "
    "negative), which its next correction replaces.",
    columns=(
        C("window_id", S, "stable_id(window_key, source_partition); a correction's delta: stable_id(window_key, "
          "source_partition, 'rev', org_id, session_id, sample_id)."),
        C("window_key", S, "stable_id(size, start, checkpoint, arm, surface, spec_version); groups partials."),
        C("window_start", "Int64", "Window start, epoch ms (inclusive)."),
        C("window_end", "Int64", "Window end, epoch ms (exclusive)."),
        C("window_size_s", U32, "Window size, seconds."),
        C("checkpoint_id", LC, "Model checkpoint."),
        C("experiment_arm", LC, "A/B arm."),
        C("surface", LC, "Product surface."),
        C("spec_version", LC, "Reward spec version."),
        C("source_partition", U32, "Partition whose samples this partial covers."),
        C("samples", "UInt64", "Samples in the partial."),
        C("reward_sum", "Float64", "Sum of rewards."),
        C("reward_sq_sum", "Float64", "Sum of squared rewards."),
        C("turns_with_edit", "Int64", "Turns with at least one edit."),
        C("turns_dissatisfied", "Int64", "Turns with a dissatisfied follow-up."),
        C("turns_followup", "Int64", "Turns with a follow-up."),
        C("turns_clarifying", "Int64", "Turns with a clarifying question."),
        C("turns_broken", "Int64", "Turns with a broken tool call."),
        C("tool_calls", "Int64", "Tool calls."),
        C("tool_broken", "Int64", "Broken tool calls."),
        C("tool_error", "Int64", "Failed tool calls."),
        C("completion_tokens_sum", "UInt64", "Tokens generated."),
        C("persisted", "Map(UInt32, Int64)", "horizon_s -> edits persisted."),
        C("checked", "Map(UInt32, Int64)", "horizon_s -> edits checked."),
        C("latency_hist", "Map(UInt32, UInt64)", "Log-bucket index -> turns; mergeable latency histogram."),
        C("latency_p50", "Float64", "Partial's own p50 latency, ms (not mergeable; use latency_hist)."),
        C("latency_p95", "Float64", "Partial's own p95 latency, ms."),
        C("latency_p99", "Float64", "Partial's own p99 latency, ms."),
        ms_alias("window_start", "window_start_at"),
        *sink_columns(keep_first=False),
    ),
    engine=replacing(keep_first=False),
    order_by="(window_key, window_id)",
    partition_by=_month("window_start"),
    settings=sink_settings(),
    merge_settings=MERGE_MEMORY,
    id_column="window_id",
)
