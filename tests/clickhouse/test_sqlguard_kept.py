"""The guard's kept verdicts, over a stand-in parser (the guard's answers on the real engine: test_sqlguard.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from rewardflow.clickhouse.readonly import ReadOnlyViolation
from rewardflow.clickhouse.sqlguard import SqlGuard


class Parser:
    """Answers formatQuery with the statement itself and EXPLAIN AST with a read's root; counts the questions."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        self.asked += 1
        if sql.startswith("SELECT formatQuery"):
            return [(params["q"],)]
        if sql.startswith("EXPLAIN AST"):
            return [("SelectWithUnionQuery (children 1)",)]
        return [("numbers",)]  # system.table_functions


def test_parameters_that_cannot_be_written_out_are_checked_every_time() -> None:
    parser = Parser()
    guard = SqlGuard(parser)
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    for params in ({"v": deep}, {"v": deep}, {"n": 10**5000}, {"n": 10**5000}):  # (repr: RecursionError, ValueError)
        guard.check("SELECT 1", params)
    assert parser.asked == 4 * 2 + 1  # formatQuery and EXPLAIN each time (and the table functions once)


def test_a_long_statement_is_checked_every_time() -> None:
    parser = Parser()
    guard = SqlGuard(parser)
    long_sql = "SELECT 1 " + " " * 20_000
    guard.check(long_sql)
    asked = parser.asked
    guard.check(long_sql)
    assert parser.asked == asked + 2
    guard.check("SELECT 2")
    asked = parser.asked
    guard.check("SELECT 2")
    assert parser.asked == asked


def test_parameters_of_other_types_are_other_requests() -> None:
    parser = Parser()
    guard = SqlGuard(parser)
    guard.check("SELECT {x:String}", {"x": "1"})
    asked = parser.asked
    guard.check("SELECT {x:String}", {"x": 1})
    assert parser.asked == asked + 2


def test_a_refusal_from_a_kept_statement_s_neighbour_is_not_taken_from_it() -> None:
    parser = Parser()
    guard = SqlGuard(parser)
    guard.check("SELECT 1")
    with pytest.raises(ReadOnlyViolation, match="INTO OUTFILE"):
        guard.check("SELECT 1 INTO OUTFILE 'x'")


def test_no_statement_and_parameters_share_another_pairs_key() -> None:
    from rewardflow.clickhouse.sqlguard import _request_key

    sql, value = "SELECT '%(x)s' -- ", " INTO OUTFILE 'f' --"
    assert _request_key(sql, {"x": value}) != _request_key(sql + "\0" + repr(("x", "str", value)), {})
    assert _request_key("ab", {}) != _request_key("a", {"b": ""})
    assert _request_key("SELECT {x:String}", {"x": "a"}) == _request_key("SELECT {x:String}", {"x": "a"})
