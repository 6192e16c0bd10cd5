"""``rewardflow kafka up | down | status``: the project's local Apache Kafka broker.

The broker listens on the port of ``REWARDFLOW_KAFKA_BOOTSTRAP`` when that is one loopback
address (default ``127.0.0.1:19092``), its controller on the next port. Options override settings
(``REWARDFLOW_LOCAL_KAFKA_PORT``, ``…_CONTROLLER_PORT``, ``REWARDFLOW_PARTITIONS``,
``REWARDFLOW_HOME``). The broker's data lives in
``<home>/kafka/data-<port>``, so ``--port`` also selects which broker
``down`` and ``status`` address. User-fixable failures print one line on
stderr and exit with code 2.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from rewardflow.kafka_local import KAFKA_VERSION, BrokerInfo, KafkaLocalError, LocalBroker
from rewardflow.kafka_local.admin import metadata_ready
from rewardflow.settings import load_settings

app = typer.Typer(
    help=f"Run a real local Apache Kafka {KAFKA_VERSION} broker (KRaft, 127.0.0.1 only).",
    no_args_is_help=True,
    add_completion=False,
)

PortOpt = Annotated[
    int | None, typer.Option("--port", help="Client (PLAINTEXT) port. (default: REWARDFLOW_LOCAL_KAFKA_PORT, else the port of a loopback REWARDFLOW_KAFKA_BOOTSTRAP)")
]
HomeOpt = Annotated[
    Path | None, typer.Option("--home", help="State and jar cache directory. (default: REWARDFLOW_HOME)")
]

T = TypeVar("T")


def _broker(port: int | None, controller_port: int | None, partitions: int | None, home: Path | None) -> LocalBroker:
    settings = load_settings()
    port = port or settings.local_broker_port
    return LocalBroker(
        home=home or settings.home,
        port=port,
        controller_port=controller_port or settings.local_kafka_controller_port or port + 1,
        partitions=partitions or settings.partitions,
    )


def _fixable(action: Callable[[], T]) -> T:
    """Run ``action``; a :class:`KafkaLocalError` becomes one stderr line and exit code 2."""
    try:
        return action()
    except (KafkaLocalError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _describe(info: BrokerInfo) -> None:
    typer.echo(f"  bootstrap  {info.bootstrap}")
    typer.echo(f"  pid        {info.pid if info.pid is not None else '-'}")
    typer.echo(f"  log        {info.log_file}")
    typer.echo(f"  data       {info.data_dir}")


@app.command()
def up(
    port: PortOpt = None,
    controller_port: Annotated[
        int | None,
        typer.Option("--controller-port", help="KRaft controller port. (default: REWARDFLOW_LOCAL_KAFKA_CONTROLLER_PORT, else the client port + 1)"),
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option("--partitions", min=1, help="num.partitions for auto-created topics. (default: REWARDFLOW_PARTITIONS)"),
    ] = None,
    home: HomeOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait until the broker answers.")] = 60.0,
) -> None:
    """Start the broker in the background; wait until it answers metadata requests.

    The first run downloads Kafka from Maven Central (needs Maven); later runs
    are offline. If the broker already runs, this succeeds and says so.
    """
    broker = _fixable(lambda: _broker(port, controller_port, partitions, home))
    started = time.monotonic()
    info = _fixable(lambda: broker.up(timeout=timeout, progress=typer.echo))
    if info.started:
        typer.echo(f"Kafka {KAFKA_VERSION} is up ({time.monotonic() - started:.1f} s)")
    else:
        typer.echo(f"Kafka {KAFKA_VERSION} is already running")
    _describe(info)
    configured = load_settings().kafka_bootstrap
    if configured != info.bootstrap:
        typer.echo(f"note: REWARDFLOW_KAFKA_BOOTSTRAP is {configured}; this broker is {info.bootstrap}")


@app.command()
def down(
    port: PortOpt = None,
    home: HomeOpt = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds between SIGTERM and SIGKILL.")
    ] = 30.0,
) -> None:
    """Stop the broker started by `up`, by its recorded PID (SIGTERM, then SIGKILL)."""
    broker = _fixable(lambda: _broker(port, None, None, home))
    pid = _fixable(lambda: broker.down(timeout=timeout))
    if pid is None:
        typer.echo(f"Kafka is not running at {broker.bootstrap}")
    else:
        typer.echo(f"Kafka stopped (pid {pid})")


@app.command()
def status(port: PortOpt = None, home: HomeOpt = None) -> None:
    """Report whether the broker runs: pid, bootstrap, log. Exit code 0 if running, 1 if not."""
    broker = _fixable(lambda: _broker(port, None, None, home))
    info = broker.status()
    if not info.running:
        typer.echo("Kafka is not running")
        _describe(info)
        raise typer.Exit(1)
    answers = "answers metadata" if metadata_ready(info.bootstrap, timeout=2.0) else "NOT answering metadata yet"
    typer.echo(f"Kafka is running ({answers})")
    _describe(info)
