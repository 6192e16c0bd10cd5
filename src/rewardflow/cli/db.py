"""``rewardflow db migrate | describe``: the ClickHouse schema.

* ``migrate``: create or upgrade the configured database (idempotent; see
  :mod:`rewardflow.clickhouse.migrate`). With chDB it needs to own the
  directory, so run it while the worker is stopped (the worker migrates at
  start anyway).
* ``describe [TABLE]``: every table and column with its documentation, from
  the definitions (no database needed); ``--markdown`` prints docs/tables.md;
  ``--live`` adds row counts and applied migrations from the database.

Exit codes: 0 done; 2 a fixable error, one ``error:`` line on stderr.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rewardflow.clickhouse.catalog import ALL_TABLES, table
from rewardflow.clickhouse.columns import TableDef
from rewardflow.clickhouse.connect import as_dsn, get_client, open_reader
from rewardflow.clickhouse.describe import markdown, table_markdown
from rewardflow.clickhouse.errors import ClickHouseError, clean_message, is_driver_error
from rewardflow.clickhouse.migrate import ensure_database
from rewardflow.clickhouse.migrate import migrate as run_migrations
from rewardflow.clickhouse.retention import RetentionRefused
from rewardflow.settings import load_settings

app = typer.Typer(help="ClickHouse schema: migrate and inspect.", no_args_is_help=True, add_completion=False)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@app.command()
def migrate(
    database: Annotated[str | None, typer.Option("--database", help="Database to migrate (default: the DSN's).")] = None,
    allow_data_loss: Annotated[bool, typer.Option(
        "--allow-data-loss", help="Apply a retention change even though it deletes stored rows (they are counted first).")] = False,
) -> None:
    """Create or upgrade the tables and views (safe to run again: it refuses to delete stored rows unless told)."""
    settings = load_settings()
    dsn = as_dsn(settings.dsn).with_database(database)
    try:
        ensure_database(dsn)
        client = get_client(dsn=dsn)
        report = run_migrations(client, events_ttl_days=settings.events_ttl_days, allow_data_loss=allow_data_loss)
        client.close()
    except RetentionRefused as exc:
        raise _fail(str(exc)) from None
    except ClickHouseError as exc:
        raise _fail(f"{exc} (stop it first: migrations need to own a chDB directory)") from None
    except Exception as exc:
        if not is_driver_error(exc):
            raise
        raise _fail(f"migration failed on {dsn.masked()}: {clean_message(exc)}") from None
    applied = ", ".join(map(str, report.applied)) or "none"
    ttl = "; ".join(f"retention of {name} set to {settings.events_ttl_days} days after insertion, {n:,} rows deleted"
                    for name, n in report.deleted.items())
    restored = f"; settings of {', '.join(report.settings_restored)} restored" if report.settings_restored else ""
    how = " (a fresh database: its tables created as defined now)" if report.fresh else ""
    typer.echo(f"database {report.database} at {dsn.masked()}: applied migrations {applied}{how}; "
               f"already applied {len(report.already)}{restored}" + (f"; {ttl}" if ttl else ""))


def _rich_table(t: TableDef, counts: dict[str, int]) -> Table:
    title = f"{t.name}  ({t.engine}, order by {t.order_by})" + (f"  rows: {counts[t.name]:,}" if t.name in counts else "")
    view = Table(title=title, title_justify="left")
    view.add_column("column", no_wrap=True)
    view.add_column("type", no_wrap=True)
    view.add_column("filled by")
    view.add_column("description", ratio=1)
    for c in t.columns:
        view.add_row(c.name, c.type, c.kind if c.kind != "sink" else f"DEFAULT {c.expr}", c.doc)
    return view


@app.command()
def describe(
    name: Annotated[str | None, typer.Argument(help="One table (default: all).")] = None,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="Print Markdown (the content of docs/tables.md).")] = False,
    live: Annotated[bool, typer.Option("--live", help="Add row counts from the configured database.")] = False,
) -> None:
    """Document every table and column (from the definitions)."""
    settings = load_settings()
    try:
        tables = [table(name)] if name else list(ALL_TABLES)
    except KeyError as exc:
        raise _fail(str(exc.args[0])) from None
    if as_markdown:
        typer.echo(table_markdown(tables[0], settings.events_ttl_days) if name else markdown(settings.events_ttl_days), nl=False)
        return
    counts: dict[str, int] = {}
    if live:
        try:
            reader = open_reader(settings)
            result = reader.query_arrow("SELECT name, total_rows FROM system.tables WHERE database = currentDatabase()")
            reader.close()
        except ClickHouseError as exc:
            raise _fail(str(exc)) from None
        counts = {n: int(r or 0) for n, r in zip(result.column("name").to_pylist(), result.column("total_rows").to_pylist())}
    console = Console()
    for t in tables:
        console.print(t.doc, style="bold")
        console.print(_rich_table(t, counts))
