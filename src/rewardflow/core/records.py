"""Output record shapes of the pipeline, as plain dicts (TypedDicts).

These are the rows that travel on the output topics (orjson) and land in the
ClickHouse tables of the same column names. Every record carries a
deterministic id (:func:`stable_id`) computed only from its inputs, so a
redelivered input produces a byte-identical id and the sink deduplicates it.

Contract: pure, no I/O. Field names here ARE the ClickHouse column names;
``tests/clickhouse/test_tables.py`` checks the two agree.
"""

from __future__ import annotations

import hashlib
from typing import TypedDict


_BLAKE = hashlib.blake2b(digest_size=16)  # copied per id: cheaper than a constructor with keywords
_FMT = tuple("%s\x1f" * n for n in range(16))  # "%s" formats a part exactly as str() does


def stable_id(*parts: object) -> str:
    """128-bit hex id of the parts; identical inputs give identical ids.

    The digest is blake2b-128 of each ``str(part)``, UTF-8, followed by ``\\x1f``.
    """
    n = len(parts)
    return id_of_joined((_FMT[n] if n < 16 else "%s\x1f" * n) % parts)


def id_of_joined(text: str) -> str:
    """:func:`stable_id` of parts already joined as ``str(part) + "\\x1f"`` each (hot paths build the text
    with one f-string instead of the generic formatting)."""
    h = _BLAKE.copy()
    h.update(text.encode())
    return h.hexdigest()


class RewardRecord(TypedDict):
    """One scored sample (agent turn) under one reward spec version."""

    reward_id: str  # stable_id(spec_version, sample_id, provisional horizon or 'final')
    sample_id: str  # = request_id
    spec_version: str
    spec_hash: str
    org_id: str
    session_id: str
    checkpoint_id: str
    experiment_arm: str
    surface: str
    served_ts: int  # event time of InferenceServed, ms
    finalised_wm: int  # watermark (ms) that finalised it
    finalised_by: str  # 'watermark' | 'idle' | 'replay'
    provisional: int  # 1 for a provisional outcome at an earlier horizon
    horizon_s: int  # last horizon covered (final horizon when not provisional)
    reward: float
    components: dict[str, float]
    # outcome features (spec-independent), used by windows, monitors, replay
    latency_ms: int
    ttft_ms: int
    completion_tokens: int
    n_edits: int
    n_tool_calls: int
    n_tool_broken: int
    n_tool_error: int
    n_clarifying: int
    n_followups: int
    n_dissatisfied: int
    n_accept: int
    n_reject: int
    n_undo: int
    n_revert: int
    persistence: dict[int, float]  # horizon_s -> mean survival score over edits checked
    persisted: dict[int, int]  # horizon_s -> edits persisted (survival >= threshold)
    checked: dict[int, int]  # horizon_s -> edits with a check at that horizon


class WindowAggregate(TypedDict):
    """Partial aggregate of one tumbling window from one source partition.

    The full window is the merge of its partials (``window_key`` groups them);
    every field is a sum or a mergeable histogram, so merging is exact.
    """

    window_id: str  # stable_id(window_key, source_partition)
    window_key: str  # stable_id(size, start, checkpoint, arm, surface, spec_version)
    window_start: int  # ms
    window_end: int  # ms
    window_size_s: int
    checkpoint_id: str
    experiment_arm: str
    surface: str
    spec_version: str
    source_partition: int
    samples: int
    reward_sum: float
    reward_sq_sum: float
    turns_with_edit: int
    turns_dissatisfied: int
    turns_followup: int
    turns_clarifying: int
    turns_broken: int
    tool_calls: int
    tool_broken: int
    tool_error: int
    completion_tokens_sum: int
    persisted: dict[int, int]  # horizon_s -> edits persisted
    checked: dict[int, int]  # horizon_s -> edits checked
    latency_hist: dict[int, int]  # log-bucket index -> count
    latency_p50: float
    latency_p95: float
    latency_p99: float


class DeadLetter(TypedDict):
    """An input that could not be used, with the reason and the original bytes."""

    dead_letter_id: str  # stable_id(source_topic, source_partition, source_offset, index)
    source_topic: str
    source_partition: int
    source_offset: int
    index: int  # position in a session batch; -1 = the whole record
    reason_code: str
    reason: str
    event_type: str
    event_id: str
    session_id: str
    original_b64: str  # base64 of the original record bytes (index -1) or of the event's JSON
    dead_lettered_at: int  # wall ms


class Exclusion(TypedDict):
    """A signal kept out of rewards: a late event, an orphan turn or a duplicate."""

    exclusion_id: str  # stable_id(reason, event_id or request_id)
    reason: str  # 'late' | 'orphan' | 'duplicate'
    request_id: str
    session_id: str
    org_id: str
    event_id: str
    event_type: str
    checkpoint_id: str  # '' when unknown (orphans)
    ts: int  # event time, ms
    watermark: int  # partition watermark when excluded, ms
    source_partition: int
    payload: str  # the event as JSON


class EventRow(TypedDict):
    """A validated client event as stored for replay and analysis."""

    event_id: str
    event_type: str
    schema_version: int
    ts: int  # event time, ms
    org_id: str
    session_id: str
    request_id: str
    producer_name: str
    producer_version: str
    payload: str  # the whole validated event as JSON; replay re-validates it
    source_partition: int
    source_offset: int


class Alert(TypedDict):
    """A Goodhart monitor alert: a guard behaviour drifted while reward held or rose."""

    alert_id: str  # stable_id(monitor, checkpoint, window_key)
    monitor: str  # e.g. 'clarifying_rate', 'tool_broken_rate'
    checkpoint_id: str
    baseline: str  # baseline checkpoint id or 'trailing'
    window_start: int
    window_end: int
    value: float
    baseline_value: float
    z: float
    p_value: float
    reward_delta: float
    message: str
    raised_at: int  # wall ms
