"""Lineage in the trainer pull: columns from the registry at read time, the max_policy_lag filter, export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rewardflow.cli.main import app
from rewardflow.clickhouse.remote import RemoteReader
from rewardflow.lineage.columns import LINEAGE_COLUMNS
from rewardflow.lineage.store import CheckpointStore
from rewardflow.readapi.server import ReadServer
from rewardflow.readapi.tokens import TokenStore
from rewardflow.trainer.query import rewards_sql
from rewardflow.trainer.reader import RewardReader
from tests.clickhouse.rows import T0, insert, reward
from tests.conftest_clickhouse import ChDatabase

H = 3_600_000


def read_all(ch_db: ChDatabase, trainer: str | None = None, commit: bool = False, **kw: Any) -> pa.Table:
    reader = RewardReader(ch_db.dsn, trainer=trainer, settle_s=0, settings=ch_db.settings(), **kw)
    try:
        table = pa.Table.from_batches(list(reader), schema=reader.schema())
        if commit:
            reader.commit()
        return table
    finally:
        reader.close()


def register_chain(ch_db: ChDatabase, *ids: str) -> None:
    store = CheckpointStore(ch_db.client)
    for n, ck in enumerate(ids):
        store.register(ck, ids[n - 1] if n else "", T0 + n * H)


def by_sample(table: pa.Table) -> dict[str, tuple[Any, ...]]:
    rows = table.select(["sample_id", *LINEAGE_COLUMNS]).to_pylist()
    return {r["sample_id"]: tuple(r[c] for c in LINEAGE_COLUMNS) for r in rows}


def test_a_negative_max_policy_lag_is_refused_before_connecting() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        RewardReader(trainer="t", max_policy_lag=-1)


def test_the_lag_filter_is_a_parameter_never_sql_text() -> None:
    sql, params = rewards_sql({"checkpoint_ids": ["g1", "x' OR 1 --"], "only_final": True}, 0, 10)
    assert "checkpoint_id IN {checkpoint_ids:Array(String)}" in sql and "g1" not in sql and "OR 1" not in sql
    assert params["checkpoint_ids"] == ["g1", "x' OR 1 --"]


@pytest.mark.clickhouse
def test_rows_get_lineage_from_the_registry_as_read_even_when_registered_after_they_were_stored(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i, checkpoint=["g0", "g1", "other"][i % 3]) for i in range(60)])
    unregistered = read_all(ch_db)
    assert unregistered.num_rows == 60 and all(v == (None, None, None) for v in by_sample(unregistered).values())

    register_chain(ch_db, "g0", "g1")  # after the rows were scored and stored
    got = read_all(ch_db)
    assert got.schema.field("policy_generation").type == pa.uint32() and got.schema.field("policy_lag").type == pa.uint32()
    for row in got.select(["checkpoint_id", "served_ts", *LINEAGE_COLUMNS]).to_pylist():
        want = {"g0": (0, (row["served_ts"] - T0) / 1000, 1), "g1": (1, (row["served_ts"] - T0 - H) / 1000, 0)}
        assert (row["policy_generation"], row["policy_age_s"], row["policy_lag"]) == want.get(
            row["checkpoint_id"], (None, None, None))
    # the analysts' view says the same, value for value
    view = ch_db.client.query_arrow(f"SELECT sample_id, {', '.join(LINEAGE_COLUMNS)} FROM rewards_lineage "
                                    "WHERE provisional = 0")
    assert by_sample(view) == by_sample(got)

    register_chain(ch_db, "g0", "g1", "g2")  # a newer generation: the same rows fall one generation further behind
    assert {v[2] for k, v in by_sample(read_all(ch_db)).items() if int(k.split("-")[1]) % 3 == 0} == {2}


@pytest.mark.clickhouse
def test_max_policy_lag_hands_out_only_recent_registered_checkpoints_and_leaves_the_rest_behind_the_cursor(
        ch_db: ChDatabase) -> None:
    register_chain(ch_db, "g0", "g1", "g2")
    insert(ch_db.client, [reward(i, checkpoint=["g0", "g1", "g2", "other"][i % 4]) for i in range(80)])
    reader = RewardReader(ch_db.dsn, trainer="t", max_policy_lag=1, settle_s=0, settings=ch_db.settings())
    assert reader.count_new() == 40
    reader.close()
    first = read_all(ch_db, trainer="t", commit=True, max_policy_lag=1)
    assert sorted(set(first.column("checkpoint_id").to_pylist())) == ["g1", "g2"] and first.num_rows == 40
    assert set(first.column("policy_lag").to_pylist()) == {0, 1}
    assert read_all(ch_db, trainer="t", max_policy_lag=1).num_rows == 0
    # the skipped rows (g0, unregistered) are behind t's cursor: not offered without the filter either
    assert read_all(ch_db, trainer="t").num_rows == 0
    assert read_all(ch_db, trainer="fresh").num_rows == 80

    register_chain(ch_db, "g0", "g1", "g2", "g3")  # g1 now lags 2
    insert(ch_db.client, [reward(i, checkpoint=["g1", "g3"][i % 2]) for i in range(100, 120)])
    second = read_all(ch_db, trainer="t", commit=True, max_policy_lag=1)
    assert set(second.column("checkpoint_id").to_pylist()) == {"g3"} and second.num_rows == 10
    assert read_all(ch_db, trainer="none-registered", max_policy_lag=0).column("checkpoint_id").to_pylist() == ["g3"] * 10


@pytest.mark.clickhouse
def test_an_empty_registry_hands_out_nothing_under_a_lag_cap(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i) for i in range(10)])
    assert read_all(ch_db, trainer="t", commit=True, max_policy_lag=5).num_rows == 0
    CheckpointStore(ch_db.client).register("ck-a", deployed_at_ms=T0)
    assert read_all(ch_db, trainer="t", max_policy_lag=5).num_rows == 0  # behind the cursor now
    assert read_all(ch_db, trainer="other", max_policy_lag=5).num_rows == 10


@pytest.mark.clickhouse
def test_the_lag_filter_keeps_the_seq_projection_read(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i, checkpoint=["g1", "g2", "g3"][i % 3]) for i in range(30)])
    sql, params = rewards_sql({"only_final": True, "checkpoint_ids": ["g1", "g2"]}, 0, 2**64 - 1)
    plan = "\n".join(r[0] for r in ch_db.client.query("EXPLAIN " + sql, parameters=params).result_rows)
    assert "ReadFromMergeTree (by_seq)" in plan


@pytest.mark.clickhouse
def test_lineage_and_the_lag_filter_through_the_owner_endpoint(ch_db: ChDatabase) -> None:
    register_chain(ch_db, "g0", "g1")
    insert(ch_db.client, [reward(i, checkpoint=["g0", "g1"][i % 2]) for i in range(20)])
    settings = ch_db.settings()
    server = ReadServer(ch_db.dsn, settings, "127.0.0.1", 0).start()
    try:
        token = TokenStore(settings.home).create("trainer", "remote", "remote")[1]
        remote = RemoteReader(server.url, token=token, database=ch_db.name)
        reader = RewardReader(trainer="remote", max_policy_lag=0, settle_s=0, reader=remote)
        table = pa.Table.from_batches(list(reader))
        reader.commit()
    finally:
        server.stop()
    assert table.num_rows == 10 and set(table.column("policy_generation").to_pylist()) == {1}
    assert table.column_names[-3:] == list(LINEAGE_COLUMNS)


@pytest.mark.clickhouse
def test_export_passes_max_policy_lag_through(ch_db: ChDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = ch_db.settings()
    for k, v in {"REWARDFLOW_CLICKHOUSE_DSN": ch_db.dsn.secret, "REWARDFLOW_HOME": str(s.home)}.items():
        monkeypatch.setenv(k, v)
    register_chain(ch_db, "g0", "g1", "g2")
    insert(ch_db.client, [reward(i, checkpoint="g1") for i in range(30)])
    out = tmp_path / "r.parquet"
    runner = CliRunner()

    def export(*args: str) -> str:
        result = runner.invoke(app, ["export", "--checkpoint", "g1", "--out", str(out), "--settle", "0", "--overwrite", *args])
        assert result.exit_code == 0, result.output
        return result.output

    assert "exported 0 rows" in export("--max-policy-lag", "0", "--trainer", "t")
    assert pq.read_table(out).column_names[-3:] == list(LINEAGE_COLUMNS)  # an empty file has the columns too
    assert "exported 0 rows" in export("--max-policy-lag", "1", "--trainer", "t")  # behind t's cursor now
    assert "exported 30 rows" in export("--max-policy-lag", "1")
    assert set(pq.read_table(out).column("policy_lag").to_pylist()) == {1}
    bad = runner.invoke(app, ["export", "--checkpoint", "g1", "--out", str(out), "--max-policy-lag", "-1"])
    assert bad.exit_code == 2
