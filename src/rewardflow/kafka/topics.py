"""Logical topic names and what travels on each. Full name = settings.topic_prefix + name.

| logical name    | key          | value                                              | written by   |
|-----------------|--------------|----------------------------------------------------|--------------|
| events.raw      | session_id   | one event or a session batch, avro or json         | SDK clients  |
| events.valid    | session_id   | orjson list of EventRow dicts (one per input record)| stream worker|
| rewards         | session_id   | orjson list of RewardRecord dicts                   | stream worker|
| windows         | window_key   | orjson list of WindowAggregate dicts                | stream worker|
| deadletters     | source key   | orjson list of DeadLetter dicts                     | stream worker|
| late            | session_id   | orjson list of Exclusion dicts (reason 'late')      | stream worker|
| exclusions      | session_id   | orjson list of Exclusion dicts (orphan, duplicate)  | stream worker|
| alerts          | checkpoint   | orjson list of Alert dicts                          | monitors     |

Every output value is a JSON *list* of rows so one Kafka record can carry many
rows; the sink maps topic -> table with :data:`TABLE_OF_TOPIC`.
"""

from __future__ import annotations

RAW_PARTITIONER = "murmur2_random"
"""The librdkafka partitioner of every producer of the raw topic: the Java client's hash of the key, so a session's
records land on one partition whichever client (the SDK, the edge, a Java service) wrote them. A session split over
two partitions is joined by two processors: its signals would miss the turn they belong to."""

RAW = "events.raw"
VALID = "events.valid"
REWARDS = "rewards"
WINDOWS = "windows"
DEADLETTERS = "deadletters"
LATE = "late"
EXCLUSIONS = "exclusions"
ALERTS = "alerts"

TABLE_OF_TOPIC: dict[str, str] = {
    VALID: "events",
    REWARDS: "rewards",
    WINDOWS: "reward_windows",
    DEADLETTERS: "dead_letters",
    LATE: "late_events",
    EXCLUSIONS: "exclusions",
    ALERTS: "alerts",
}

OUTPUT_TOPICS = tuple(TABLE_OF_TOPIC)
