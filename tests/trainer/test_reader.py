"""The trainer cursor hands each sample to a trainer exactly once, across restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rewardflow.readapi.server import ReadServer
from rewardflow.readapi.tokens import TokenStore
from rewardflow.clickhouse.remote import RemoteReader
from rewardflow.clickhouse.tables import REWARDS
from rewardflow.lineage.columns import LINEAGE_COLUMNS
from rewardflow.trainer.reader import RewardReader, UnknownCheckpoint, UnknownSpecVersion
from tests.clickhouse.rows import insert, reward
from tests.conftest_clickhouse import ChDatabase

pytestmark = pytest.mark.clickhouse


def pull(ch_db: ChDatabase, trainer: str = "ppo", commit: bool = True, **kw: Any) -> list[str]:
    reader = RewardReader(ch_db.dsn, trainer=trainer, settle_s=0, settings=ch_db.settings(), **kw)
    try:
        got = [sid for batch in reader for sid in batch.column("sample_id").to_pylist()]
        if commit:
            reader.commit()
        return got
    finally:
        reader.close()


def snapshot(ch_db: ChDatabase, **kw: Any) -> pa.Table:
    reader = RewardReader(ch_db.dsn, trainer=None, settle_s=0, settings=ch_db.settings(), **kw)
    table = pa.Table.from_batches(list(reader))
    reader.close()
    return table


def test_each_sample_once_across_restarts_despite_duplicates_and_provisionals(ch_db: ChDatabase) -> None:
    first = [reward(i) for i in range(100)]
    insert(ch_db.client, first)
    insert(ch_db.client, [reward(i, provisional=1) for i in range(100, 130)])  # not final: never handed out
    got1 = pull(ch_db)
    assert sorted(got1) == sorted(r["sample_id"] for r in first)

    # a replay past the dedup window re-inserts 20 old rows (new _seq), plus 50 new samples
    insert(ch_db.client, first[:20], token="replay-beyond-window")
    second = [reward(i) for i in range(200, 250)]
    insert(ch_db.client, second)
    assert ch_db.client.command("SELECT count() FROM rewards WHERE provisional = 0") == 170  # duplicates stored
    got2 = pull(ch_db)
    assert sorted(got2) == sorted(r["sample_id"] for r in second)
    assert pull(ch_db) == []
    assert pull(ch_db, trainer="other") and len(pull(ch_db, trainer="fresh")) == 150


def test_partial_iteration_commits_only_what_was_handed_out(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i) for i in range(100)])
    reader = RewardReader(ch_db.dsn, trainer="t", batch_rows=30, settle_s=0, settings=ch_db.settings())
    it = iter(reader)
    batch = next(it)
    assert batch.num_rows == 30
    reader.commit()
    reader.close()
    rest = pull(ch_db, trainer="t")
    assert len(rest) == 70 and not set(rest) & set(batch.column("sample_id").to_pylist())


def test_uncommitted_rows_are_handed_out_again(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i) for i in range(10)])
    assert len(pull(ch_db, trainer="t", commit=False)) == 10
    assert len(pull(ch_db, trainer="t")) == 10
    assert pull(ch_db, trainer="t") == []


def test_filters_and_batches(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i, checkpoint="ck-a" if i % 2 else "ck-b", arm="x") for i in range(40)])
    reader = RewardReader(ch_db.dsn, trainer="t", checkpoint="ck-a", batch_rows=7, settle_s=0, settings=ch_db.settings())
    batches = list(reader)
    reader.close()
    assert [b.num_rows for b in batches] == [7, 7, 6]
    table = pa.Table.from_batches(batches)
    assert set(table.column("checkpoint_id").to_pylist()) == {"ck-a"}
    assert table.column_names == [*REWARDS.record_columns, "_seq", *LINEAGE_COLUMNS]
    assert table.column("_seq").to_pylist() == sorted(table.column("_seq").to_pylist())


def test_an_unknown_spec_version_is_refused_before_anything_is_read(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i) for i in range(10)])
    reader = RewardReader(ch_db.dsn, trainer="t", spec_version="v9", settle_s=0, settings=ch_db.settings())
    with pytest.raises(UnknownSpecVersion, match="'v9' is not a registered reward spec"):
        list(reader)
    with pytest.raises(UnknownSpecVersion):
        reader.count_new()
    assert reader.commit() == 0  # nothing was iterated: the cursor stays where it was
    reader.close()
    assert len(pull(ch_db, trainer="t", spec_version="v1")) == 10
    ch_db.client.command("INSERT INTO reward_specs (version, content_hash, description, weights, registered_at) "
                         "VALUES ('v3', 'h', 'next', '{}', 0)")
    assert pull(ch_db, trainer="t", spec_version="v3") == []  # registered, no row yet: not an error


def test_an_unknown_checkpoint_is_refused_before_anything_is_read(ch_db: ChDatabase) -> None:
    """A mistyped checkpoint matches no row: without the check a trainer's commit would move its cursor past
    every row, the ones of the checkpoint it meant included."""
    from rewardflow.lineage.store import CheckpointStore

    insert(ch_db.client, [reward(i, checkpoint="ckpt-2025-11-09") for i in range(10)])
    reader = RewardReader(ch_db.dsn, trainer="t", checkpoint="ckpt-2025-11-O9", settle_s=0, settings=ch_db.settings())
    with pytest.raises(UnknownCheckpoint, match="'ckpt-2025-11-O9' is not registered"):
        list(reader)
    assert reader.commit() == 0
    reader.close()
    assert len(pull(ch_db, trainer="t")) == 10  # every row still ahead of the cursor
    CheckpointStore(ch_db.client).register("ckpt-next")
    assert pull(ch_db, trainer="t2", checkpoint="ckpt-next") == []  # registered, no row yet: not an error


def test_settle_window_hides_rows_younger_than_it(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i) for i in range(5)])
    reader = RewardReader(ch_db.dsn, trainer="t", settle_s=3600, settings=ch_db.settings())
    assert list(reader) == []
    reader.close()


def test_through_the_owner_endpoint_same_answer(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i) for i in range(30)])
    settings = ch_db.settings()
    server = ReadServer(ch_db.dsn, settings, "127.0.0.1", 0).start()
    try:
        token = TokenStore(settings.home).create("trainer", "test", "remote")[1]
        remote = RemoteReader(server.url, token=token, database=ch_db.name)
        with pytest.raises(UnknownSpecVersion):
            list(RewardReader(trainer="remote", spec_version="v9", settle_s=0, reader=remote))
        with pytest.raises(UnknownCheckpoint):
            list(RewardReader(trainer="remote", checkpoint="ck-typo", settle_s=0, reader=remote))
        reader = RewardReader(trainer="remote", spec_version="v1", settle_s=0, reader=remote)
        got = [s for b in reader for s in b.column("sample_id").to_pylist()]
        reader.commit()
        assert len(got) == 30
        assert RewardReader(trainer="remote", settle_s=0, reader=remote).cursor > 0
        assert list(RewardReader(trainer="remote", settle_s=0, reader=remote)) == []
    finally:
        server.stop()


def test_an_export_whose_token_may_not_move_the_cursor_leaves_no_file(ch_db: ChDatabase, tmp_path: Path) -> None:
    """The file is written before the cursor moves; when the endpoint refuses the move, the file goes too
    (its rows are not behind the cursor), so the next export, with a token that may, writes it."""
    from rewardflow.clickhouse.errors import AccessDenied
    from rewardflow.trainer.export import export_parquet

    insert(ch_db.client, [reward(i) for i in range(12)])
    settings = ch_db.settings()
    server = ReadServer(ch_db.dsn, settings, "127.0.0.1", 0).start()
    out = tmp_path / "r.parquet"
    try:
        analyst = TokenStore(settings.home).create("analyst", "alice")[1]
        reader = RewardReader(trainer="x9", settle_s=0, reader=RemoteReader(server.url, token=analyst, database=ch_db.name))
        with pytest.raises(AccessDenied, match="--role trainer --trainer NAME"):
            export_parquet(reader, out, commit=True)
        assert not out.exists() and not out.with_name(out.name + ".partial").exists()
        out.write_bytes(b"an earlier export")  # its rows are behind the cursor: an --overwrite refused keeps it
        with pytest.raises(AccessDenied):
            export_parquet(reader, out, commit=True)
        assert out.read_bytes() == b"an earlier export" and not out.with_name(out.name + ".previous").exists()
        out.unlink()
        trainer = TokenStore(settings.home).create("trainer", "job", "x9")[1]
        reader = RewardReader(trainer="x9", settle_s=0, reader=RemoteReader(server.url, token=trainer, database=ch_db.name))
        assert export_parquet(reader, out, commit=True).rows == 12 and reader.cursor > 0
        assert export_parquet(reader, out, commit=True).rows == 0  # an --overwrite that commits: no copy left
        assert not out.with_name(out.name + ".previous").exists()
    finally:
        server.stop()


def test_an_export_never_writes_through_a_symlink_planted_where_its_partial_file_goes(
        ch_db: ChDatabase, tmp_path: Path) -> None:
    """In a directory others may write to, a symlink at ``<out>.partial`` would have the export overwrite
    the file it points to."""
    from rewardflow.trainer.export import export_parquet

    insert(ch_db.client, [reward(i) for i in range(5)])
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    out = tmp_path / "shared" / "r.parquet"
    out.parent.mkdir()
    out.with_name(out.name + ".partial").symlink_to(victim)
    reader = RewardReader(ch_db.dsn, trainer=None, settle_s=0, settings=ch_db.settings())
    try:
        assert export_parquet(reader, out, commit=False).rows == 5
    finally:
        reader.close()
    assert victim.read_text() == "not yours"
    assert not out.is_symlink() and pq.read_table(out).num_rows == 5
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.parquet", "r.parquet.lock"]


def test_export_is_exactly_the_final_rows_in_seq_order(ch_db: ChDatabase) -> None:
    # several parts, keys interleaved across them, and a replay past the dedup window with *changed*
    # content: the two-step read must return what `rewards FINAL` returns (the first copy), no more
    ch_db.client.command("SYSTEM STOP MERGES rewards")  # keep the duplicates stored, unmerged
    for part in range(4):
        insert(ch_db.client, [reward(i, reward_value=0.5) for i in range(part, 200, 4)])
    insert(ch_db.client, [reward(i, reward_value=0.9) for i in range(0, 200, 3)], token="replay-beyond-window")
    insert(ch_db.client, [reward(i, provisional=1) for i in range(300, 320)])
    cols = ", ".join(f"`{c}`" for c in (*REWARDS.record_columns, "_seq"))
    want = ch_db.client.query_arrow(f"SELECT {cols} FROM rewards FINAL WHERE provisional = 0 ORDER BY _seq")
    reader = RewardReader(ch_db.dsn, trainer=None, batch_rows=64, settle_s=0, settings=ch_db.settings())
    got = pa.Table.from_batches(list(reader), schema=reader.schema())
    reader.close()
    assert got.num_rows == 200 and ch_db.client.command("SELECT count() FROM rewards") == 287
    assert got.select(want.column_names).to_pylist() == want.to_pylist()
    assert got.column_names == [*want.column_names, *LINEAGE_COLUMNS]
    assert set(got.column("reward").to_pylist()) == {0.5}


def test_the_pull_reads_the_seq_projection_and_never_hands_out_a_copy_a_merge_left_in_it(ch_db: ChDatabase) -> None:
    from rewardflow.trainer.query import rewards_sql

    for part in range(3):
        insert(ch_db.client, [reward(i) for i in range(part, 90, 3)])  # keys interleaved across parts
    sql, params = rewards_sql({"only_final": True}, 0, 2**64 - 1)
    plan = "\n".join(r[0] for r in ch_db.client.query("EXPLAIN " + sql, parameters=params).result_rows)
    assert "ReadFromMergeTree (by_seq)" in plan
    got = snapshot(ch_db, batch_rows=16)
    assert got.num_rows == 90 and got.column("_seq").to_pylist() == sorted(got.column("_seq").to_pylist())

    # replayed copies (other values, same keys), then a merge: it drops them from the table, not from by_seq
    insert(ch_db.client, [reward(i, reward_value=0.9) for i in range(0, 90, 10)], token="replay-beyond-window")
    ch_db.client.command("OPTIMIZE TABLE rewards FINAL")
    stored = ch_db.client.query(
        "SELECT sum(rows), sum(parent_rows) FROM system.projection_parts "
        "WHERE database = currentDatabase() AND table = 'rewards' AND name = 'by_seq' AND active"
    ).result_rows
    assert stored == [(99, 90)]
    assert ch_db.client.command("SELECT count() FROM rewards") == 90
    assert snapshot(ch_db).to_pylist() == got.to_pylist()  # the first copies, once each, in _seq order


def test_a_reader_closed_mid_stream_does_not_pass_for_exhausted(ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i) for i in range(100)])
    reader = RewardReader(ch_db.dsn, trainer="t", batch_rows=10, settle_s=0, settings=ch_db.settings())
    it = iter(reader)
    handed = [next(it)]
    other = reader._reader.stream_arrow("SELECT number FROM numbers(3)")  # a second stream meanwhile: its own handle
    assert [b.num_rows for b in other] == [3]
    handed.append(next(it))
    reader.close()  # cuts the open stream short
    with pytest.raises(Exception, match="closed before its end"):
        for batch in it:
            handed.append(batch)
    assert reader._position == handed[-1].column("_seq")[-1].as_py()  # what was handed out, never the horizon


def test_a_second_export_to_a_file_being_written_stops_and_leaves_the_first_whole(
        ch_db: ChDatabase, tmp_path: Path) -> None:
    from rewardflow.trainer.export import ExportInProgress, export_parquet

    insert(ch_db.client, [reward(i) for i in range(7)])
    out = tmp_path / "r.parquet"
    first = RewardReader(ch_db.dsn, trainer=None, settle_s=0, settings=ch_db.settings())
    second = RewardReader(ch_db.dsn, trainer=None, settle_s=0, settings=ch_db.settings())
    refused: list[str] = []

    def meanwhile(rows: int) -> None:  # while the first export holds its partial file
        with pytest.raises(ExportInProgress, match="another export is writing") as exc:
            export_parquet(second, out, commit=False)
        refused.append(str(exc.value))

    try:
        assert export_parquet(first, out, commit=False, on_batch=meanwhile).rows == 7
        assert refused and pq.read_table(out).num_rows == 7
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet", "r.parquet.lock"]
        assert export_parquet(second, out, commit=False).rows == 7  # once the first is done, the file is free
    finally:
        first.close()
        second.close()


def test_an_export_still_committing_its_cursor_keeps_a_second_one_out(ch_db: ChDatabase, tmp_path: Path) -> None:
    """The lock covers the cursor's commit and the replaced file's return: a second export in between
    would otherwise move the first's file aside, and a failed commit would then remove both."""
    from rewardflow.trainer.export import ExportInProgress, export_parquet

    insert(ch_db.client, [reward(i) for i in range(6)])
    out = tmp_path / "r.parquet"
    out.write_bytes(b"an earlier export")
    first = RewardReader(ch_db.dsn, trainer="t1", settle_s=0, settings=ch_db.settings())
    second = RewardReader(ch_db.dsn, trainer="t2", settle_s=0, settings=ch_db.settings())
    commit, refused = first.commit, []

    def committing() -> int:  # while the first export commits its cursor
        with pytest.raises(ExportInProgress):
            export_parquet(second, out, commit=True)
        refused.append(True)
        return commit()

    first.commit = committing  # type: ignore[method-assign]
    try:
        assert export_parquet(first, out, commit=True).rows == 6 and refused
        assert pq.read_table(out).num_rows == 6 and first.cursor > 0
        with pytest.raises(FileExistsError):
            export_parquet(second, out, commit=True, keep_existing=True)  # (an export without --overwrite)
        assert pq.read_table(out).num_rows == 6
    finally:
        first.close()
        second.close()
