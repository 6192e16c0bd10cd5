"""Render :mod:`rewardflow.core.rows` (the record TypedDicts) from the table definitions.

A table's record columns (:attr:`~.columns.TableDef.record_columns`) are the
fields of the TypedDict its ``record`` names, in table order, each typed from
its ClickHouse type: ``String`` and ``LowCardinality(String)`` -> ``str``,
``(U)Int*`` -> ``int``, ``Float*`` -> ``float``, ``Map(K, V)`` ->
``dict[K, V]``. Tables that share a record name must agree on its columns.

Contract: pure functions of the definitions; :func:`render` raises
``ValueError`` naming the table and column for a type it cannot map.
:func:`check` raises :class:`RowTypesStale` when the generated module no longer
matches, and :func:`rewardflow.clickhouse.migrate.migrate` calls it before
touching a database.
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap

from rewardflow.clickhouse.columns import TableDef

_HEADER = '''"""Output record shapes of the pipeline, one TypedDict per table record. GENERATED from the table
definitions in ``rewardflow.clickhouse`` by ``rewardflow codegen``: do not edit.

These are the rows that travel on the output topics (orjson) and land in the ClickHouse tables,
field for column. Change a table's columns and run ``rewardflow codegen``; migrations refuse to
run while ``TABLES_DIGEST`` disagrees with the definitions.
"""

from __future__ import annotations

from typing import TypedDict
'''
_MAP = re.compile(r"^Map\((?P<k>[^,]+),\s*(?P<v>.+)\)$")


class RowTypesStale(RuntimeError):
    """``rewardflow.core.rows`` was generated from other table definitions."""


def py_type(ch_type: str, where: str) -> str:
    """The Python type of a ClickHouse column type."""
    inner = ch_type.removeprefix("LowCardinality(").removesuffix(")") if ch_type.startswith("LowCardinality(") else ch_type
    if inner == "String":
        return "str"
    if re.fullmatch(r"U?Int(8|16|32|64)", inner):
        return "int"
    if re.fullmatch(r"Float(32|64)", inner):
        return "float"
    m = _MAP.match(inner)
    if m:
        return f"dict[{py_type(m['k'].strip(), where)}, {py_type(m['v'].strip(), where)}]"
    raise ValueError(f"{where}: no Python type for ClickHouse type {ch_type!r}")


def records(tables: tuple[TableDef, ...]) -> dict[str, TableDef]:
    """The first table of each record name; raises ``ValueError`` if tables sharing one disagree."""
    seen: dict[str, TableDef] = {}
    for t in tables:
        if not t.record:
            continue
        first = seen.setdefault(t.record, t)
        cols = [(c.name, c.type) for c in t.columns if c.kind == "record"]
        if cols != [(c.name, c.type) for c in first.columns if c.kind == "record"]:
            raise ValueError(f"tables {first.name} and {t.name} share record {t.record} but not its columns")
    return seen


def tables_digest(tables: tuple[TableDef, ...]) -> str:
    """sha256 of every record's name, table doc and (column, type, doc) list."""
    spec = [(name, t.doc, [(c.name, c.type, c.doc) for c in t.columns if c.kind == "record"])
            for name, t in records(tables).items()]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()


def render(tables: tuple[TableDef, ...]) -> str:
    """The source text of ``rewardflow/core/rows.py``."""
    out = [_HEADER, f'TABLES_DIGEST = "{tables_digest(tables)}"']
    for name, t in records(tables).items():
        doc = textwrap.wrap(f"A row of ``{t.name}``: {t.doc}", 96)
        doc[0] = '"""' + doc[0]
        out += ["", "", f"class {name}(TypedDict):", *(f"    {line}" for line in doc), '    """', ""]
        for c in t.columns:
            if c.kind == "record":
                out += [f"    # {c.doc}", f"    {c.name}: {py_type(c.type, f'{t.name}.{c.name}')}"]
    return "\n".join(out) + "\n"


def check(tables: tuple[TableDef, ...]) -> None:
    """Raise :class:`RowTypesStale` unless ``rewardflow.core.rows`` was generated from ``tables``."""
    from rewardflow.core import rows

    if rows.TABLES_DIGEST != tables_digest(tables):
        raise RowTypesStale("the table definitions changed since rewardflow/core/rows.py was generated: "
                            "run `rewardflow codegen`")
