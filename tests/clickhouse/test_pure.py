"""DSNs, the decode stage, error cleaning, the engine owner lock. Pure (no engine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rewardflow.clickhouse.dsn import DsnError, mask_dsn, parse_dsn
from rewardflow.clickhouse.enginelock import LOCK_FILE, claim_engine, probe_engine
from rewardflow.clickhouse.errors import EngineBusyError, clean_message

def test_dsn_forms_and_database_selection() -> None:
    d = parse_dsn("chdb:///var/lib/rf")
    assert d.embedded and d.database is None and str(d.path) == "/var/lib/rf"
    assert d.with_database("x").secret == "chdb:///var/lib/rf?database=x"
    assert parse_dsn("chdb:///var/lib/rf?database=x").database == "x"
    h = parse_dsn("https://alice:s3cret@ch.example:8443/prod")
    assert (h.scheme, h.database) == ("https", "prod")
    assert h.with_database("dev").secret == "https://alice:s3cret@ch.example:8443/dev"
    for bad in ("chdb://relative", "ftp://x", "http:///nohost"):
        with pytest.raises(DsnError):
            parse_dsn(bad)


def test_passwords_never_shown() -> None:
    h = parse_dsn("http://alice:s3cret@host:8123/db")
    for text in (str(h), repr(h), h.masked(), mask_dsn(h.secret), mask_dsn("http://alice:s3cret@host/db?password=also")):
        assert "s3cret" not in text and "also" not in text
    assert str(h) == "http://alice:***@host:8123/db"
    with pytest.raises(DsnError, match=r"user:password@ part") as refused:  # the driver would get two passwords
        parse_dsn("http://alice:s3cret@host:8123/db?password=also")
    assert "s3cret" not in str(refused.value) and "also" not in str(refused.value)
    with pytest.raises(DsnError) as info:
        parse_dsn("gopher://bob:hunter2@x")
    assert "hunter2" not in str(info.value)


def test_clean_message_is_one_line_without_repeats_or_version() -> None:
    raw = ("Code: 60. DB::Exception: Code: 60. DB::Exception: Unknown table expression identifier 'x' in scope "
           "SELECT * FROM x.\n (UNKNOWN_TABLE) (version 26.9.2.1). (UNKNOWN_TABLE)")
    assert clean_message(RuntimeError(raw)) == "Code 60: Unknown table expression identifier 'x' in scope SELECT * FROM x. (UNKNOWN_TABLE)"


def test_a_missing_rewardflow_table_says_how_to_create_it() -> None:
    raw = "Code: 60. DB::Exception: Unknown table expression identifier 'trainer_cursors' in scope SELECT 1. (UNKNOWN_TABLE)"
    assert clean_message(RuntimeError(raw)).endswith("created by `rewardflow db migrate`, which `rewardflow run` also does at start)")


def test_probe_engine_on_a_free_and_a_missing_directory(tmp_path: Path) -> None:
    assert probe_engine(tmp_path / "missing") is None
    (tmp_path / LOCK_FILE).write_text("4242\n")
    assert probe_engine(tmp_path) is None  # a lock file nobody holds: free


def test_the_owner_lock_keeps_every_other_process_out_without_being_broken(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; from rewardflow.clickhouse.enginelock import claim_engine; "
            "claim_engine(Path(sys.argv[1])); print('owned', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "owned"
        owner = probe_engine(tmp_path)
        assert owner is not None and owner.pid == child.pid and not owner.this_process
        assert probe_engine(tmp_path) is not None  # probing twice did not release the lock
        with pytest.raises(EngineBusyError, match=str(child.pid)):
            claim_engine(tmp_path)
    finally:
        child.kill()
        child.wait()
    assert probe_engine(tmp_path) is None
    claim_engine(tmp_path)  # free again: this process takes it
    owner = probe_engine(tmp_path)
    assert owner is not None and owner.this_process
