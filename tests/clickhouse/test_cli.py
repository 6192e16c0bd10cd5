"""rewardflow sql / export / db: read-only, clean errors, exact files, cross-process reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner, Result

from rewardflow.cli import db, export, sql
from rewardflow.clickhouse.describe import markdown
from rewardflow.readapi.server import ReadServer
from tests.clickhouse.rows import insert, reward
from tests.conftest_clickhouse import ChDatabase

pytestmark = pytest.mark.clickhouse
runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("sql")(sql.command)
    app.command("export")(export.command)
    app.add_typer(db.app, name="db")
    return app


@pytest.fixture
def env(ch_db: ChDatabase, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    s = ch_db.settings()
    values = {"REWARDFLOW_CLICKHOUSE_DSN": ch_db.dsn.secret, "REWARDFLOW_HOME": str(s.home), "REWARDFLOW_WEB_PORT": str(s.web_port)}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


def run(*args: str) -> Result:
    return runner.invoke(_app(), list(args))


@pytest.mark.parametrize("statement", [
    "INSERT INTO rewards (reward_id) VALUES ('x')", "ALTER TABLE rewards DELETE WHERE 1", "DROP TABLE rewards",
    "CREATE TABLE x (a UInt8) ENGINE = Memory", "TRUNCATE TABLE rewards", "SELECT 1; DROP TABLE rewards",
    "SELECT 1 INTO OUTFILE '/tmp/x.csv'", "  -- comment\n  OPTIMIZE TABLE rewards FINAL", "RENAME TABLE rewards TO r2",
])
def test_sql_refuses_writes(env: dict[str, str], ch_db: ChDatabase, statement: str) -> None:
    result = run("sql", statement)
    assert result.exit_code == 2
    assert result.output.startswith("error: refused")
    assert ch_db.client.command("EXISTS TABLE rewards") == 1


def test_sql_readonly_is_enforced_by_the_server_too(env: dict[str, str], ch_db: ChDatabase) -> None:
    from rewardflow.clickhouse.connect import local_reader

    result = run("sql", "SELECT 1 SETTINGS readonly = 0")
    assert result.exit_code == 2 and "refused: a SETTINGS clause" in result.output and "Traceback" not in result.output
    reader = local_reader(ch_db.dsn, ch_db.settings())  # past the guard, the connection itself refuses
    try:
        with pytest.raises(Exception, match="Code: 164"):
            reader.client.command("SELECT 1 SETTINGS readonly = 0")
        with pytest.raises(Exception, match="Code: 164"):
            reader.client.command("DROP TABLE rewards")
    finally:
        reader.close()
    assert ch_db.client.command("EXISTS TABLE rewards") == 1


def test_a_bad_query_prints_clickhouse_error_not_a_traceback(env: dict[str, str]) -> None:
    result = run("sql", "SELECT * FROM no_such_table")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: Code 60:")
    assert "Traceback" not in result.output
    syntax = run("sql", "SELECT count(( FROM rewards")
    assert syntax.exit_code == 2 and "Syntax error" in syntax.output


def test_sql_formats(env: dict[str, str], ch_db: ChDatabase) -> None:
    insert(ch_db.client, [reward(i) for i in range(3)])
    as_json = run("sql", "SELECT sample_id, persisted FROM rewards ORDER BY sample_id", "--format", "json")
    assert as_json.exit_code == 0, as_json.output
    assert '"persisted":{"30":1,"900":1}' in as_json.output
    as_csv = run("sql", "SELECT sample_id FROM rewards ORDER BY sample_id", "-f", "csv")
    assert as_csv.output.splitlines() == ['"sample_id"', '"req-0"', '"req-1"', '"req-2"']
    assert "3 rows" in run("sql", "SELECT * FROM rewards_latest").output


def test_export_file_matches_the_table_and_trainer_mode_is_incremental(env: dict[str, str], ch_db: ChDatabase, tmp_path: Path) -> None:
    insert(ch_db.client, [reward(i, checkpoint="ck-a" if i % 3 else "ck-b") for i in range(90)])
    insert(ch_db.client, [reward(i, checkpoint="ck-a") for i in range(1, 90, 3)], token="dup")  # duplicates
    out = tmp_path / "r.parquet"
    result = run("export", "--checkpoint", "ck-a", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "exported 60 rows" in result.output
    got = pq.read_table(out)
    want = ch_db.client.query_arrow(
        "SELECT * EXCEPT (_inserted_at), _seq FROM rewards FINAL WHERE checkpoint_id = 'ck-a' AND provisional = 0 ORDER BY _seq"
    )
    assert got.select(want.column_names).to_pylist() == want.to_pylist()
    assert got.column_names[-3:] == ["policy_generation", "policy_age_s", "policy_lag"]  # ck-a is not registered:
    assert got.column("policy_generation").null_count == 60  # no lineage
    out.unlink()
    assert run("export", "--checkpoint", "ck-a", "--trainer", "t1", "--settle", "0", "--out", str(out)).exit_code == 0
    assert pq.read_table(out).num_rows == 60
    kept = run("export", "--checkpoint", "ck-a", "--trainer", "t1", "--settle", "0", "--out", str(out))
    assert kept.exit_code == 2 and "--overwrite" in kept.output and pq.read_table(out).num_rows == 60
    again = run("export", "--checkpoint", "ck-a", "--trainer", "t1", "--settle", "0", "--out", str(out), "--overwrite")
    assert "exported 0 rows" in again.output and pq.read_table(out).num_rows == 0


def test_export_of_several_spec_versions_needs_one_named_or_all(env: dict[str, str], ch_db: ChDatabase,
                                                                 tmp_path: Path) -> None:
    insert(ch_db.client, [reward(i, checkpoint="ck-a") for i in range(10)])
    insert(ch_db.client, [reward(i, checkpoint="ck-a", spec="v2") for i in range(10)], token="v2")
    out = tmp_path / "r.parquet"
    refused = run("export", "--checkpoint", "ck-a", "--out", str(out))
    assert refused.exit_code == 2 and "2 spec versions (v1, v2)" in refused.output and not out.exists()
    assert "exported 10 rows" in run("export", "--checkpoint", "ck-a", "--spec-version", "v2", "--out", str(out)).output
    assert set(pq.read_table(out).column("spec_version").to_pylist()) == {"v2"}
    assert "exported 20 rows" in run("export", "--checkpoint", "ck-a", "--all-specs", "--out", str(out)).output
    unknown = run("export", "--checkpoint", "nope", "--out", str(out))
    assert unknown.exit_code == 2 and "checkpoint 'nope' is not registered" in unknown.output
    no_match = run("export", "--checkpoint", "ck-a", "--spec-version", "v2", "--out", str(out), "--overwrite")
    assert no_match.exit_code == 0 and "exported 10 rows" in no_match.output


def test_a_mistyped_filter_never_moves_a_trainers_cursor(env: dict[str, str], ch_db: ChDatabase, tmp_path: Path) -> None:
    insert(ch_db.client, [reward(i, checkpoint="ck-a") for i in range(10)])
    out = tmp_path / "r.parquet"
    base = ("export", "--trainer", "t1", "--settle", "0", "--out", str(out))
    typo = run(*base, "--checkpoint", "ck-a", "--spec-version", "v9")
    assert typo.exit_code == 2 and "'v9' is not a registered reward spec" in typo.output and not out.exists()
    typo = run(*base, "--checkpoint", "ck-typo")
    assert typo.exit_code == 2 and "checkpoint 'ck-typo' is not registered" in typo.output and not out.exists()
    insert(ch_db.client, [reward(i, checkpoint="ck-b", provisional=1) for i in range(3)], token="provisional")
    nothing = run(*base, "--checkpoint", "ck-b")  # a checkpoint with provisional rewards only: none matches
    assert nothing.exit_code == 0 and "the cursor of trainer 't1' is not moved" in nothing.output and "cursor now" not in nothing.output
    out.unlink()
    assert "exported 10 rows" in run(*base, "--checkpoint", "ck-a", "--spec-version", "v1").output


def test_db_migrate_and_describe(env: dict[str, str], ch_db: ChDatabase) -> None:
    result = run("db", "migrate")
    assert result.exit_code == 0, result.output
    assert "applied migrations none" in result.output
    assert "password" not in result.output
    assert run("db", "describe", "--markdown").output == markdown()
    assert "sample_id" in run("db", "describe", "rewards").output
    assert run("db", "describe", "nope").exit_code == 2


def test_docs_tables_md_is_up_to_date() -> None:
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "tables.md")
    with open(path) as fh:
        assert fh.read() == markdown(), "regenerate: rewardflow db describe --markdown > docs/tables.md"


def _child(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    code = "import typer, sys; from rewardflow.cli.sql import command; typer.run(command)"
    return subprocess.run([sys.executable, "-c", code, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


def test_other_process_reads_through_the_owner_endpoint(env: dict[str, str], ch_db: ChDatabase) -> None:
    if not ch_db.dsn.embedded:
        pytest.skip("only chDB has a single owner")
    insert(ch_db.client, [reward(i) for i in range(5)])
    refused = _child(env, "SELECT count() FROM rewards")  # we own the directory, no endpoint yet
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and f"owned by process {os.getpid()}" in refused.stderr
    assert "EmbeddedServer" not in refused.stderr
    server = ReadServer(ch_db.dsn, ch_db.settings(), "127.0.0.1", int(env["REWARDFLOW_WEB_PORT"])).start()  # (writes the local token)
    try:
        ok = _child(env, "SELECT count() AS n FROM rewards", "--format", "json")
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.strip() == '[{"n":5}]'
        denied = _child(env, "DROP TABLE rewards")
        assert denied.returncode == 2 and "refused" in denied.stderr
    finally:
        server.stop()
