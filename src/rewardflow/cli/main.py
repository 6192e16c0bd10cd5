"""The ``rewardflow`` console script: one Typer app, one module per command group.

Every command has ``--help``. Errors that a user can fix are printed as one
clear line on stderr with exit code 2; tracebacks are reserved for bugs.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

app = typer.Typer(
    name="rewardflow",
    help="Self-hosted feedback and reward platform for real-time RL of coding agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version

        typer.echo(f"rewardflow {version('rewardflow')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the installed version and exit."),
) -> None:
    """(Keeps ``rewardflow <command>`` a group when one command is mounted: see :func:`_mount`.)"""


# (module under rewardflow.cli, how it is mounted). Groups are Typer sub-apps
# exposed as ``app``; single commands expose a function named ``command``.
_GROUPS = {
    "kafka": "Run a real local Apache Kafka broker (dev and tests).",
    "db": "ClickHouse schema: migrate and inspect.",
    "rewards": "Reward specs: list, check and replay.",
    "tokens": "Bearer tokens of the read endpoint: create, list, revoke.",
    "keys": "Keys of the ingestion edge: create, list, revoke.",
    "checkpoints": "The checkpoint registry behind policy lineage: register, list.",
}
_COMMANDS = ["emit", "sql", "export", "run", "simulate", "demo", "compare", "audit", "alerts", "bench", "codegen", "collect"]


def _mount(argv: list[str]) -> None:
    """Mount the command ``argv`` names, or every command when it names none (``--help``, a typo).

    Importing every command's module takes ~0.6 s (the engine, Arrow, Faust's dependencies); a
    command mounted alone starts sooner (``rewardflow run`` spawns its workers that much earlier).
    """
    named = argv[1] if len(argv) > 1 else ""
    if named == "--version":  # (answered by the root callback before any command is looked up)
        return
    only = named if named in _GROUPS or named in _COMMANDS else None
    for name, help_text in _GROUPS.items():
        if only in (None, name):
            mod = importlib.import_module(f"rewardflow.cli.{name}")
            app.add_typer(mod.app, name=name, help=help_text)
    for name in _COMMANDS:
        if only in (None, name):
            mod = importlib.import_module(f"rewardflow.cli.{name}")
            app.command(name=name)(mod.command)


_mount(sys.argv)


def main() -> None:
    """Entry point: run the app; every error reaches the user as one ``error:`` line, never a traceback
    (``REWARDFLOW_DEBUG=1`` shows the traceback of an unexpected one)."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - every error is one line (the types are imported only then)
        from rewardflow.clickhouse.dsn import DsnError
        from rewardflow.clickhouse.errors import ClickHouseError
        from rewardflow.settings import SettingsError

        if isinstance(exc, SettingsError):
            typer.echo(f"error: {exc}", err=True)
            sys.exit(2)
        if isinstance(exc, DsnError):  # (parsed where the DSN is first used)
            typer.echo(f"error: invalid configuration: REWARDFLOW_CLICKHOUSE_DSN: {exc}", err=True)
            sys.exit(2)
        if isinstance(exc, ClickHouseError):  # unavailable, busy, refused (a retention change that would delete rows)
            typer.echo(f"error: {exc}", err=True)
            sys.exit(2)
        if os.environ.get("REWARDFLOW_DEBUG", "") not in ("", "0"):
            raise
        message = " ".join(str(exc).split())[:500] or "(no message)"
        typer.echo(f"error: {type(exc).__name__}: {message} (REWARDFLOW_DEBUG=1 shows where)", err=True)
        sys.exit(1)
