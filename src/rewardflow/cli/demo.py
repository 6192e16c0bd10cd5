"""``rewardflow demo``: the whole loop on local defaults, ending with an A/B report.

1. brings up the project's local Kafka if none answers (jars from the cache);
2. starts the stream worker (a subprocess) and the ClickHouse sink (this
   process owns the demo's own chDB directory);
3. simulates a baseline and a candidate checkpoint whose editors and agents send through the
   ingestion edge (``rewardflow collect``, a process of its own, one key per org); then moves
   event time past the last deadline with signed ticks, as the workers' idle clock would;
4. waits until every simulated turn is finalised and written;
5. stops everything cleanly, prints the A/B report, the reconciliation of
   counts and the Goodhart alerts, and writes HTML + JSON reports.

Each demo run is isolated: its own topic prefix and chDB directory under
``$REWARDFLOW_HOME/demo/<run id>/``. Exit code 0 when the counts reconcile.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from rewardflow.settings import load_settings

DEMO_OVERRIDES: dict[str, Any] = {
    "partitions": 4,  # after the traffic, the demo moves event time past the last deadline with signed ticks
}


def command(
    sessions: Annotated[int, typer.Option(min=2, help="Sessions to simulate.")] = 300,
    turns_per_session: Annotated[int, typer.Option(min=1, help="Agent turns per session.")] = 8,
    seed: Annotated[int, typer.Option(help="Simulation seed.")] = 7,
    hack: Annotated[str | None, typer.Option(help="Plant a reward hack in the candidate: broken-tools | over-ask.")] = None,
    candidate_profile: Annotated[str, typer.Option(
        help="The candidate: published (the published A/B gains) | regress (clearly worse persistence).")] = "published",
    noise: Annotated[bool, typer.Option("--noise/--no-noise", help="Plant duplicates, late, orphan and malformed events.")] = True,
    json_only: Annotated[bool, typer.Option("--json", help="Print the JSON summary only.")] = False,
    out_dir: Annotated[Path | None, typer.Option(help="Where to write report.html and summary.json.")] = None,
    timeout_s: Annotated[float, typer.Option(help="Give up waiting for finalisation after this many seconds.")] = 600.0,
) -> None:
    """Run the whole loop locally: Kafka, worker, sink, simulated A/B traffic, report."""
    from rewardflow.demo.runner import DemoRunner
    from rewardflow.sim.profiles import CANDIDATE_KINDS, HACKS

    if hack is not None and hack not in HACKS:
        raise typer.BadParameter(f"use one of {', '.join(HACKS)}", param_hint="--hack")
    if candidate_profile not in CANDIDATE_KINDS:
        raise typer.BadParameter(f"use one of {', '.join(CANDIDATE_KINDS)}", param_hint="--candidate-profile")
    base = load_settings()
    run_id = time.strftime("%Y%m%d-%H%M%S")
    run_dir = base.home / "demo" / run_id
    settings = load_settings(
        **DEMO_OVERRIDES,
        topic_prefix=f"rewardflow.demo-{run_id}.",
        clickhouse_dsn=f"chdb://{(run_dir / 'chdb').resolve()}",
    )
    console = Console(stderr=True)
    runner = DemoRunner(settings, run_dir, console)
    code = runner.run(sessions=sessions, turns_per_session=turns_per_session, seed=seed, hack=hack, noise=noise,
                      json_only=json_only, out_dir=out_dir or run_dir / "report", timeout_s=timeout_s,
                      candidate_kind=candidate_profile)
    raise typer.Exit(code)
