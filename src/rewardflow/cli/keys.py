"""``rewardflow keys``: keys of the ingestion edge (create, list, revoke), kept hashed in ClickHouse.

A key is printed once, by ``create``; ``ingest_keys`` holds only its sha256. Each key belongs to one
org, and every event sent with it is that org's. A revoked key stops working at the edge within
``REWARDFLOW_COLLECT_KEY_REFRESH_S`` (2 s by default).

With the embedded chDB owned by a running ``rewardflow run``, the commands go through its read
endpoint with the owner's local token (only the same OS user can read it).

Exit codes: 0 done; 2 a fixable error, one ``error:`` line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rewardflow.clickhouse.connect import as_dsn, get_client, open_reader
from rewardflow.clickhouse.errors import ClickHouseError, clean_message, is_driver_error
from rewardflow.clickhouse.remote import RemoteReader
from rewardflow.collector.keys import IngestKeys, KeyInfo
from rewardflow.settings import load_settings

app = typer.Typer(no_args_is_help=True)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


class EndpointKeys:
    """The :class:`IngestKeys` operations through the chDB owner's read endpoint."""

    def __init__(self, reader: RemoteReader) -> None:
        self.reader = reader

    def create(self, org_id: str, name: str = "") -> tuple[KeyInfo, str]:
        doc = self.reader.manage_keys({"action": "create", "org": org_id, "name": name})
        secret = doc.pop("secret")
        return KeyInfo(**doc), secret

    def revoke(self, key_id: str) -> KeyInfo | None:
        doc = self.reader.manage_keys({"action": "revoke", "key_id": key_id})
        return KeyInfo(**doc) if doc else None

    def all(self) -> list[KeyInfo]:
        return [KeyInfo(**d) for d in self.reader.manage_keys({"action": "list"})]


@contextmanager
def _keys() -> Iterator[IngestKeys | EndpointKeys]:
    settings = load_settings()
    try:
        reader = open_reader(settings)
    except ClickHouseError as exc:
        raise _fail(str(exc)) from None
    if isinstance(reader, RemoteReader):
        try:
            yield EndpointKeys(reader)
        except ClickHouseError as exc:
            raise _fail(str(exc)) from None
        return
    reader.close()
    from rewardflow.clickhouse.migrate import ensure_database, migrate

    dsn = as_dsn(settings.dsn)
    try:  # the tables as `rewardflow run` makes them: keys are often the first thing made on a new machine
        ensure_database(dsn)
        client = get_client(dsn=dsn)
    except Exception as exc:
        if not is_driver_error(exc):
            raise
        raise _fail(clean_message(exc)) from None
    try:
        migrate(client, events_ttl_days=settings.events_ttl_days)
        yield IngestKeys(client)
    except ClickHouseError as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:
        if not is_driver_error(exc):
            raise
        raise _fail(clean_message(exc)) from None
    finally:
        client.close()


@app.command()
def create(
    org: Annotated[str, typer.Option("--org", help="The org every event sent with this key belongs to.")],
    name: Annotated[str, typer.Option("--name", help="A label (which editor fleet or agent holds it).")] = "",
) -> None:
    """Create a key and print it once (only its hash is stored)."""
    with _keys() as keys:
        try:
            info, secret = keys.create(org, name)
        except ValueError as exc:
            raise _fail(str(exc)) from None
    typer.echo(f"created key {info.key_id} of org {info.org_id}; it is shown only now:", err=True)
    typer.echo(secret)


@app.command("list")
def list_() -> None:
    """List the keys (ids, orgs, names, state; never the secrets)."""
    table = Table("id", "org", "name", "state", "changed")
    with _keys() as keys:
        for k in keys.all():
            table.add_row(k.key_id, k.org_id, k.name, "revoked" if k.revoked else "active", k.changed_at[:19])
    Console().print(table)


@app.command()
def revoke(key_id: Annotated[str, typer.Argument(help="The id shown by create and list.")]) -> None:
    """Revoke a key: the edge refuses it within its refresh interval."""
    with _keys() as keys:
        info = keys.revoke(key_id)
    if info is None:
        raise _fail(f"no key with id {key_id!r} (see `rewardflow keys list`)")
    typer.echo(f"revoked key {key_id} of org {info.org_id}")
