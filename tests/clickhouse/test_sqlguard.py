"""The parser-based read-only guard on the real engine (the endpoint tests run the bypass corpus end to end)."""

from __future__ import annotations

from typing import Any

import pytest

from rewardflow.clickhouse.readonly import ReadOnlyViolation
from rewardflow.clickhouse.sqlguard import SqlGuard
from tests.conftest_clickhouse import ChDatabase

pytestmark = pytest.mark.clickhouse


def guard_of(ch_db: ChDatabase) -> SqlGuard:
    return SqlGuard(lambda sql, p: [tuple(r) for r in ch_db.client.query(sql, parameters=dict(p)).result_rows])


@pytest.mark.parametrize("sql", ["SELECT 1", "  with x AS (SELECT 1) SELECT * FROM x;", "SHOW TABLES", "DESCRIBE rewards",
                                 "EXPLAIN SELECT 1", "(SELECT 1) UNION ALL (SELECT 2)", "SELECT ';' AS semi",
                                 "SELECT 'DROP TABLE x'", "/* hi */ SELECT 1 -- bye", "SELECT * FROM system.settings LIMIT 1",
                                 "SELECT * FROM numbers(3)", "EXISTS TABLE rewards"])
def test_reads_pass_in_their_canonical_form(ch_db: ChDatabase, sql: str) -> None:
    canonical = guard_of(ch_db).check(sql)
    assert "--" not in canonical and "/*" not in canonical and not canonical.endswith(";")


@pytest.mark.parametrize("sql", ["INSERT INTO t VALUES (1)", "drop table t", "ALTER TABLE t DELETE WHERE 1", "",
                                 "SELECT 1; SELECT 2", "SYSTEM STOP MERGES", "SET readonly = 0", "KILL QUERY WHERE 1",
                                 "SELECT * FROM t INTO OUTFILE 'x'", "GRANT ALL ON *.* TO u", "-- only a comment",
                                 "SELECT * FROM file('x')", "SELECT 1 SETTINGS readonly = 0"])
def test_writes_and_others_are_refused(ch_db: ChDatabase, sql: str) -> None:
    with pytest.raises(ReadOnlyViolation, match="^refused"):
        guard_of(ch_db).check(sql)


@pytest.mark.parametrize(("sql", "parameters"), [
    ("SELECT query FROM system.processes", {}),
    ("SELECT * FROM system.`query_log`", {}),
    ("SELECT name, last_error_message FROM system.errors", {}),  # (a failed statement's text, literals too)
    ("SHOW PROCESSLIST", {}),
    ("SELECT 1 FROM processes", {}),  # (as if the current database were system)
    ("SELECT * FROM view(SELECT query FROM system.processes)", {}),
    ("WITH q AS (SELECT query FROM system.processes) SELECT * FROM q", {}),
    ("SELECT (SELECT any(query) FROM system.processes)", {}),
    ("SELECT * FROM merge('system', '^processes$')", {}),
    ("SELECT * FROM merge(REGEXP('^sys'), '^proc')", {}),
    ("SELECT * FROM merge('sys' || 'tem', 'processes')", {}),
    ("SELECT * FROM {t:Identifier}", {"t": "system.processes"}),
    ("SELECT * FROM merge({d:String}, 'processes')", {"d": "system"}),
])
def test_other_readers_statements_are_refused(ch_db: ChDatabase, sql: str, parameters: dict[str, str]) -> None:
    """Any token may read: the running and logged statements of the engine (their literals too) are others'."""
    with pytest.raises(ReadOnlyViolation, match="other readers'"):
        guard_of(ch_db).check(sql, parameters)


@pytest.mark.parametrize("sql", ["SELECT name FROM system.tables", "SELECT count() FROM system.parts",
                                 "SELECT count() FROM merge('^rewards$')"])
def test_the_systems_other_tables_and_merges_of_the_database_stay_readable(ch_db: ChDatabase, sql: str) -> None:
    guard_of(ch_db).check(sql)


def test_the_refusal_names_what_was_refused(ch_db: ChDatabase) -> None:
    guard = guard_of(ch_db)
    cases: dict[str, Any] = {"SELECT 1 INTO OUTFILE 'x'": "INTO OUTFILE", "SELECT * FROM url('http://x', CSV, 'a Int8')": "url",
                             "DROP TABLE rewards": "DropQuery", "SELECT 1 SETTINGS max_threads = 1": "SETTINGS"}
    for sql, named in cases.items():
        with pytest.raises(ReadOnlyViolation, match=named):
            guard.check(sql)


def counting_guard(ch_db: ChDatabase) -> tuple[SqlGuard, list[str]]:
    """A guard on the real engine, with the statements it sends to the engine."""
    asked: list[str] = []

    def run(sql: str, p: Any) -> list[tuple[Any, ...]]:
        asked.append(sql)
        return [tuple(r) for r in ch_db.client.query(sql, parameters=dict(p)).result_rows]

    return SqlGuard(run), asked


def test_an_accepted_request_is_not_parsed_again_and_keeps_its_canonical_form(ch_db: ChDatabase) -> None:
    guard, asked = counting_guard(ch_db)
    sql = "SELECT count() /* polled */ FROM rewards WHERE sample_id = {s:String}"
    first = guard.check(sql, {"s": "a"})
    n = len(asked)
    assert n >= 2  # formatQuery and EXPLAIN AST
    assert guard.check(sql, {"s": "a"}) == first
    assert len(asked) == n
    guard.check(sql, {"s": "b"})  # other parameter values: asked again
    guard.check(sql, {"s": "a", "t": "x"})
    assert len(asked) == n + 4


def test_a_refusal_is_asked_again_every_time(ch_db: ChDatabase) -> None:
    guard, asked = counting_guard(ch_db)
    for _ in range(2):
        with pytest.raises(ReadOnlyViolation, match="INTO OUTFILE"):
            guard.check("SELECT 1 INTO OUTFILE 'x'")
    assert len(asked) == 2  # formatQuery each time; nothing kept


def test_the_verdicts_kept_are_bounded_and_the_oldest_goes_first(ch_db: ChDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    import rewardflow.clickhouse.sqlguard as sqlguard

    monkeypatch.setattr(sqlguard, "VERDICTS_KEPT", 2)
    guard, asked = counting_guard(ch_db)
    for sql in ("SELECT 1", "SELECT 2", "SELECT 1", "SELECT 3"):  # 1 is used again, so 2 is the oldest
        guard.check(sql)
    n = len(asked)
    guard.check("SELECT 1")
    guard.check("SELECT 3")
    assert len(asked) == n
    guard.check("SELECT 2")
    assert len(asked) > n



def test_a_statement_its_parameters_would_change_is_refused(ch_db: ChDatabase) -> None:
    """With the reader's driver as ``bind``: the engine must receive the very text the guard checked."""
    from rewardflow.clickhouse.readers import _sent

    guard = SqlGuard(lambda sql, p: [tuple(r) for r in ch_db.client.query(sql, parameters=dict(p)).result_rows], _sent)
    assert "{n:UInt8}" in guard.check("SELECT * FROM numbers({n:UInt8})", {"n": 2})
    assert guard.check("SELECT 1", {"n": 2}) == "SELECT 1"  # an unused parameter changes nothing
    for sql in ["SELECT '%(n)s'", "SELECT 'a' LIKE '%a'", "SELECT 1 AS x ORDER BY '%(n)s'"]:
        with pytest.raises(ReadOnlyViolation, match="^refused: the parameters would be written into the statement"):
            guard.check(sql, {"n": "' INTO OUTFILE 'x' --"})
    assert guard.check("SELECT 'a' LIKE '%a'") == "SELECT 'a' LIKE '%a'"  # without parameters nothing is written in


def test_a_kept_verdict_is_never_another_requests(ch_db: ChDatabase, tmp_path: Any) -> None:
    """A statement whose text ends as another request's parameters would be written out: the two are not
    one request for the verdicts kept, and the parameters are checked on every call, kept or not."""
    from rewardflow.clickhouse.readers import _sent

    guard = SqlGuard(lambda sql, p: [tuple(r) for r in ch_db.client.query(sql, parameters=dict(p)).result_rows], _sent)
    value = f" || 'x' AS p INTO OUTFILE '{tmp_path / 'written.txt'}' --"
    sql = "SELECT '%(x)s' AS c -- "
    with pytest.raises(ReadOnlyViolation, match="would be written into the statement"):
        guard.check(sql, {"x": value})
    guard.check(sql + "\0" + repr(("x", "str", value)))  # one comment: a read, kept
    for _ in range(2):
        with pytest.raises(ReadOnlyViolation, match="would be written into the statement"):
            guard.check(sql, {"x": value})
    guard.check("SELECT '%(x)s' AS c")  # kept without parameters ...
    with pytest.raises(ReadOnlyViolation, match="would be written into the statement"):
        guard.check("SELECT '%(x)s' AS c", {"x": value})  # ... refused with them
