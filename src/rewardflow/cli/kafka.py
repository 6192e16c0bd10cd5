"""``rewardflow kafka up | down | status``: the project's local Apache Kafka broker; ``rewardflow kafka lag``:
whether the pipeline has drained, on any Kafka.

The broker listens on the port of ``REWARDFLOW_KAFKA_BOOTSTRAP`` when that is one loopback
address (default ``127.0.0.1:19092``), its controller on the next port. Options override settings
(``REWARDFLOW_LOCAL_KAFKA_PORT``, ``…_CONTROLLER_PORT``, ``REWARDFLOW_PARTITIONS``,
``REWARDFLOW_HOME``). The broker's data lives in
``<home>/kafka/data-<port>``, so ``--port`` also selects which broker
``down`` and ``status`` address. ``up --brokers N`` starts a local cluster of N brokers instead
(ports ``port``, ``port + 2``, …, each controller one above; replication 3 and
``min.insync.replicas`` 2 from three brokers on), which ``down`` and ``status`` then address as a
whole. User-fixable failures print one line on stderr and exit with code 2.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console

from rewardflow.kafka_local import KAFKA_VERSION, BrokerInfo, KafkaLocalError, LocalBroker
from rewardflow.kafka_local.admin import metadata_ready
from rewardflow.kafka_local.cluster import LocalCluster
from rewardflow.settings import LIBRDKAFKA_LOG, load_settings

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
    brokers: Annotated[int, typer.Option("--brokers", min=1, max=9, help="Start a local cluster of this many "
                                         "brokers (ports PORT, PORT+2, …; 3 or more: replication 3, min ISR 2).")] = 1,
) -> None:
    """Start the broker in the background; wait until it answers metadata requests.

    The first run downloads Kafka from Maven Central (needs Maven); later runs
    are offline. If the broker already runs, this succeeds and says so.
    """
    if brokers > 1:
        _cluster_up(port, partitions, home, brokers, timeout)
        return
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


def _cluster(port: int | None, partitions: int | None, home: Path | None, size: int | None) -> LocalCluster | None:
    settings = load_settings()
    first, where = port or settings.local_broker_port, home or settings.home
    if size is None:
        return LocalCluster.find(where, first)
    return LocalCluster(where, first, size, partitions or settings.partitions)


def _cluster_up(port: int | None, partitions: int | None, home: Path | None, size: int, timeout: float) -> None:
    cluster = _fixable(lambda: _cluster(port, partitions, home, size))
    assert cluster is not None
    started = time.monotonic()
    info = _fixable(lambda: cluster.up(timeout=max(timeout, 120.0), progress=typer.echo))
    fresh = sum(1 for n in info.nodes if n.started)
    typer.echo(f"Kafka {KAFKA_VERSION} cluster of {size} is up ({fresh} started, {time.monotonic() - started:.1f} s)")
    for n in info.nodes:
        _describe(n)
    typer.echo(f"  use        REWARDFLOW_KAFKA_BOOTSTRAP={info.bootstrap}")


@app.command()
def down(
    port: PortOpt = None,
    home: HomeOpt = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds between SIGTERM and SIGKILL.")
    ] = 30.0,
) -> None:
    """Stop the broker (or every broker of the cluster) started by `up`, by recorded PID (SIGTERM, then SIGKILL)."""
    cluster = _fixable(lambda: _cluster(port, None, home, None))
    if cluster is not None:
        pids = _fixable(lambda: cluster.down(timeout=timeout))
        typer.echo(f"Kafka cluster stopped ({len(pids)} of {cluster.size} brokers were running)")
        return
    broker = _fixable(lambda: _broker(port, None, None, home))
    pid = _fixable(lambda: broker.down(timeout=timeout))
    if pid is None:
        typer.echo(f"Kafka is not running at {broker.bootstrap}")
    else:
        typer.echo(f"Kafka stopped (pid {pid})")


@app.command()
def status(port: PortOpt = None, home: HomeOpt = None) -> None:
    """Report whether the broker runs: pid, bootstrap, log. Exit code 0 if running, 1 if not."""
    cluster = _fixable(lambda: _cluster(port, None, home, None))
    if cluster is not None:
        state = cluster.status()
        typer.echo(f"Kafka cluster: {state.running} of {cluster.size} brokers running ({state.bootstrap})")
        for n in state.nodes:
            _describe(n)
        raise typer.Exit(0 if state.running == cluster.size else 1)
    broker = _fixable(lambda: _broker(port, None, None, home))
    info = broker.status()
    if not info.running:
        typer.echo("Kafka is not running")
        _describe(info)
        raise typer.Exit(1)
    answers = "answers metadata" if metadata_ready(info.bootstrap, timeout=2.0) else "NOT answering metadata yet"
    typer.echo(f"Kafka is running ({answers})")
    _describe(info)


@app.command()
def lag(
    wait: Annotated[float, typer.Option("--wait", min=0, help="Wait up to this many seconds for the pipeline to "
                                        "drain (0: report once).")] = 0.0,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for Kafka's answer.")] = 5.0,
) -> None:
    """Records the workers and the sink have not committed yet, on the configured Kafka (any cluster, not only
    the local one). Exit code 0 when drained (both 0), 1 when not, 2 when Kafka does not answer."""
    from rewardflow.kafka import topics
    from rewardflow.kafka.lag import PipelineLag, pipeline_lag, sink_group  # (loads confluent-kafka: here only)

    settings = load_settings()
    LIBRDKAFKA_LOG.setLevel(logging.CRITICAL)  # a broker that does not answer is this command's one-line error
    deadline = time.monotonic() + wait
    seen: PipelineLag = pipeline_lag(settings, timeout)
    zero = 1 if seen.drained else 0
    with Console(stderr=True).status("") as spinner:
        while wait and zero < 2 and time.monotonic() < deadline:  # (drained twice in a row: nothing in between)
            spinner.update(f"waiting for the pipeline to drain: workers {_n(seen.worker)}, sink {_n(seen.sink)} "
                           f"records behind")
            time.sleep(1.0)
            seen = pipeline_lag(settings, timeout)
            zero = zero + 1 if seen.drained else 0
    typer.echo(f"workers  {_n(seen.worker)} records behind on {settings.topic(topics.RAW)} "
               f"(group {settings.topic('worker')})")
    typer.echo(f"sink     {_n(seen.sink)} records behind on the output topics (group {sink_group(settings)})")
    if seen.worker is None or seen.sink is None:
        typer.echo(f"error: Kafka at {settings.kafka_bootstrap} did not answer", err=True)
        raise typer.Exit(2)
    raise typer.Exit(0 if seen.drained else 1)


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"
