"""``rewardflow collect``: the ingestion edge, in front of the raw topic.

Editors and agents ``POST /v1/events`` with a key (``rewardflow keys create``); see
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
) -> None:
    """Serve the ingestion edge: POST /v1/events with a key, /healthz, /metrics."""
    from rewardflow.clickhouse.connect import open_reader
    from rewardflow.clickhouse.errors import ClickHouseError
    from rewardflow.cli.run import ensure_kafka
    from rewardflow.collector.server import Collector, keys_from_reader
    from rewardflow.kafka.provision import ensure_topics

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")
    settings = load_settings()
    ensure_kafka(settings, start=False)
    ensure_topics(settings)
    try:
        reader = open_reader(settings)
        collector = Collector(settings, keys_from_reader(reader))
    except (ClickHouseError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    collector.serve()
