"""``rewardflow checkpoints``: the checkpoint registry behind policy lineage (register, list).

``register ID`` records which checkpoint ID was trained from (``--parent``, registered first) and
when it started serving (``--deployed-at``: ISO-8601 or epoch ms; default now, or the registered
time when ID is registered already). Registering again with the same parent and time does nothing;
another lineage is refused. ``list`` prints every checkpoint with its generation, deployment time,
age and lag behind the newest generation (``--json``: the same as JSON).

With the embedded chDB owned by a running ``rewardflow run``, ``register`` goes through its read
endpoint with the owner's local token (only the same OS user can read it), and ``list`` reads
through it like any reader.

Exit codes: 0 done; 2 a fixable error, one ``error:`` line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.table import Table

from rewardflow.clickhouse.connect import as_dsn, get_client, open_reader
from rewardflow.clickhouse.errors import ClickHouseError, WriteRefused, clean_message, is_driver_error
from rewardflow.clickhouse.readers import Reader
from rewardflow.clickhouse.remote import RemoteReader
from rewardflow.lineage.registry import Checkpoint, LineageError, Registry, iso_ms, parse_time
from rewardflow.lineage.store import CheckpointStore, load_registry
from rewardflow.settings import Settings, load_settings

app = typer.Typer(no_args_is_help=True)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


class EndpointCheckpoints:
    """:meth:`CheckpointStore.register` through the chDB owner's read endpoint."""

    def __init__(self, reader: RemoteReader) -> None:
        self.reader = reader

    def register(self, checkpoint_id: str, parent_id: str = "", deployed_at_ms: int | None = None,
                 note: str = "") -> tuple[Checkpoint, bool]:
        body = {"action": "register", "checkpoint_id": checkpoint_id, "parent_id": parent_id,
                "deployed_at_ms": deployed_at_ms, "note": note}
        try:
            doc = self.reader.manage_checkpoints(body)
        except WriteRefused as exc:
            raise LineageError(str(exc)) from None
        return Checkpoint(**doc["checkpoint"]), bool(doc["created"])


def _driver_failure(exc: Exception, what: str = "") -> typer.Exit:
    """A clickhouse-connect error as one ``error:`` line; anything else is re-raised (a bug)."""
    if not is_driver_error(exc):
        raise exc
    return _fail(f"{what}{clean_message(exc)}")


def _open(settings: Settings) -> Reader:
    """A reader as :func:`open_reader` picks it; a failure is one ``error:`` line (exit 2)."""
    try:
        return open_reader(settings)
    except ClickHouseError as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:
        raise _driver_failure(exc, "cannot connect to ClickHouse: ") from None


@contextmanager
def _registrar() -> Iterator[CheckpointStore | EndpointCheckpoints]:
    settings = load_settings()
    reader = _open(settings)
    if isinstance(reader, RemoteReader):
        try:
            yield EndpointCheckpoints(reader)
        except ClickHouseError as exc:
            raise _fail(str(exc)) from None
        return
    reader.close()
    try:
        client = get_client(dsn=as_dsn(settings.dsn))
    except Exception as exc:
        raise _driver_failure(exc, "cannot connect to ClickHouse: ") from None
    try:
        yield CheckpointStore(client)
    except Exception as exc:
        raise _driver_failure(exc) from None
    finally:
        client.close()


def _registry() -> Registry:
    reader = _open(load_settings())
    try:
        return load_registry(reader)
    except ClickHouseError as exc:
        raise _fail(str(exc)) from None
    finally:
        reader.close()


@app.command()
def register(
    checkpoint_id: Annotated[str, typer.Argument(metavar="ID", help="The checkpoint, as InferenceServed names it.")],
    parent: Annotated[str, typer.Option(
        "--parent", help="The registered checkpoint it was trained from (none: a root).")] = "",
    deployed_at: Annotated[str | None, typer.Option(
        "--deployed-at", help="When it started serving: ISO-8601 (UTC if no offset) or epoch ms. "
                              "Default: now (for an ID registered already: its registered time).")] = None,
    note: Annotated[str, typer.Option("--note", help="Free text (run name, data mix, ...).")] = "",
) -> None:
    """Register a checkpoint with its parent and deployment time (a lineage never changes)."""
    try:
        when = parse_time(deployed_at) if deployed_at is not None else None
        with _registrar() as registrar:
            checkpoint, created = registrar.register(checkpoint_id, parent, when, note)
    except LineageError as exc:
        raise _fail(str(exc)) from None
    what = (f"generation {checkpoint.generation}, parent {checkpoint.parent_id or '(none)'}, "
            f"deployed {iso_ms(checkpoint.deployed_at_ms)}")
    typer.echo(f"registered {checkpoint.checkpoint_id}: {what}" if created
               else f"{checkpoint.checkpoint_id} is registered already, identically: {what}")


@app.command("list")
def list_(json_out: Annotated[bool, typer.Option("--json", help="Print a JSON array instead of a table.")] = False) -> None:
    """List the registered checkpoints by generation: parent, deployment time, age and lag."""
    registry = _registry()
    now_ms = int(time.time() * 1000)
    if json_out:
        doc = [{**asdict(c), "deployed_at": iso_ms(c.deployed_at_ms), "age_s": (now_ms - c.deployed_at_ms) / 1000,
                "lag": registry.lag(c.checkpoint_id)} for c in registry.ordered()]
        typer.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return
    table = Table("id", "parent", "generation", "deployed_at", "age", "lag", "note")
    for c in registry.ordered():
        table.add_row(c.checkpoint_id, c.parent_id, str(c.generation), iso_ms(c.deployed_at_ms)[:19] + "Z",
                      age_text(now_ms - c.deployed_at_ms), str(registry.lag(c.checkpoint_id)), c.note)
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def age_text(ms: int) -> str:
    """A duration for people: ``45s``, ``12m``, ``5h 03m``, ``3d 04h``; ``in …`` when negative."""
    if ms < 0:
        return "in " + age_text(-ms)
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86_400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86_400}d {s % 86_400 // 3600:02d}h"
