"""Migrations create exactly the defined schema, idempotently."""

from __future__ import annotations

from typing import Any

import pytest

from rewardflow.clickhouse.catalog import ALL_TABLES
from rewardflow.clickhouse.columns import TableDef
from rewardflow.clickhouse.migrate import MIGRATIONS, applied_versions, migrate
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
