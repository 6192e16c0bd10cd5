"""SQL of the trainer pull: cursor lookup, settled horizon, filtered rewards. Pure builders.

All values travel as ClickHouse ``{name:Type}`` parameters, never pasted into
SQL text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rewardflow.clickhouse.readers import Reader
from rewardflow.clickhouse.tables import REWARDS

RECORD_COLUMNS = REWARDS.record_columns
SELECT_COLUMNS = ", ".join(f"`{c}`" for c in (*RECORD_COLUMNS, "_seq"))
_FILTER_COLUMNS = ("checkpoint_id", "spec_version", "surface", "experiment_arm")


def horizon_sql() -> str:
    """The Snowflake id of ``now - {ms}`` on the server's clock (the read horizon)."""
    return "SELECT dateTime64ToSnowflakeID(now64(3) - toIntervalMillisecond({ms:UInt64})) AS horizon"


def cursor_of(reader: Reader, trainer: str) -> int:
    """The trainer's latest committed cursor, 0 if none."""
    table = reader.query_arrow(
        "SELECT argMax(cursor, _seq) AS c, count() AS n FROM trainer_cursors WHERE trainer = {t:String}",
        {"t": trainer},
    )
    return int(table.column("c")[0].as_py()) if table.column("n")[0].as_py() else 0


def where_clause(filters: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``WHERE``-able conditions and parameters for the reader's filters.

    ``checkpoint_ids`` (a list, possibly empty) keeps only rows of those checkpoints; the reader
    computes it from the checkpoint registry for ``max_policy_lag``."""
    conds: list[str] = []
    params: dict[str, Any] = {}
    for col in _FILTER_COLUMNS:
        if filters.get(col) is not None:
            conds.append(f"{col} = {{{col}:String}}")
            params[col] = filters[col]
    if filters.get("checkpoint_ids") is not None:
        conds.append("checkpoint_id IN {checkpoint_ids:Array(String)}")
        params["checkpoint_ids"] = list(filters["checkpoint_ids"])
    if filters.get("only_final", True):
        conds.append("provisional = 0")
    return " AND ".join(conds), params


_WINDOW = "_seq > {after:UInt64} AND _seq <= {upto:UInt64}"


def rewards_sql(filters: Mapping[str, Any], after: int, upto: int) -> tuple[str, dict[str, Any]]:
    """Rows of ``rewards FINAL`` with ``after < _seq <= upto`` matching ``filters``, ordered by ``_seq``.

    Same rows as ``SELECT … FROM rewards FINAL WHERE … ORDER BY _seq``, but the ``FINAL``
    merge does not carry the wide columns (maps above all): it runs in a subquery over the
    key, version and filter columns only and yields the ``_seq`` of the surviving rows; the
    outer read (no FINAL) keeps exactly the rows with those ``_seq`` values. That is exact
    because a row's ``_seq`` is unique and a merge never changes it. The outer read comes
    from the projection ``by_seq`` (the rows sorted by ``_seq``), so ``ORDER BY _seq`` is a
    merge of sorted parts, not a sort of the wide rows (which was 80-90% of an export).
    The subquery is never skipped: ``by_seq`` keeps the copies merges removed from the table
    (:data:`~rewardflow.clickhouse.tables.BY_SEQ`), so no count of the table alone can tell
    that the outer read would meet no duplicate.
    """
    cond, params = where_clause(filters)
    extra = f" AND {cond}" if cond else ""
    keep = f" AND _seq IN (SELECT _seq FROM rewards FINAL WHERE {_WINDOW}{extra})"
    sql = f"SELECT {SELECT_COLUMNS} FROM rewards WHERE {_WINDOW}{keep} ORDER BY _seq"
    return sql, {**params, "after": after, "upto": upto}


def spec_versions_sql(filters: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The reward spec versions of the rows matching ``filters``, at any position, in order."""
    cond, params = where_clause(filters)
    return f"SELECT DISTINCT spec_version FROM rewards{f' WHERE {cond}' if cond else ''} ORDER BY spec_version", params


def spec_known_sql(version: str) -> tuple[str, dict[str, Any]]:
    """One row when ``version`` is a registered reward spec or scored any stored row, none otherwise."""
    sql = ("SELECT 1 FROM (SELECT version FROM reward_specs WHERE version = {v:String} LIMIT 1 "
           "UNION ALL SELECT spec_version FROM rewards WHERE spec_version = {v:String} LIMIT 1) LIMIT 1")
    return sql, {"v": version}


def checkpoint_known_sql(checkpoint_id: str) -> tuple[str, dict[str, Any]]:
    """One row when ``checkpoint_id`` is registered (``rewardflow checkpoints``) or served any stored reward, none
    otherwise."""
    sql = ("SELECT 1 FROM (SELECT checkpoint_id FROM checkpoints WHERE checkpoint_id = {c:String} LIMIT 1 "
           "UNION ALL SELECT checkpoint_id FROM rewards WHERE checkpoint_id = {c:String} LIMIT 1) LIMIT 1")
    return sql, {"c": checkpoint_id}


def count_sql(filters: Mapping[str, Any], after: int) -> tuple[str, dict[str, Any]]:
    """How many rows an export after ``after`` would return (for progress bars)."""
    cond, params = where_clause(filters)
    extra = f" AND {cond}" if cond else ""
    return f"SELECT count() AS n FROM rewards FINAL WHERE _seq > {{after:UInt64}}{extra}", {**params, "after": after}
