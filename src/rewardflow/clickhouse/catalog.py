"""The registry of tables: which exist, in creation order, and which topic feeds which.

The topic -> table map itself lives in :data:`rewardflow.kafka.topics.TABLE_OF_TOPIC`;
this module resolves its table names to :class:`~.columns.TableDef` objects.
"""

from __future__ import annotations

from rewardflow.clickhouse.columns import TableDef
from rewardflow.clickhouse.tables import EVENTS, REWARD_WINDOWS, REWARDS
from rewardflow.clickhouse.tables_ops import ALERTS, DEAD_LETTERS, EXCLUSIONS, LATE_EVENTS
from rewardflow.clickhouse.tables_state import (
    CHECKPOINTS,
    INGEST_KEYS,
    REWARD_SPECS,
    SCHEMA_MIGRATIONS,
    SINK_BATCHES,
    TRAINER_CURSORS,
)
from rewardflow.kafka.topics import TABLE_OF_TOPIC

ALL_TABLES: tuple[TableDef, ...] = (
    EVENTS,
    REWARDS,
    REWARD_WINDOWS,
    DEAD_LETTERS,
    LATE_EVENTS,
    EXCLUSIONS,
    ALERTS,
    TRAINER_CURSORS,
    SINK_BATCHES,
    REWARD_SPECS,
    SCHEMA_MIGRATIONS,
    INGEST_KEYS,
    CHECKPOINTS,
)
BY_NAME: dict[str, TableDef] = {t.name: t for t in ALL_TABLES}


def table(name: str) -> TableDef:
    """The definition of table ``name``; raises ``KeyError`` naming the known tables."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; known: {', '.join(BY_NAME)}") from None


def table_of_topic(logical_topic: str) -> TableDef:
    """The table fed by a logical output topic (``rewards``, ``events.valid`` ...)."""
    try:
        return BY_NAME[TABLE_OF_TOPIC[logical_topic]]
    except KeyError:
        raise KeyError(f"{logical_topic!r} is not an output topic; known: {', '.join(TABLE_OF_TOPIC)}") from None


SINK_TABLES: tuple[TableDef, ...] = tuple(BY_NAME[name] for name in TABLE_OF_TOPIC.values())
"""Tables fed by the sink, in :data:`TABLE_OF_TOPIC` order."""
