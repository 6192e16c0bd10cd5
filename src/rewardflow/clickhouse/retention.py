"""Retention changes that never delete stored rows silently.

A table whose TTL follows ``events_ttl_days`` keeps each row that many days after it was *inserted*
(``_inserted_at``), so a backfill of old events is kept as long as fresh data. When the configured
retention differs from the table's, :func:`plan` counts the stored rows the new TTL would delete now
(rows the current TTL has already expired are not counted: they go either way). :func:`apply`
refuses a change that would delete rows unless the caller confirms it, and reports what it deleted.

Contract: blocking calls on one client; :class:`RetentionRefused` names the table, the row count
and how to confirm; nothing is altered before the count is known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clickhouse_connect.driver.client import Client

from rewardflow.clickhouse.columns import TableDef
from rewardflow.clickhouse.ddl import quote_ident, ttl_clause
from rewardflow.clickhouse.errors import ClickHouseError

CONFIRM = "rewardflow db migrate --allow-data-loss"
_DAYS = re.compile(r"(?:INTERVAL (\d+) DAY|toIntervalDay\((\d+)\))")
_TTL = re.compile(r"\bTTL (.+?)(?: SETTINGS |$)", re.S)


class RetentionRefused(ClickHouseError):
    """A migration would delete stored rows and was not confirmed."""


@dataclass(frozen=True)
class RetentionPlan:
    """One table's TTL change: the expression now, the one wanted, and the rows it would delete now."""

    table: TableDef
    current: str  # the table's TTL expression as ClickHouse shows it ('' = none)
    wanted: str
    doomed: int

    def describe(self) -> str:
        days = _DAYS.search(self.current)
        was = f"{days.group(1) or days.group(2)} days" if days else "no TTL"
        basis = " from event time" if "_inserted_at" not in self.current and self.current else ""
        return f"{self.table.name}: retention {was}{basis} -> {self.wanted}"


def current_ttl(client: Client, table: TableDef) -> str:
    """The TTL expression of ``table`` in the client's database ('' when it has none)."""
    rows = client.query(
        "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() AND name = {t:String}",
        parameters={"t": table.name},
    ).result_rows
    query = str(rows[0][0]) if rows else ""
    found = _TTL.search(query)
    return found.group(1).strip() if found else ""


def _same(current: str, wanted: str) -> bool:
    days = _DAYS.search(current), _DAYS.search(wanted)
    if days[0] is None or days[1] is None:
        return False
    same_days = (days[0].group(1) or days[0].group(2)) == (days[1].group(1) or days[1].group(2))
    return same_days and ("_inserted_at" in current) == ("_inserted_at" in wanted)


def plan(client: Client, table: TableDef, events_ttl_days: int) -> RetentionPlan | None:
    """The change ``table`` needs to follow ``events_ttl_days``, or None if it follows it already."""
    wanted = ttl_clause(table, events_ttl_days)
    current = current_ttl(client, table)
    if _same(current, wanted):
        return None
    kept_now = f"NOT (({current}) <= now())" if current else "1"
    doomed = int(str(client.command(
        f"SELECT count() FROM {quote_ident(table.name)} WHERE ({wanted}) <= now() AND {kept_now}"
    )))
    return RetentionPlan(table, current, wanted, doomed)


def apply(client: Client, change: RetentionPlan, *, allow_data_loss: bool) -> int:
    """Set the wanted TTL; returns the rows it deleted. Raises :class:`RetentionRefused` (altering
    nothing) when rows would be deleted and ``allow_data_loss`` is false."""
    if change.doomed and not allow_data_loss:
        raise RetentionRefused(
            f"{change.describe()} would delete {change.doomed:,} stored rows; keep the current retention "
            f"(REWARDFLOW_EVENTS_TTL_DAYS) or confirm with `{CONFIRM}`"
        )
    name = quote_ident(change.table.name)
    before = int(str(client.command(f"SELECT count() FROM {name}")))
    client.command(f"ALTER TABLE {name} MODIFY TTL {change.wanted}", settings={"mutations_sync": 2})
    if change.doomed:
        client.command(f"ALTER TABLE {name} MATERIALIZE TTL", settings={"mutations_sync": 2})
    return before - int(str(client.command(f"SELECT count() FROM {name}")))
