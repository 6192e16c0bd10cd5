"""Migrations create exactly the defined schema, idempotently."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from rewardflow.clickhouse.catalog import ALL_TABLES, table
from rewardflow.clickhouse.columns import TableDef
from rewardflow.clickhouse.migrate import MIGRATIONS, applied_versions, migrate
from rewardflow.clickhouse.tables import REWARDS
from rewardflow.clickhouse.views import ALL_VIEWS
from tests.conftest_clickhouse import ChDatabase

pytestmark = pytest.mark.clickhouse


def _schema(client: Any) -> list[tuple[Any, ...]]:
    rows = client.query(
        "SELECT name, engine, create_table_query FROM system.tables WHERE database = currentDatabase() ORDER BY name"
    ).result_rows
    return [tuple(r) for r in rows]


def test_migrate_twice_is_the_same(ch_db: ChDatabase) -> None:
    before = _schema(ch_db.client)
    versions = ch_db.client.query("SELECT version, name, checksum FROM schema_migrations ORDER BY version").result_rows
    report = migrate(ch_db.client)
    assert report.applied == [] and report.already == [m.version for m in MIGRATIONS] and report.ttl_changed == []
    assert _schema(ch_db.client) == before
    assert ch_db.client.query("SELECT version, name, checksum FROM schema_migrations ORDER BY version").result_rows == versions


def test_every_table_and_view_exists(ch_db: ChDatabase) -> None:
    names = {r[0] for r in _schema(ch_db.client)}
    assert {t.name for t in ALL_TABLES} | {v.name for v in ALL_VIEWS} == names
    assert applied_versions(ch_db.client) == {m.version for m in MIGRATIONS}


def _shown(client: Any) -> dict[str, tuple[str, dict[str, str]]]:
    """Each table's and view's CREATE with its database's name taken out, and its SETTINGS clause as a
    mapping (the engine lists them in the order they were given, at creation or by later ALTERs)."""
    out = {}
    for name, _, query in _schema(client):
        query = query.replace(f"{client.database}.", "")
        body, _, settings = query.partition(" SETTINGS ")
        out[name] = (body, dict(s.split(" = ", 1) for s in settings.split(", ")) if settings else {})
    return out


@contextlib.contextmanager
def _other_database(ch_db: ChDatabase, suffix: str) -> Iterator[Any]:
    """A second database, empty, in the test's engine; dropped afterwards."""
    from rewardflow.clickhouse.connect import get_client
    from rewardflow.clickhouse.ddl import create_database, drop_database

    ch_db.client.command(create_database(ch_db.name + suffix))
    client = get_client(dsn=ch_db.dsn.with_database(ch_db.name + suffix))
    try:
        yield client
    finally:
        client.close()
        ch_db.client.command(drop_database(ch_db.name + suffix))


class _Cut:
    """A client whose ``command`` runs ``before(n, statement)`` ahead of its n-th statement (from 1)."""

    def __init__(self, client: Any, before: Any) -> None:
        self._client, self._before, self.n = client, before, 0

    def command(self, statement: str, *args: Any, **kwargs: Any) -> Any:
        self.n += 1
        self._before(self.n, statement)
        return self._client.command(statement, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


VERSIONS = "SELECT version, name, checksum FROM schema_migrations ORDER BY version"


@pytest.mark.parametrize("ttl", [90, 30])
def test_a_fresh_database_gets_at_once_the_schema_every_migration_in_turn_builds(ch_db: ChDatabase, ttl: int) -> None:
    with _other_database(ch_db, "_fresh") as fresh, _other_database(ch_db, "_replayed") as replayed:
        at_once = migrate(fresh, events_ttl_days=ttl)
        assert at_once.fresh and at_once.applied == [m.version for m in MIGRATIONS] and at_once.already == []
        in_turn = migrate(replayed, events_ttl_days=ttl, replay=True)
        assert not in_turn.fresh and in_turn.applied == at_once.applied
        assert _shown(fresh) == _shown(replayed) and len(_shown(fresh)) == len(ALL_TABLES) + len(ALL_VIEWS)
        assert f"toIntervalDay({ttl})" in _shown(fresh)["events"][0]
        assert fresh.query(VERSIONS).result_rows == replayed.query(VERSIONS).result_rows
        assert at_once.settings_restored == in_turn.settings_restored == []


def test_a_database_a_migration_stopped_in_is_brought_up_by_every_migration_in_turn(ch_db: ChDatabase) -> None:
    """A table created by migration 1 before a run stopped: not a fresh database, so migration 10 and
    later give that table their settings (creating tables as defined now would leave it as it is)."""
    with _other_database(ch_db, "_stopped") as stopped:
        stopped.command(next(s for s in MIGRATIONS[0].statements(90) if "TABLE IF NOT EXISTS `events`" in s))
        assert "merge_max_block_size" not in _schema(stopped)[0][2]
        report = migrate(stopped)
        assert not report.fresh and report.applied == [m.version for m in MIGRATIONS]
        assert _shown(stopped) == _shown(ch_db.client)


@pytest.mark.parametrize("cut_at", [1, 7, len(ALL_TABLES) + 1])  # the first table, a later one, a view
def test_a_fresh_database_whose_creation_was_cut_short_is_completed_by_the_next_run(
        ch_db: ChDatabase, cut_at: int) -> None:
    created = []

    def fail(n: int, statement: str) -> None:
        if statement.startswith(("CREATE TABLE `", "CREATE OR REPLACE VIEW")):
            created.append(statement)
            if len(created) == cut_at:
                raise ConnectionError("the engine went away")

    with _other_database(ch_db, "_cut") as cut:
        with pytest.raises(ConnectionError):
            migrate(_Cut(cut, fail))
        assert applied_versions(cut) == set()  # nothing recorded before every table and view exists
        report = migrate(cut)
        assert report.fresh == (cut_at == 1) and report.applied == [m.version for m in MIGRATIONS]
        assert _shown(cut) == _shown(ch_db.client)


def test_a_fresh_database_another_run_began_to_migrate_is_migrated_in_turn(ch_db: ChDatabase) -> None:
    """Another run's migration 1 created ``rewards`` (without its projection and merge settings) after
    this run found the database empty: this run replays every migration over it."""
    with _other_database(ch_db, "_race") as race:
        rival = next(s for s in MIGRATIONS[0].statements(90) if "TABLE IF NOT EXISTS `rewards`" in s)

        def interleave(n: int, statement: str) -> None:
            if "CREATE TABLE `events`" in statement:
                race.command(rival)

        report = migrate(_Cut(race, interleave))
        assert not report.fresh and report.applied == [m.version for m in MIGRATIONS]
        assert _shown(race) == _shown(ch_db.client)


def test_settings_an_earlier_migration_left_are_restored_by_the_next_run(
        ch_db: ChDatabase, caplog: pytest.LogCaptureFixture) -> None:
    """Two runs at once: one recorded migration 9 while the other, behind it, ran migration 5 over the
    same table and died. The next run gives ``rewards`` its settings back."""
    from rewardflow.clickhouse.ddl import modify_settings
    from rewardflow.clickhouse.migrate import _BY_SEQ_AT_5

    expected = _shown(ch_db.client)
    ch_db.client.command(modify_settings(REWARDS, _BY_SEQ_AT_5))
    assert _shown(ch_db.client) != expected
    report = migrate(ch_db.client)
    assert report.applied == [] and report.settings_restored == ["rewards"]
    assert "settings of rewards differed from its definition and were restored" in caplog.text
    assert _shown(ch_db.client) == expected
    assert migrate(ch_db.client).settings_restored == []


@pytest.mark.parametrize("table", ALL_TABLES, ids=lambda t: t.name)
def test_created_columns_match_the_definitions(ch_db: ChDatabase, table: TableDef) -> None:
    rows = ch_db.client.query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {t:String} ORDER BY position",
        parameters={"t": table.name},
    ).result_rows
    assert [(r[0], r[1]) for r in rows] == [(c.name, c.type) for c in table.columns]


def test_ttl_follows_the_setting(ch_db: ChDatabase) -> None:
    report = migrate(ch_db.client, events_ttl_days=7)
    assert report.ttl_changed == ["events"]
    query = str(ch_db.client.command("SELECT create_table_query FROM system.tables WHERE database = currentDatabase() AND name = 'events'"))
    assert "toIntervalDay(7)" in query
    assert migrate(ch_db.client, events_ttl_days=7).ttl_changed == []


def test_reward_specs_is_created_by_its_own_migration_and_used_by_the_registry(ch_db: ChDatabase) -> None:
    from rewardflow.rewards.registry import REWARD_SPECS_TABLE, check_and_register, load_dir, read_ledger
    from rewardflow.rewards.spec import bundled_specs_dir

    assert REWARD_SPECS_TABLE is table("reward_specs")  # one definition
    assert not any("reward_specs" in s for s in MIGRATIONS[0].statements(90))  # released migration unchanged
    assert ch_db.client.command("EXISTS TABLE reward_specs") == 1
    specs = load_dir(bundled_specs_dir())
    assert check_and_register(ch_db.client, specs) == sorted(f.spec.version for f in specs)
    assert set(read_ledger(ch_db.client)) == {f.spec.version for f in specs}


def test_a_database_whose_registry_created_reward_specs_catches_up(ch_db: ChDatabase) -> None:
    from rewardflow.rewards.registry import check_and_register, load_dir, read_ledger
    from rewardflow.rewards.spec import bundled_specs_dir

    # as before migration 4: no reward_specs and no record of 4; then the registry creates the table itself
    ch_db.client.command("DROP TABLE reward_specs SYNC")
    ch_db.client.command("DELETE FROM schema_migrations WHERE version = 4")
    assert 4 not in applied_versions(ch_db.client)
    specs = load_dir(bundled_specs_dir())
    check_and_register(ch_db.client, specs)
    report = migrate(ch_db.client)
    assert report.applied == [4]
    assert set(read_ledger(ch_db.client)) == {f.spec.version for f in specs}  # registered rows kept
    assert migrate(ch_db.client).applied == []


def test_migration_5_gives_an_existing_rewards_table_its_seq_projection(ch_db: ChDatabase) -> None:
    from rewardflow.clickhouse.ddl import create_table
    from rewardflow.clickhouse.tables import REWARDS
    from tests.clickhouse.rows import insert, reward

    # rewards as migrations 1-4 left it (no projection), with rows, and no record of 5
    ch_db.client.command("DROP TABLE rewards SYNC")
    ch_db.client.command(create_table(REWARDS, projections=False))
    ch_db.client.command("DELETE FROM schema_migrations WHERE version = 5")
    assert "PROJECTION" not in str(ch_db.client.command("SHOW CREATE TABLE rewards"))
    insert(ch_db.client, [reward(i) for i in range(50)])
    before = ch_db.client.query("SELECT * FROM rewards ORDER BY reward_id").result_rows

    assert migrate(ch_db.client).applied == [5]
    assert "PROJECTION by_seq" in str(ch_db.client.command("SHOW CREATE TABLE rewards"))
    assert migrate(ch_db.client).applied == []  # idempotent
    for statement in MIGRATIONS[4].statements(90):  # and so is each statement (a run interrupted half-way)
        ch_db.client.command(statement)
    assert ch_db.client.query("SELECT * FROM rewards ORDER BY reward_id").result_rows == before
    ch_db.client.command("ALTER TABLE rewards MATERIALIZE PROJECTION by_seq SETTINGS mutations_sync = 1")
    parts = ch_db.client.query(
        "SELECT sum(rows) FROM system.projection_parts WHERE database = currentDatabase() AND table = 'rewards' AND active"
    ).result_rows
    assert parts == [(50,)]


def test_migration_9_makes_merges_keep_the_seq_projection_without_rebuilding_it(ch_db: ChDatabase) -> None:
    from rewardflow.clickhouse.ddl import create_table
    from rewardflow.clickhouse.tables import REWARDS
    from tests.clickhouse.rows import insert, reward

    # rewards as migrations 1-8 left it: by_seq rebuilt by merges, not written at insert; no record of 9
    ch_db.client.command("DROP TABLE rewards SYNC")
    ch_db.client.command(create_table(REWARDS, projections=False))
    for statement in MIGRATIONS[4].statements(90):
        ch_db.client.command(statement)
    ch_db.client.command("DELETE FROM schema_migrations WHERE version = 9")
    ch_db.client.command("SYSTEM STOP MERGES rewards")
    for part in range(2):
        insert(ch_db.client, [reward(i) for i in range(part, 40, 2)])
    projected = "SELECT sum(rows) FROM system.projection_parts WHERE database = currentDatabase() AND table = 'rewards' AND active"
    assert ch_db.client.query(projected).result_rows == [(0,)]  # stored without it
    ch_db.client.command("SYSTEM START MERGES rewards")  # (a mutation waits for merges to be allowed)

    assert migrate(ch_db.client).applied == [9]
    create = ch_db.client.query("SHOW CREATE TABLE rewards").result_rows[0][0]
    assert "deduplicate_merge_projection_mode = 'ignore'" in create and "materialize_projections_on_insert = 1" in create
    assert migrate(ch_db.client).applied == []
    for statement in MIGRATIONS[8].statements(90):  # each statement is idempotent
        ch_db.client.command(statement)
    ch_db.client.command("ALTER TABLE rewards MATERIALIZE PROJECTION by_seq SETTINGS mutations_sync = 1")
    assert ch_db.client.query(projected).result_rows == [(40,)]
    insert(ch_db.client, [reward(i) for i in range(40, 50)])
    ch_db.client.command("OPTIMIZE TABLE rewards FINAL")
    assert ch_db.client.query(projected).result_rows == [(50,)]  # merged, not dropped


def test_released_migration_1_still_creates_rewards_without_the_projection() -> None:
    statements = MIGRATIONS[0].statements(90)
    rewards = next(s for s in statements if "`rewards`" in s)
    assert "PROJECTION" not in rewards and "deduplicate_merge_projection_mode" not in rewards


def test_no_migration_drops_or_deletes() -> None:
    """Retention changes go through rewardflow.clickhouse.retention (counted, confirmed); a migration
    only adds: no statement of any migration may drop, delete, truncate or change a TTL."""
    import re

    destructive = re.compile(r"\b(DROP|DELETE|TRUNCATE|MODIFY\s+TTL|REMOVE\s+TTL|CLEAR\s+COLUMN)\b", re.I)
    for m in MIGRATIONS:
        for statement in m.statements(90):
            assert not destructive.search(statement), (m.version, statement[:200])


def test_released_migration_1_creates_tables_without_their_merge_settings() -> None:
    statements = MIGRATIONS[0].statements(90)
    assert statements and not any("max_compress_block_size" in s or "vertical_merge" in s for s in statements)


@pytest.mark.parametrize("table", ALL_TABLES, ids=lambda t: t.name)
def test_every_setting_of_the_definition_is_in_force(ch_db: ChDatabase, table: TableDef) -> None:
    """Fresh databases get the merge settings from migration 10, not from migration 1's CREATE."""
    from rewardflow.clickhouse.ddl import setting_value

    create = ch_db.client.query(f"SHOW CREATE TABLE `{table.name}`").result_rows[0][0]
    for key, value in table.table_settings().items():
        assert f"{key} = {setting_value(value)}" in create, (key, create[-400:])


def test_migration_10_gives_the_sink_tables_their_merge_settings_idempotently(ch_db: ChDatabase) -> None:
    from rewardflow.clickhouse.columns import MERGE_MEMORY
    from rewardflow.clickhouse.migrate import _MERGE_AT_10

    merged = [t for t in ALL_TABLES if t.merge_settings]
    assert {t.name for t in merged} == {"events", "rewards", "reward_windows", "dead_letters", "late_events",
                                        "exclusions", "alerts"}
    assert all(t.merge_settings == MERGE_MEMORY for t in merged)
    for t in merged:  # as a database migrated before 10 has them
        ch_db.client.command(f"ALTER TABLE `{t.name}` RESET SETTING {', '.join(_MERGE_AT_10)}")
    ch_db.client.command("DELETE FROM schema_migrations WHERE version = 10")
    settings = "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() AND name = 'events'"
    assert "vertical_merge_algorithm_min_rows_to_activate" not in str(ch_db.client.command(settings))

    assert migrate(ch_db.client).applied == [10]
    assert "vertical_merge_algorithm_min_rows_to_activate = 16384" in str(ch_db.client.command(settings))
    for statement in MIGRATIONS[9].statements(90):  # each statement is idempotent
        ch_db.client.command(statement)
    assert migrate(ch_db.client).applied == []


@pytest.mark.parametrize(("version", "setting", "value"), [
    (11, "max_parts_to_merge_at_once", 4),  # a merge reads at most four parts
    (12, "merge_max_block_size", 2048),  # in blocks of 2,048 rows
])
def test_migrations_11_and_12_give_merge_settings_to_existing_tables_idempotently(
        ch_db: ChDatabase, version: int, setting: str, value: int) -> None:
    from rewardflow.clickhouse.columns import MERGE_MEMORY

    assert MERGE_MEMORY[setting] == value
    merged = [t for t in ALL_TABLES if t.merge_settings]
    for t in merged:  # as a database migrated before this version has them
        ch_db.client.command(f"ALTER TABLE `{t.name}` RESET SETTING {setting}")
    ch_db.client.command(f"DELETE FROM schema_migrations WHERE version = {version}")
    query = "SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase()"
    assert not any(setting in q for _, q in ch_db.client.query(query).result_rows)

    assert migrate(ch_db.client).applied == [version]
    shown = dict(ch_db.client.query(query).result_rows)
    for t in merged:
        assert f"{setting} = {value}" in shown[t.name], t.name
        assert "vertical_merge_algorithm_min_rows_to_activate = 16384" in shown[t.name], t.name
    for statement in MIGRATIONS[version - 1].statements(90):  # each statement is idempotent
        ch_db.client.command(statement)
    assert migrate(ch_db.client).applied == []
