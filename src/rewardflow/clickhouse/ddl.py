"""Render ``CREATE`` statements from :class:`~.columns.TableDef` objects. Pure.

Every statement is idempotent (``IF NOT EXISTS``) so a migration that died
half-way can simply run again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rewardflow.clickhouse.columns import TableDef

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def quote_ident(name: str) -> str:
    """Backquote an identifier; raises ``ValueError`` for anything but ``[A-Za-z_][A-Za-z0-9_]*``."""
    if not _IDENT.match(name):
        raise ValueError(f"not a plain identifier: {name!r}")
    return f"`{name}`"


def setting_value(value: str | int) -> str:
    """A table setting's value as SQL, and as ``SHOW CREATE TABLE`` shows it."""
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "\\'") + "'"


def ttl_clause(table: TableDef, events_ttl_days: int) -> str:
    """The rendered TTL expression of ``table`` ('' when it has none)."""
    return table.ttl.format(events_ttl_days=events_ttl_days) if table.ttl else ""


def create_table(table: TableDef, *, events_ttl_days: int = 90, projections: bool = True,
                 merge_settings: bool = True, exists_ok: bool = True) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for ``table`` in the current database (``exists_ok=False``:
    ``CREATE TABLE``, which fails when the table exists).

    ``projections=False`` leaves out the table's projections and the settings they need
    (migration 1 created the tables before any projection existed; :func:`add_projection`
    adds them to such a table). ``merge_settings=False`` leaves out ``table.merge_settings``
    (migration 1 created the tables before them; :func:`modify_settings` gives them later).
    """
    projs = table.projections if projections else ()
    clauses = [c.ddl() for c in table.columns] + [f"PROJECTION {p.ddl()}" for p in projs]
    cols = ",\n    ".join(clauses)
    create = "CREATE TABLE IF NOT EXISTS" if exists_ok else "CREATE TABLE"
    parts = [f"{create} {quote_ident(table.name)}\n(\n    {cols}\n)", f"ENGINE = {table.engine}"]
    if table.partition_by:
        parts.append(f"PARTITION BY {table.partition_by}")
    parts.append(f"ORDER BY {table.order_by}")
    ttl = ttl_clause(table, events_ttl_days)
    if ttl:
        parts.append(f"TTL {ttl}")
    settings = table.table_settings(projections=projections, merge=merge_settings)
    if settings:
        parts.append("SETTINGS " + ", ".join(f"{k} = {setting_value(v)}" for k, v in settings.items()))
    return "\n".join(parts)


def add_projection(table: TableDef, name: str, settings: Mapping[str, str | int] | None = None) -> list[str]:
    """Idempotent statements that give an existing ``table`` its projection ``name``.

    The table settings the projection needs (``settings``, default the projection's own), ``ADD
    PROJECTION IF NOT EXISTS``, then :func:`materialize_projection`.
    """
    proj = next(p for p in table.projections if p.name == name)
    wanted = proj.table_settings if settings is None else settings
    out = [modify_settings(table, wanted)] if wanted else []
    out.append(f"ALTER TABLE {quote_ident(table.name)} ADD PROJECTION IF NOT EXISTS {proj.ddl()}")
    out.append(materialize_projection(table, name))
    return out


def modify_settings(table: TableDef, settings: Mapping[str, str | int]) -> str:
    """``ALTER TABLE … MODIFY SETTING`` giving ``table`` these table settings (idempotent)."""
    rendered = ", ".join(f"{k} = {setting_value(v)}" for k, v in settings.items())
    return f"ALTER TABLE {quote_ident(table.name)} MODIFY SETTING {rendered}"


def materialize_projection(table: TableDef, name: str) -> str:
    """``MATERIALIZE PROJECTION``: a mutation that builds projection ``name`` for the parts stored
    without it, in the background. Until it is done, reads are still correct; they only read those
    parts the slow way."""
    return f"ALTER TABLE {quote_ident(table.name)} MATERIALIZE PROJECTION {quote_ident(name)}"


def modify_columns(table: TableDef, names: tuple[str, ...]) -> list[str]:
    """``ALTER TABLE … MODIFY COLUMN`` giving each named column of an existing ``table`` its type in the
    definition (idempotent: a column of that type already is left as it is)."""
    cols = {c.name: c for c in table.columns}
    return [f"ALTER TABLE {quote_ident(table.name)} MODIFY COLUMN {quote_ident(n)} {cols[n].type}" for n in names]


def create_database(name: str) -> str:
    """``CREATE DATABASE IF NOT EXISTS``."""
    return f"CREATE DATABASE IF NOT EXISTS {quote_ident(name)}"


def drop_database(name: str) -> str:
    """``DROP DATABASE IF EXISTS … SYNC`` (without SYNC, dropped data lingers for minutes)."""
    return f"DROP DATABASE IF EXISTS {quote_ident(name)} SYNC"
