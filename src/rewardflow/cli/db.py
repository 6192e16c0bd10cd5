"""Placeholder, replaced by its owner."""

import typer

app = typer.Typer(no_args_is_help=True)
