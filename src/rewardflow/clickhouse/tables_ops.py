"""Operational tables: dead letters, exclusions (late, orphan, duplicate) and alerts.

``late_events`` and ``exclusions`` share one column definition
(:data:`EXCLUSION_COLUMNS`, the :class:`~rewardflow.core.rows.Exclusion`
shape); only their name and documentation differ.
"""

from __future__ import annotations

from rewardflow.clickhouse.columns import MERGE_MEMORY, Column, TableDef, ms_alias, replacing, sink_columns, sink_settings

C = Column
S = "String"
LC = "LowCardinality(String)"

DEAD_LETTERS = TableDef(
    name="dead_letters",
    record="DeadLetter",
    doc="Inputs that could not be used, with the reason and the original bytes. Written by the stream "
    "worker (invalid events) and by the sink itself (rows a table rejected, reason_code 'sink_rejected').",
    columns=(
        C("dead_letter_id", S, "stable_id(source_topic, source_partition, source_offset, index)."),
        C("source_topic", LC, "Topic the input was read from."),
        C("source_partition", "UInt32", "Its partition."),
        C("source_offset", "UInt64", "Its offset."),
        C("index", "Int32", "Position in a batch record; -1 = the whole record."),
        C("reason_code", LC, "Stable machine-readable reason (bad_json, invalid_event, sink_rejected, ...)."),
        C("reason", S, "Human-readable reason (for sink_rejected: ClickHouse's error)."),
        C("event_type", LC, "Event type when known, else ''."),
        C("event_id", S, "Event id (or row id) when known, else ''."),
        C("session_id", S, "Session when known, else ''."),
        C("original_b64", S, "Base64 of the original record bytes (index -1) or of the event/row JSON. An event "
          "that JSON cannot hold (nested deeper than 255 levels) has its record's bytes instead, in the first such "
          "dead letter of the record only; the others' reason names that one. At most what the raw topic takes "
          "(REWARDFLOW_MAX_RECORD_BYTES plus 64 KiB, at least 1 MiB) of them: a longer original (a record over the limit, an event whose JSON escapes make it larger than its "
          "record, a tick) is cut there, and the reason gives its whole length and SHA-256."),
        C("dead_lettered_at", "Int64", "Wall time, epoch ms."),
        ms_alias("dead_lettered_at", "dead_lettered_at_ts"),
        *sink_columns(),
    ),
    engine=replacing(),
    order_by="(source_topic, dead_letter_id)",  # not partitioned by dead_lettered_at: wall time differs between copies
    settings=sink_settings(),
    merge_settings=MERGE_MEMORY,
    id_column="dead_letter_id",
)

EXCLUSION_COLUMNS: tuple[Column, ...] = (
    C("exclusion_id", S, "stable_id(reason, event_id, source position) for an event; "
      "stable_id('orphan', org_id, session_id, request_id) for a turn."),
    C("reason", LC, "'late' | 'orphan' | 'duplicate'."),
    C("request_id", S, "Agent turn concerned."),
    C("session_id", S, "Agent session."),
    C("org_id", LC, "Organisation."),
    C("event_id", S, "Event concerned ('' for a turn-level exclusion)."),
    C("event_type", LC, "Its type."),
    C("checkpoint_id", LC, "Checkpoint that served the turn: the event's own for an InferenceServed, else its turn's; '' when "
      "no served event is known (orphans, or a late event whose turn's state was already pruned)."),
    C("ts", "Int64", "Event time, epoch ms."),
    C("watermark", "Int64", "Epoch ms. Late event of a finalised turn: the watermark that finalised the turn. "
                            "Otherwise the partition watermark when excluded (a replay after a crash may "
                            "report a later one)."),
    C("source_partition", "UInt32", "Partition of the stream that excluded it."),
    C("payload", S, "The event as JSON."),
    ms_alias("ts", "ts_at"),
    *sink_columns(),
)


def _exclusion_table(name: str, doc: str) -> TableDef:
    return TableDef(
        name=name,
        record="Exclusion",
        doc=doc,
        columns=EXCLUSION_COLUMNS,
        engine=replacing(),
        order_by="(reason, exclusion_id)",
        partition_by="toYYYYMM(fromUnixTimestamp64Milli(ts, 'UTC'))",
        settings=sink_settings(),
        merge_settings=MERGE_MEMORY,
        id_column="exclusion_id",
    )


LATE_EVENTS = _exclusion_table(
    "late_events", "Events that arrived after their turn was finalised (reason 'late'); kept out of rewards."
)
EXCLUSIONS = _exclusion_table(
    "exclusions", "Turns or events kept out of rewards for another reason: 'orphan' (no InferenceServed) or 'duplicate'."
)

ALERTS = TableDef(
    name="alerts",
    record="Alert",
    doc="Goodhart monitor alerts: a guard behaviour drifted while reward held or rose.",
    columns=(
        C("alert_id", S, "stable_id(monitor, checkpoint, window_key)."),
        C("monitor", LC, "Monitor name, e.g. clarifying_rate, tool_broken_rate."),
        C("checkpoint_id", LC, "Checkpoint under watch."),
        C("baseline", LC, "Baseline checkpoint id or 'trailing'."),
        C("window_start", "Int64", "Window start, epoch ms."),
        C("window_end", "Int64", "Window end, epoch ms."),
        C("value", "Float64", "Observed value of the guard metric."),
        C("baseline_value", "Float64", "Baseline value."),
        C("z", "Float64", "z statistic."),
        C("p_value", "Float64", "p value."),
        C("reward_delta", "Float64", "Reward change over the same window."),
        C("message", S, "Human-readable summary."),
        C("raised_at", "Int64", "Wall time, epoch ms."),
        ms_alias("window_start", "window_start_at"),
        ms_alias("raised_at", "raised_at_ts"),
        *sink_columns(),
    ),
    engine=replacing(),
    order_by="(checkpoint_id, monitor, alert_id)",
    settings=sink_settings(),
    merge_settings=MERGE_MEMORY,
    id_column="alert_id",
)
