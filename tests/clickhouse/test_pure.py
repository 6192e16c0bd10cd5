"""DSNs, the read-only guard, the decode stage, error cleaning, the engine probe. Pure."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from rewardflow.clickhouse.dsn import DsnError, mask_dsn, parse_dsn
from rewardflow.clickhouse.enginelock import probe_engine
from rewardflow.clickhouse.errors import clean_message
from rewardflow.clickhouse.process import MessageRejected, line_from_message, rows_from_message
from rewardflow.clickhouse.readonly import ReadOnlyViolation, check_read_only
from tests.clickhouse.rows import reward

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
    h = parse_dsn("http://alice:s3cret@host:8123/db?password=also")
    for text in (str(h), repr(h), h.masked(), mask_dsn(h.secret)):
        assert "s3cret" not in text and "also" not in text
    assert str(h) == "http://alice:***@host:8123/db?password=***"
    with pytest.raises(DsnError) as info:
        parse_dsn("gopher://bob:hunter2@x")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("sql", ["SELECT 1", "  with x AS (SELECT 1) SELECT * FROM x;", "SHOW TABLES", "DESCRIBE rewards",
                                 "EXPLAIN SELECT 1", "(SELECT 1) UNION ALL (SELECT 2)", "SELECT ';' AS semi",
                                 "SELECT 'DROP TABLE x'", "/* hi */ SELECT 1 -- bye"])
def test_reads_pass(sql: str) -> None:
    assert check_read_only(sql)


@pytest.mark.parametrize("sql", ["INSERT INTO t VALUES (1)", "drop table t", "ALTER TABLE t DELETE WHERE 1", "",
                                 "SELECT 1; SELECT 2", "SYSTEM STOP MERGES", "SET readonly = 0", "KILL QUERY WHERE 1",
                                 "SELECT * FROM t INTO OUTFILE 'x'", "GRANT ALL ON *.* TO u", "-- only a comment"])
def test_writes_and_others_are_refused(sql: str) -> None:
    with pytest.raises(ReadOnlyViolation, match="refused"):
        check_read_only(sql)


def test_rows_from_message_is_the_decoded_list() -> None:
    rows = [reward(1), reward(2)]
    value = orjson.dumps(rows, option=orjson.OPT_NON_STR_KEYS)
    table, got = rows_from_message("rewards", value)
    assert table == "rewards" and [g["reward_id"] for g in got] == [r["reward_id"] for r in rows]
    for bad, code in ((b"{}", "sink_not_a_list"), (b"[1,2]", "sink_not_a_list"), (b"nope", "sink_bad_json"), (None, "sink_null_value")):
        with pytest.raises(MessageRejected) as info:
            rows_from_message("rewards", bad)
        assert info.value.reason_code == code
    with pytest.raises(KeyError):
        rows_from_message("events.raw", value)


def test_line_from_message_frames_without_parsing() -> None:
    value = orjson.dumps([reward(1), reward(2), reward(3)], option=orjson.OPT_NON_STR_KEYS)
    line = line_from_message("rewards", value)
    assert (line.table, line.rows) == ("rewards", 3)
    assert orjson.loads(b"[" + line.body + b"]") == orjson.loads(value)
    assert line_from_message("rewards", b" [] ").rows == 0
    with pytest.raises(MessageRejected):
        line_from_message("rewards", b'{"reward_id": 1}')


def test_clean_message_is_one_line_without_repeats_or_version() -> None:
    raw = ("Code: 60. DB::Exception: Code: 60. DB::Exception: Unknown table expression identifier 'x' in scope "
           "SELECT * FROM x.\n (UNKNOWN_TABLE) (version 26.9.2.1). (UNKNOWN_TABLE)")
    assert clean_message(RuntimeError(raw)) == "Code 60: Unknown table expression identifier 'x' in scope SELECT * FROM x. (UNKNOWN_TABLE)"


def test_probe_engine_on_a_free_and_a_missing_directory(tmp_path: Path) -> None:
    assert probe_engine(tmp_path / "missing") is None
    (tmp_path / "status").write_text(f"PID: {os.getpid()}\n")
    assert probe_engine(tmp_path) is None  # a status file nobody locks: free


def test_probe_engine_sees_a_held_lock_without_breaking_it(tmp_path: Path) -> None:
    import fcntl

    status = tmp_path / "status"
    status.write_text("PID: 4242\nStarted at: now\n")
    fd = os.open(status, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        owner = probe_engine(tmp_path)
        assert owner is not None and owner.pid == 4242 and not owner.this_process
        assert probe_engine(tmp_path) is not None  # probing twice did not release the lock
    finally:
        os.close(fd)
    assert probe_engine(tmp_path) is None
