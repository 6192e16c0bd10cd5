"""Bookkeeping tables: trainer cursors, the sink's batch ledger, the reward spec ledger, schema migrations,
the keys of the ingestion edge and the checkpoint registry.

These are written by rewardflow itself, not fed from a topic.
"""

from __future__ import annotations

from rewardflow.clickhouse.columns import INSERTED_AT, KEEP_FIRST, SEQ, Column, TableDef, ms_alias, sink_settings

C = Column

TRAINER_CURSORS = TableDef(
    name="trainer_cursors",
    doc="Per trainer, how far it has read the rewards table. The latest commit of a trainer (largest _seq) "
    "wins; reading is 'rewards FINAL WHERE _seq > cursor AND _seq <= the settled horizon'.",
    columns=(
        C("trainer", "String", "Trainer name (one reader per name at a time)."),
        C("cursor", "UInt64", "Every rewards row with _seq <= cursor has been handed to this trainer."),
        C("rows", "UInt64", "Rows handed over by this commit."),
        C("filters", "String", "The reader's filters at commit time (JSON), for audit."),
        C("committed_at", "DateTime64(6, 'UTC')", "Wall time of the commit.", "sink", "now64(6, 'UTC')"),
        SEQ,
        INSERTED_AT,
    ),
    engine="ReplacingMergeTree(_seq)",
    order_by="(trainer)",
    settings=sink_settings(),
)

SINK_BATCHES = TableDef(
    name="sink_batches",
    doc="The sink's batch ledger: the offset range of every insert, recorded before the insert. A replay "
    "re-cuts the same ranges, so its inserts carry the same deduplication tokens and are dropped.",
    columns=(
        C("topic", "LowCardinality(String)", "Source topic (full name)."),
        C("topic_id", "String", "Kafka's id of this incarnation of the topic ('' if the broker gave none)."),
        C("partition", "UInt32", "Source partition."),
        C("first_offset", "UInt64", "First offset of the batch."),
        C("last_offset", "UInt64", "Last offset of the batch (inclusive)."),
        C("table", "LowCardinality(String)", "Destination table."),
        C("rows", "UInt64", "Rows in the batch (as counted by the sink)."),
        C("token", "String", "insert_deduplication_token of the insert."),
        SEQ,
        INSERTED_AT,
        KEEP_FIRST,
    ),
    engine="ReplacingMergeTree(_keep)",
    order_by="(topic, partition, first_offset, topic_id)",
    ttl="toDateTime(_inserted_at) + INTERVAL 30 DAY",
    settings=sink_settings(),
)

REWARD_SPECS = TableDef(
    name="reward_specs",
    doc="Ledger of reward spec versions: a version's content hash never changes. One row per "
    "(version, content_hash); two hashes under one version is a conflict the registry refuses "
    "(rewardflow.rewards.registry writes it).",
    columns=(
        C("version", "LowCardinality(String)", "Spec version (RewardSpec.version)."),
        C("content_hash", "String", "RewardSpec.content_hash: sha256 prefix of the canonical content."),
        C("description", "String", "The spec's description."),
        C("weights", "String", "The spec's weights as JSON (for audit)."),
        C("registered_at", "Int64", "Wall time of the first registration, epoch ms."),
        ms_alias("registered_at", "registered_at_ts"),
        SEQ,
        INSERTED_AT,
        KEEP_FIRST,
    ),
    engine="ReplacingMergeTree(_keep)",
    order_by="(version, content_hash)",
    settings=sink_settings(),
    id_column="version",
)

SCHEMA_MIGRATIONS = TableDef(
    name="schema_migrations",
    doc="Applied schema migrations (see rewardflow.clickhouse.migrate).",
    columns=(
        C("version", "UInt32", "Migration number."),
        C("name", "String", "Migration name."),
        C("checksum", "String", "Hash of the statements applied."),
        C("applied_at", "DateTime64(6, 'UTC')", "When it was applied.", "sink", "now64(6, 'UTC')"),
    ),
    engine="ReplacingMergeTree(applied_at)",
    order_by="(version)",
)

INGEST_KEYS = TableDef(
    name="ingest_keys",
    doc="Keys of the ingestion edge (rewardflow collect), one row per change: the latest row of a key_id "
    "(largest _seq) holds its state. Only a hash of each secret is stored (rewardflow keys create prints it once).",
    columns=(
        C("key_id", "String", "Public id of the key (the part of the secret after rfk_ and before the next _)."),
        C("org_id", "LowCardinality(String)", "The org every event sent with the key belongs to."),
        C("name", "String", "A label for people (which editor fleet or agent uses it)."),
        C("secret_sha256", "String", "sha256 of the whole secret, hex."),
        C("revoked", "UInt8", "1 once revoked: the edge refuses the key within its refresh interval."),
        C("changed_at", "DateTime64(6, 'UTC')", "When this row was written.", "sink", "now64(6, 'UTC')"),
        SEQ,
        INSERTED_AT,
    ),
    engine="ReplacingMergeTree(_seq)",
    order_by="(key_id)",
    settings=sink_settings(),
)

CHECKPOINTS = TableDef(
    name="checkpoints",
    doc="The checkpoint registry (rewardflow checkpoints register): which checkpoint each one was trained from and "
    "when it went live. One row per checkpoint; a lineage never changes, so of several rows of one checkpoint_id "
    "the first inserted (smallest _seq) is the registration (rewardflow.lineage.store writes it).",
    columns=(
        C("checkpoint_id", "String", "The checkpoint, as named by InferenceServed.checkpoint_id."),
        C("parent_id", "String", "The registered checkpoint it was trained from; '' for a root."),
        C("generation", "UInt32", "0 for a root, else the parent's generation + 1."),
        C("deployed_at_ms", "Int64", "When the checkpoint started serving, epoch ms."),
        C("note", "String", "Free text for people (run name, data mix, ...)."),
        C("registered_at", "DateTime64(6, 'UTC')", "Server time of the registration.", "sink", "now64(6, 'UTC')"),
        ms_alias("deployed_at_ms", "deployed_at"),
        SEQ,
        INSERTED_AT,
        KEEP_FIRST,
    ),
    engine="ReplacingMergeTree(_keep)",
    order_by="(checkpoint_id)",
    settings=sink_settings(),
)
