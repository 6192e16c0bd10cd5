"""``rewardflow codegen [--check]``: regenerate the modules derived from the contracts.

* ``rewardflow/events/models.py``: the pydantic event models, from ``schemas/*.avsc``;
* ``rewardflow/core/rows.py``: the record TypedDicts, from the ClickHouse table definitions;
* ``clients/typescript/src/events.ts``: the TypeScript client's event types, from ``schemas/*.avsc``.

Run it after changing a schema or a table. ``--check`` writes nothing and exits 1 when a
generated module is stale (the README test command runs it before type-checking).

Exit codes: 0 up to date (or written); 1 stale under ``--check``; 2 a schema or table that
cannot be rendered, one ``error:`` line naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rewardflow.clickhouse import rowtypes
from rewardflow.clickhouse.catalog import ALL_TABLES
from rewardflow.events import codegen as event_codegen
from rewardflow.events import tscodegen
from rewardflow.events.catalogue import schema_dir

_PACKAGE = Path(__file__).resolve().parents[1]
_ROOT = _PACKAGE.parents[1]  # the repository: src/rewardflow/../..


def targets() -> dict[Path, str]:
    """Each generated module's path and the text it must hold now."""
    return {
        _PACKAGE / "events" / "models.py": event_codegen.render(event_codegen.load_sources(schema_dir())),
        _PACKAGE / "core" / "rows.py": rowtypes.render(ALL_TABLES),
        _ROOT / "clients" / "typescript" / "src" / "events.ts": tscodegen.render(event_codegen.load_sources(schema_dir())),
    }


def command(
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if a generated module is stale.")] = False,
) -> None:
    """Regenerate the event models (from schemas/) and the row types (from the table definitions)."""
    try:
        wanted = targets()
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    stale = [path for path, text in wanted.items() if not path.is_file() or path.read_text() != text]
    for path in stale:
        shown = path.relative_to(_ROOT)
        if check:
            typer.echo(f"stale: {shown} (run `rewardflow codegen`)", err=True)
        else:
            path.write_text(wanted[path])
            typer.echo(f"wrote {shown}")
    if check and stale:
        raise typer.Exit(1)
    if not stale:
        typer.echo("generated modules are up to date")
