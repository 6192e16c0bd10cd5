"""The checkpoints table: migration 7, registration and its refusals, races, the owner endpoint, the view."""

from __future__ import annotations

from typing import Any

import pytest

from rewardflow.clickhouse.migrate import MIGRATIONS, applied_versions, migrate
from rewardflow.clickhouse.remote import RemoteReader, read_local_token
from rewardflow.clickhouse.views import REWARDS_LINEAGE
from rewardflow.cli.checkpoints import EndpointCheckpoints
from rewardflow.lineage.columns import LINEAGE_COLUMNS
from rewardflow.lineage.registry import LineageError, Registry
from rewardflow.lineage.store import CheckpointStore, load_registry
from rewardflow.readapi.server import ReadServer
from rewardflow.readapi.tokens import TokenStore
from tests.clickhouse.rows import T0, insert, reward
from tests.conftest_clickhouse import ChDatabase

pytestmark = pytest.mark.clickhouse


def test_released_migrations_1_and_2_do_not_create_the_registry_or_its_view() -> None:
    earlier = [s for m in MIGRATIONS[:6] for s in m.statements(90)]
    assert not any("`checkpoints`" in s or "rewards_lineage" in s for s in earlier)
    assert MIGRATIONS[6].version == 7 and any("`checkpoints`" in s for s in MIGRATIONS[6].statements(90))


def test_migration_7_adds_the_registry_and_the_view_to_a_database_of_migrations_1_to_6(ch_db: ChDatabase) -> None:
    ch_db.client.command("DROP VIEW rewards_lineage SYNC")
    ch_db.client.command("DROP TABLE checkpoints SYNC")
    ch_db.client.command("DELETE FROM schema_migrations WHERE version = 7")
    assert 7 not in applied_versions(ch_db.client)
    assert migrate(ch_db.client).applied == [7]
    assert ch_db.client.command("EXISTS TABLE checkpoints") == 1 and ch_db.client.command("EXISTS TABLE rewards_lineage") == 1
    assert migrate(ch_db.client).applied == []


def test_register_list_and_refusals(ch_db: ChDatabase) -> None:
    store = CheckpointStore(ch_db.client)
    root, new = store.register("g0", deployed_at_ms=T0, note="base")
    assert new and root.generation == 0 and root.registered_at  # the server's time, read back
    child, new = store.register("g1", "g0", T0 + 3_600_000)
    assert new and child.generation == 1
    again, new = store.register("g1", "g0")  # same lineage, no time given: nothing written
    assert not new and again == child
    with pytest.raises(LineageError, match="unknown parent checkpoint 'nope'"):
        store.register("g2", "nope", T0)
    with pytest.raises(LineageError, match="does not change"):
        store.register("g1", "g0", T0)
    with pytest.raises(LineageError, match="registered with parent 'g0'"):
        store.register("g1", "")
    assert ch_db.client.command("SELECT count() FROM checkpoints") == 2  # refusals and no-ops wrote nothing
    registry = store.registry()
    assert [(c.checkpoint_id, c.parent_id, c.generation) for c in registry.ordered()] == [("g0", "", 0), ("g1", "g0", 1)]
    assert registry.get("g0").note == "base"  # type: ignore[union-attr]


class _Raced(CheckpointStore):
    """A store whose first registry read predates a rival's insert (the window of a race)."""

    def __init__(self, client: Any, stale: Registry) -> None:
        super().__init__(client)
        self._stale = [stale]

    def registry(self) -> Registry:
        return self._stale.pop() if self._stale else super().registry()


def test_of_two_racing_registrations_the_first_stored_is_the_registration(ch_db: ChDatabase) -> None:
    store = CheckpointStore(ch_db.client)
    store.register("g0", deployed_at_ms=T0)
    before_rival = store.registry()
    store.register("g1", "g0", T0 + 1, "rival")
    with pytest.raises(LineageError, match="registered concurrently"):
        _Raced(ch_db.client, before_rival).register("g1", "g0", T0 + 2)
    assert ch_db.client.command("SELECT count() FROM checkpoints WHERE checkpoint_id = 'g1'") == 2  # both stored
    assert store.registry().get("g1").note == "rival"  # type: ignore[union-attr]
    assert load_registry_sql_sees_the_same(ch_db)


def load_registry_sql_sees_the_same(ch_db: ChDatabase) -> bool:
    """FINAL (the table's keep-first version) keeps the same row as the registry's read."""
    ch_db.client.command("OPTIMIZE TABLE checkpoints FINAL")
    return ch_db.client.query("SELECT note FROM checkpoints FINAL WHERE checkpoint_id = 'g1'").result_rows == [("rival",)]


def test_the_owner_endpoint_registers_and_refuses_other_roles(ch_db: ChDatabase) -> None:
    settings = ch_db.settings()
    server = ReadServer(ch_db.dsn, settings, "127.0.0.1", 0).start()
    try:
        owner = read_local_token(settings.home)
        remote = EndpointCheckpoints(RemoteReader(server.url, token=owner, database=ch_db.name))
        ck, new = remote.register("g0", "", T0, "via endpoint")
        assert new and ck.generation == 0 and ck.note == "via endpoint"
        assert remote.register("g0", "", T0) == (ck, False)
        assert remote.register("g1", "g0", T0 + 5)[0].generation == 1
        with pytest.raises(LineageError, match="unknown parent checkpoint 'ghost'"):
            remote.register("g2", "ghost", T0)
        with pytest.raises(LineageError, match="does not change"):
            remote.register("g1", "g0", T0)
        analyst = TokenStore(settings.home).create("analyst", "a")[1]
        reader = RemoteReader(server.url, token=analyst, database=ch_db.name)
        with pytest.raises(Exception, match="owner's token"):
            EndpointCheckpoints(reader).register("g9", "", T0)
        assert sorted(load_registry(reader).checkpoints) == ["g0", "g1"]  # any reader lists
    finally:
        server.stop()


def test_the_view_gives_lineage_when_read_even_to_rows_stored_before_the_registration(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i, checkpoint=["g0", "g1", "other"][i % 3]) for i in range(30)])
    select = f"SELECT checkpoint_id, served_ts, {', '.join(LINEAGE_COLUMNS)} FROM {REWARDS_LINEAGE.name} ORDER BY sample_id"
    before = ch_db.client.query(select).result_rows
    assert len(before) == 30 and all(r[2:] == (None, None, None) for r in before)
    store = CheckpointStore(ch_db.client)
    store.register("g0", deployed_at_ms=T0 - 10_000)
    store.register("g1", "g0", T0)
    for ck, served, generation, age, lag in ch_db.client.query(select).result_rows:
        want = {"g0": (0, (served - (T0 - 10_000)) / 1000, 1), "g1": (1, (served - T0) / 1000, 0)}
        assert (generation, age, lag) == want.get(ck, (None, None, None))
    assert ch_db.client.command("SELECT count() FROM rewards_lineage WHERE policy_lag = 1") == 10
