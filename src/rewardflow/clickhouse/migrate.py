"""Idempotent, versioned schema migrations, recorded in ``schema_migrations``.

Contract of :func:`migrate`: after it returns, the database has every table of
:mod:`.catalog` and every view of :mod:`.views`, and ``events`` has the TTL
the settings ask for, counted from each row's insertion. A retention change that would delete
stored rows raises :class:`~.retention.RetentionRefused` (nothing altered) unless
``allow_data_loss``; then the report says how many rows it deleted. No migration drops a table or
a column. Running it again changes nothing. Each migration's
statements are themselves idempotent (``IF NOT EXISTS`` / ``OR REPLACE``), so a
migration interrupted half-way is completed by the next run; its row in
``schema_migrations`` is written only after all its statements succeeded.
Concurrent runs issue idempotent statements; a run that finds a table another made in a fresh
database replays every migration over what it finds, and every run ends by giving each table the
settings of its definition, so whatever two runs left, the next one completes.
New migrations are appended to :data:`MIGRATIONS` with the next version; a
released migration is never edited.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from clickhouse_connect.driver.client import Client

from rewardflow.clickhouse.catalog import ALL_TABLES, table
from rewardflow.clickhouse import retention
from rewardflow.clickhouse.ddl import (
    add_projection, create_database, create_table, materialize_projection, modify_columns, modify_settings,
    setting_value,
)
from rewardflow.clickhouse.dsn import Dsn
from rewardflow.clickhouse.errors import error_code
from rewardflow.clickhouse.rowtypes import check as check_row_types
from rewardflow.clickhouse.tables import BY_SEQ, REWARD_WINDOWS, REWARDS, SIGNED_WINDOW_COLUMNS
from rewardflow.clickhouse.tables_state import CHECKPOINTS, INGEST_KEYS, REWARD_SPECS, SCHEMA_MIGRATIONS
from rewardflow.clickhouse.views import ALL_VIEWS, REWARDS_DAILY, REWARDS_LATEST, REWARDS_LINEAGE

# Migrations 1 and 2 created every table and view of the catalogue as it stood then; tables and
# views added to the catalogue later get their own migration, so 1 and 2 render the same statements forever.
_LATER = frozenset({REWARD_SPECS.name, SCHEMA_MIGRATIONS.name, INGEST_KEYS.name, CHECKPOINTS.name})
_LATER_VIEWS = frozenset({REWARDS_LINEAGE.name})
_TABLE_ALREADY_EXISTS = 57
log = logging.getLogger("rewardflow.clickhouse")


# The table settings of by_seq as migrations 5 and 9 set them (released statements never change).
_BY_SEQ_AT_5: dict[str, str | int] = {
    "deduplicate_merge_projection_mode": "rebuild", "lightweight_mutation_projection_mode": "rebuild",
    "materialize_projections_on_insert": 0, "materialize_projections_on_merge": 1,
}
_BY_SEQ_AT_9: dict[str, str | int] = {"deduplicate_merge_projection_mode": "ignore", "materialize_projections_on_insert": 1}
# The sink-fed tables' merge settings as migration 10 sets them.
_MERGE_AT_10: dict[str, str | int] = {
    "max_compress_block_size": 131_072,
    "vertical_merge_algorithm_min_rows_to_activate": 16_384,
    "vertical_merge_algorithm_min_columns_to_activate": 1,
}
# ...and the one migration 11 adds.
_MERGE_AT_11: dict[str, str | int] = {"max_parts_to_merge_at_once": 4}
# ...and the one migration 12 adds.
_MERGE_AT_12: dict[str, str | int] = {"merge_max_block_size": 2_048}
_MERGE_TABLES_AT_10 = ("events", "rewards", "reward_windows", "dead_letters", "late_events", "exclusions", "alerts")


@dataclass(frozen=True)
class Migration:
    """One schema step; ``statements`` renders its SQL for the configured events TTL (days)."""

    version: int
    name: str
    statements: Callable[[int], list[str]]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "reward tables",
        lambda ttl: [create_table(t, events_ttl_days=ttl, projections=False, merge_settings=False)
                     for t in ALL_TABLES if t.name not in _LATER],
    ),
    Migration(2, "analyst views", lambda ttl: [v.ddl() for v in ALL_VIEWS if v.name not in _LATER_VIEWS]),
    Migration(
        3,
        "topic ids in the sink ledger",
        lambda ttl: ["ALTER TABLE sink_batches ADD COLUMN IF NOT EXISTS `topic_id` String AFTER `topic`"],
    ),
    # the registry used to create this table itself (IF NOT EXISTS, same definition): a no-op there
    Migration(4, "reward spec ledger", lambda ttl: [create_table(REWARD_SPECS)]),
    # the trainer pull reads rewards in _seq order; existing rows get the projection by a background mutation
    Migration(5, "rewards in _seq order for the trainer pull", lambda ttl: add_projection(REWARDS, BY_SEQ.name, _BY_SEQ_AT_5)),
    Migration(6, "keys of the ingestion edge", lambda ttl: [create_table(INGEST_KEYS)]),
    Migration(7, "checkpoint registry and rewards_lineage", lambda ttl: [create_table(CHECKPOINTS), REWARDS_LINEAGE.ddl()]),
    Migration(8, "corrections: reward revisions, signed window deltas, latest-revision views", lambda ttl: [
        "ALTER TABLE rewards ADD COLUMN IF NOT EXISTS `revision` UInt32 AFTER `horizon_s`",
        *modify_columns(REWARD_WINDOWS, SIGNED_WINDOW_COLUMNS),
        REWARDS_LATEST.ddl(), REWARDS_DAILY.ddl(), REWARDS_LINEAGE.ddl(),
    ]),
    # by_seq written at insert and merged, not rebuilt, by merges; parts stored without it get it in the background
    Migration(9, "rewards merges without re-sorting by_seq", lambda ttl: [
        modify_settings(REWARDS, _BY_SEQ_AT_9), materialize_projection(REWARDS, BY_SEQ.name),
    ]),
    # small write buffers and one column at a time in merges (MERGE_MEMORY); parts already stored are left as they are
    Migration(10, "merges that hold less memory", lambda ttl: [
        modify_settings(table(name), _MERGE_AT_10) for name in _MERGE_TABLES_AT_10
    ]),
    # merges of at most 4 parts (MERGE_MEMORY): what a merge holds stops growing with the parts' size
    Migration(11, "merges of at most four parts", lambda ttl: [
        modify_settings(table(name), _MERGE_AT_11) for name in _MERGE_TABLES_AT_10
    ]),
    # merges read and write blocks of 2,048 rows (MERGE_MEMORY)
    Migration(12, "merges in smaller blocks", lambda ttl: [
        modify_settings(table(name), _MERGE_AT_12) for name in _MERGE_TABLES_AT_10
    ]),
)


@dataclass
class MigrationReport:
    """What :func:`migrate` did: versions applied now, versions found applied, TTLs changed."""

    database: str
    applied: list[int] = field(default_factory=list)
    already: list[int] = field(default_factory=list)
    ttl_changed: list[str] = field(default_factory=list)
    deleted: dict[str, int] = field(default_factory=dict)  # rows a TTL change deleted, per table
    fresh: bool = False  # the database held nothing: its tables and views were created as defined now
    settings_restored: list[str] = field(default_factory=list)  # tables given back their defined settings


def checksum(statements: list[str]) -> str:
    """A short hash of a migration's rendered statements."""
    return hashlib.sha256("\n;\n".join(statements).encode()).hexdigest()[:16]


def applied_versions(client: Client) -> set[int]:
    """Versions recorded in ``schema_migrations`` (empty if the table does not exist yet)."""
    if str(client.command("EXISTS TABLE schema_migrations")) != "1":
        return set()
    return {int(r[0]) for r in client.query("SELECT DISTINCT version FROM schema_migrations").result_rows}


def _reconcile_ttl(client: Client, events_ttl_days: int, allow_data_loss: bool) -> dict[str, int]:
    """Bring each retention-bound table to the configured TTL: every change is planned (rows it
    would delete counted) before any is applied, so a refusal alters nothing."""
    plans = [p for t in ALL_TABLES if "{events_ttl_days}" in t.ttl if (p := retention.plan(client, t, events_ttl_days))]
    refused = [p for p in plans if p.doomed and not allow_data_loss]
    if refused:
        retention.apply(client, refused[0], allow_data_loss=False)  # raises RetentionRefused
    return {p.table.name: retention.apply(client, p, allow_data_loss=allow_data_loss) for p in plans}


def migrate(client: Client, *, events_ttl_days: int = 90, allow_data_loss: bool = False,
            replay: bool = False) -> MigrationReport:
    """Bring the client's current database up to date; see the module contract. Blocks.

    A database that holds nothing yet (no migration recorded, no table or view but
    ``schema_migrations``) gets the catalogue's tables and views as they are defined now, and every
    migration recorded as applied (``report.fresh``): the schema the migrations build, in a few
    statements instead of every step of its history. ``replay`` applies every migration in turn even
    then. Last, a table whose settings differ from its definition gets them back
    (``report.settings_restored``).

    Raises :class:`~rewardflow.clickhouse.rowtypes.RowTypesStale` before touching the database when
    the generated record types no longer match the table definitions."""
    check_row_types(ALL_TABLES)
    report = MigrationReport(database=str(client.command("SELECT currentDatabase()")))
    client.command(create_table(SCHEMA_MIGRATIONS))
    done = applied_versions(client)
    if not done and not replay and _holds_nothing(client) and _create_current(client, events_ttl_days):
        report.applied, report.fresh = [m.version for m in MIGRATIONS], True
    else:
        for migration in MIGRATIONS:
            if migration.version in done:
                report.already.append(migration.version)
                continue
            statements = migration.statements(events_ttl_days)
            for statement in statements:
                client.command(statement)
            client.insert(
                "schema_migrations",
                [[migration.version, migration.name, checksum(statements)]],
                column_names=["version", "name", "checksum"],
            )
            report.applied.append(migration.version)
    report.settings_restored = _reconcile_settings(client)
    report.deleted = _reconcile_ttl(client, events_ttl_days, allow_data_loss)
    report.ttl_changed = list(report.deleted)
    return report


def _holds_nothing(client: Client) -> bool:
    """Whether the current database has no table or view but ``schema_migrations``."""
    return str(client.command(
        "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name != 'schema_migrations'"
    )) == "0"


def _create_current(client: Client, events_ttl_days: int) -> bool:
    """Every table and view as defined now, then every migration recorded as applied (with the checksum
    of its statements, as a run of each would record it). False, with nothing recorded, when a table
    exists already: another run is migrating the database, and this one replays every migration over
    what it finds instead. The migrations are recorded last, so a run cut short here leaves tables and
    no record, and the next run replays every migration over them."""
    for t in ALL_TABLES:
        if t.name == SCHEMA_MIGRATIONS.name:
            continue
        try:
            client.command(create_table(t, events_ttl_days=events_ttl_days, exists_ok=False))
        except Exception as exc:  # noqa: BLE001 - the driver's error carries the engine's code
            if error_code(exc) == _TABLE_ALREADY_EXISTS:
                return False
            raise
    for v in ALL_VIEWS:
        client.command(v.ddl())
    client.insert(
        "schema_migrations",
        [[m.version, m.name, checksum(m.statements(events_ttl_days))] for m in MIGRATIONS],
        column_names=["version", "name", "checksum"],
    )
    return True


def _reconcile_settings(client: Client) -> list[str]:
    """Give each table whose settings differ from its definition's (``TableDef.table_settings``) those
    settings, with a warning; the names of the tables changed. Every migration run in full leaves none to
    change, but two runs at once can interleave so that one that died midway left an earlier migration's
    value of a setting after the other recorded the later migration that changes it, and a setting changed
    by hand differs too."""
    shown = {str(name): str(query) for name, query in client.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase()").result_rows}
    changed = []
    for t in ALL_TABLES:
        wanted = t.table_settings()
        query = shown.get(t.name, "")
        if wanted and any(f"{k} = {setting_value(v)}" not in query for k, v in wanted.items()):
            client.command(modify_settings(t, wanted))
            changed.append(t.name)
            log.warning("settings of %s differed from its definition and were restored", t.name)
    return changed


def ensure_database(dsn: Dsn) -> None:
    """Create the DSN's database if it names one that does not exist. Blocks."""
    from rewardflow.clickhouse.connect import get_client

    if dsn.database is None:
        return
    admin = get_client(dsn=dsn.with_database("default"))
    try:
        admin.command(create_database(dsn.database))
    finally:
        admin.close()
