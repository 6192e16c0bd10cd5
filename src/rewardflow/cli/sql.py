"""``rewardflow sql "SELECT …"``: read-only analyst SQL against the reward tables.

Anything but one read statement (writes, ``INTO OUTFILE``, table functions that
reach files, URLs or other servers, ``SETTINGS``) is refused by ClickHouse's own
parser before it runs, and every query runs on a ``readonly = 1`` connection with
the read limits. Works while the pipeline runs: with chDB, a busy directory is
read through its owner's endpoint (with ``REWARDFLOW_READ_TOKEN``, or the owner's
local token file). Exit codes: 0 done; 2 refused, bad query or database
unavailable, always one ``error:`` line on stderr (ClickHouse's own message
for a bad query), never a traceback.
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated

import typer
from rich.console import Console

from rewardflow.clickhouse.connect import open_reader
from rewardflow.clickhouse.errors import ClickHouseError, clean_message, is_driver_error
from rewardflow.clickhouse.readonly import ReadOnlyViolation
from rewardflow.clickhouse.render import write_csv, write_json, write_table
from rewardflow.settings import load_settings


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def command(
    query: Annotated[str, typer.Argument(help="One read-only statement (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, EXISTS).")],
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    database: Annotated[str | None, typer.Option("--database", help="Database (default: the DSN's).")] = None,
) -> None:
    """Run one read-only SQL statement and print the result."""
    settings = load_settings()
    try:
        reader = open_reader(settings, database=database)
    except ClickHouseError as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:
        if not is_driver_error(exc):
            raise
        raise _fail(f"cannot connect to ClickHouse: {clean_message(exc)}") from None
    try:
        table = reader.query_arrow(query)
    except (ClickHouseError, ReadOnlyViolation) as exc:
        raise _fail(str(exc)) from None
    finally:
        reader.close()
    if format is Format.json:
        write_json(table, sys.stdout)
    elif format is Format.csv:
        write_csv(table, sys.stdout)
    else:
        write_table(table, Console())
