"""``rewardflow tokens``: bearer tokens of the read endpoint (create, list, revoke).

Tokens live hashed in ``$REWARDFLOW_HOME/read-tokens.json``; the endpoint reads
the file again when it changes, so a revoked token stops working at once. A
token is printed once, by ``create``; nothing else ever shows it.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rewardflow.readapi.tokens import ROLES, TokenError, TokenStore
from rewardflow.settings import load_settings

app = typer.Typer(no_args_is_help=True)


def _store() -> TokenStore:
    return TokenStore(load_settings().home)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@app.command()
def create(
    role: Annotated[str, typer.Option(help=f"{' | '.join(ROLES)}: analysts query; a trainer also moves its own cursor.")],
    trainer: Annotated[str | None, typer.Option(help="The trainer whose cursor a trainer token may move.")] = None,
    name: Annotated[str, typer.Option(help="A label for the list (who or what holds it).")] = "",
) -> None:
    """Create a token and print it once (only its hash is kept)."""
    try:
        grant, token = _store().create(role, name, trainer)
    except TokenError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"created token {grant.token_id} ({grant.role}{f' of {grant.trainer}' if grant.trainer else ''}); "
               "it is shown only now:", err=True)
    typer.echo(token)


@app.command("list")
def list_() -> None:
    """List the tokens (ids, roles, names; never the tokens)."""
    table = Table("id", "role", "trainer", "name", "created", "revoked")
    for g in _store().list():
        table.add_row(g.token_id, g.role, g.trainer or "", g.name, _when(g.created_at),
                      _when(g.revoked_at) if g.revoked_at else "")
    Console().print(table)


@app.command()
def revoke(token_id: Annotated[str, typer.Argument(help="The id shown by create and list.")]) -> None:
    """Revoke a token: the endpoint refuses it from its next request on."""
    try:
        grant = _store().revoke(token_id)
    except TokenError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"revoked token {grant.token_id} ({grant.role})", err=True)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""
