"""``rewardflow checkpoints``: help, register, list, one-line errors, and through the chDB owner's endpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner, Result

from rewardflow.cli.checkpoints import age_text
from rewardflow.cli.main import app
from rewardflow.lineage.store import CheckpointStore
from rewardflow.readapi.server import ReadServer
from tests.conftest_clickhouse import ChDatabase

runner = CliRunner()
T = "2025-06-01T08:00:00Z"
T_MS = 1_748_764_800_000


def run(*args: str) -> Result:
    return runner.invoke(app, ["checkpoints", *args])


def test_help_names_every_command_and_option() -> None:
    assert {"register", "list"} <= set(run("--help").output.split())
    help_text = run("register", "--help").output
    for option in ("--parent", "--deployed-at", "--note", "ISO-8601"):
        assert option in help_text
    assert "--json" in run("list", "--help").output


def test_age_text() -> None:
    assert [age_text(ms) for ms in (45_000, 12 * 60_000, 5 * 3_600_000 + 180_000, 3 * 86_400_000 + 4 * 3_600_000)] == [
        "45s", "12m", "5h 03m", "3d 04h"]
    assert age_text(-120_000) == "in 2m"


@pytest.fixture
def env(ch_db: ChDatabase, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    s = ch_db.settings()
    values = {"REWARDFLOW_CLICKHOUSE_DSN": ch_db.dsn.secret, "REWARDFLOW_HOME": str(s.home),
              "REWARDFLOW_WEB_PORT": str(s.web_port)}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


@pytest.mark.clickhouse
def test_register_and_list(env: dict[str, str], ch_db: ChDatabase) -> None:
    first = run("register", "g0", "--deployed-at", T, "--note", "base")
    assert first.exit_code == 0, first.output
    assert first.output == f"registered g0: generation 0, parent (none), deployed 2025-06-01T08:00:00.000Z\n"
    assert run("register", "g1", "--parent", "g0", "--deployed-at", str(T_MS + 5 * 3_600_000)).exit_code == 0
    again = run("register", "g1", "--parent", "g0")
    assert again.exit_code == 0 and "registered already, identically" in again.output
    table = run("list").output
    assert "g0" in table and "base" in table and "2025-06-01T13:00:00Z" in table
    doc = orjson.loads(run("list", "--json").output)
    assert [(d["checkpoint_id"], d["parent_id"], d["generation"], d["lag"]) for d in doc] == [
        ("g0", "", 0, 1), ("g1", "g0", 1, 0)]
    assert doc[0]["deployed_at_ms"] == T_MS and doc[0]["deployed_at"] == "2025-06-01T08:00:00.000Z"
    assert doc[0]["age_s"] > 0
    assert ch_db.client.command("SELECT count() FROM checkpoints") == 2


@pytest.mark.clickhouse
@pytest.mark.parametrize("args, needle", [
    (["g1", "--parent", "ghost"], "unknown parent checkpoint 'ghost'"),
    (["g0", "--deployed-at", "2025-06-02T08:00:00Z"], "lineage does not change"),
    (["g0", "--parent", "g0"], "cannot be its own parent"),
    (["g1", "--deployed-at", "1748764800"], "looks like epoch seconds"),
    (["g1", "--deployed-at", "soon"], "ISO-8601"),
])
def test_refusals_exit_2_with_one_error_line(env: dict[str, str], ch_db: ChDatabase, args: list[str], needle: str) -> None:
    CheckpointStore(ch_db.client).register("g0", deployed_at_ms=T_MS)
    result = runner.invoke(app, ["checkpoints", "register", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and needle in result.stderr and result.stderr.count("\n") == 1
    assert ch_db.client.command("SELECT count() FROM checkpoints") == 1


@pytest.mark.clickhouse
def test_a_database_without_the_registry_says_how_to_create_it(env: dict[str, str], ch_db: ChDatabase) -> None:
    ch_db.client.command("DROP VIEW rewards_lineage SYNC")
    ch_db.client.command("DROP TABLE checkpoints SYNC")
    for args in (["list"], ["register", "g0"]):
        result = run(*args)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert "rewardflow db migrate" in result.stderr and "Traceback" not in result.output


@pytest.mark.clickhouse
def test_another_process_registers_through_the_owners_endpoint(env: dict[str, str], ch_db: ChDatabase) -> None:
    """This test process owns chDB and serves its endpoint; the CLI in a child process goes through it."""
    settings = ch_db.settings(web_port=int(env["REWARDFLOW_WEB_PORT"]))
    exe = os.path.join(os.path.dirname(sys.executable), "rewardflow")
    with ReadServer(ch_db.dsn, settings, "127.0.0.1"):
        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([exe, "checkpoints", *args], env={**os.environ, **env}, capture_output=True,
                                  text=True, timeout=60, check=False)

        assert cli("register", "g0", "--deployed-at", T).returncode == 0
        child = cli("register", "g1", "--parent", "g0")
        assert child.returncode == 0 and "generation 1" in child.stdout, child.stderr
        refused = cli("register", "g2", "--parent", "ghost")
        assert refused.returncode == 2 and refused.stderr.startswith("error: unknown parent checkpoint 'ghost'")
        listed = orjson.loads(cli("list", "--json").stdout)
    assert [d["checkpoint_id"] for d in listed] == ["g0", "g1"]
    assert ch_db.client.command("SELECT count() FROM checkpoints") == 2


def test_an_unreachable_server_is_one_error_without_the_password(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    env.update({"REWARDFLOW_CLICKHOUSE_DSN": "http://rf-user:pw-s3cret@127.0.0.1:1/db", "REWARDFLOW_HOME": str(tmp_path)})
    exe = os.path.join(os.path.dirname(sys.executable), "rewardflow")
    for args in (["list"], ["register", "g0"]):
        proc = subprocess.run([exe, "checkpoints", *args], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2, proc.stderr
        assert "error: cannot connect to ClickHouse" in proc.stderr and "Traceback" not in proc.stderr
        assert "pw-s3cret" not in proc.stdout + proc.stderr
