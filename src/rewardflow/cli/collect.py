"""``rewardflow collect``: the ingestion edge, in front of the raw topic.

Editors and agents ``POST /v1/events``, OpenTelemetry exporters ``POST /v1/traces``, with a key
(``rewardflow keys create``); see
docs/collector.md. It reads the keys from the configured ClickHouse (through the owner's read
endpoint when another process owns the embedded chDB; with chDB alone, ``rewardflow run --collect``
serves the edge from the owning process instead).

Exit codes: 0 stopped by SIGINT/SIGTERM after finishing requests in flight; 2 a fixable error.
"""

from __future__ import annotations

import logging

import typer

from rewardflow.settings import load_settings


def command(
    log_level: str = typer.Option("INFO", help="Python log level."),
    processes: int = typer.Option(1, "--processes", min=1, max=64, help="Processes serving the one port (one core "
                                  "each); above 1, keys come from a ClickHouse server or the chDB owner's endpoint."),
) -> None:
    """Serve the ingestion edge: POST /v1/events and POST /v1/traces (OTLP) with a key, /healthz, /metrics."""
    from rewardflow.clickhouse.connect import open_reader
    from rewardflow.clickhouse.errors import ClickHouseError
    from rewardflow.cli.run import ensure_kafka
    from rewardflow.clickhouse.connect import as_dsn
    from rewardflow.clickhouse.enginelock import probe_engine
    from rewardflow.collector.processes import serve_processes
    from rewardflow.collector.server import Collector, keys_from_reader, listen
    from rewardflow.kafka.provision import ensure_topics

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")
    settings = load_settings()
    dsn = as_dsn(settings.dsn)
    if processes > 1 and dsn.embedded and dsn.path is not None and probe_engine(dsn.path) is None:
        typer.echo(f"error: --processes {processes} with the embedded chDB needs the process that owns it "
                   "(`rewardflow run`) running: the collectors read the keys through its read endpoint", err=True)
        raise typer.Exit(2)
    ensure_kafka(settings, start=False, hint=", or run the edge with the pipeline: `rewardflow run --collect`")
    ensure_topics(settings)
    if processes > 1:
        try:
            sock = listen(settings.collect_host, settings.collect_port)
        except OSError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        raise typer.Exit(serve_processes(sock, processes, log_level.upper()))
    try:
        reader = open_reader(settings)
        collector = Collector(settings, keys_from_reader(reader))
    except (ClickHouseError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    collector.serve()
