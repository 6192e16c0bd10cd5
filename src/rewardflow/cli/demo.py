"""``rewardflow demo``: the whole loop on local defaults, ending with an A/B report.

1. brings up the project's local Kafka if none answers (jars from the cache);
2. starts the stream worker (a subprocess) and the ClickHouse sink (this
   process owns the demo's own chDB directory);
3. simulates three checkpoints, a baseline, a candidate with the published gains and a second
   candidate with the same gains that games the reward (``--hack``), whose editors and agents
   send through the ingestion edge (``rewardflow collect``, a process of its own, one key per
   org); then moves event time past the last deadline with signed ticks, as the workers' idle
   clock would;
4. waits until every simulated turn is finalised and written;
5. stops everything cleanly; judges each candidate (A/B report, deploy gate, Goodhart alerts,
   exclusion balance),
   replays a blocked candidate's alerted window under the next reward spec, prints the
   reconciliation of counts and a verdict per candidate, and writes the HTML page and a JSON
   summary.

The default size tells that story in about two minutes on two cores (docs/demo.md has the
sizing and its power calculation); ``--quick`` is a smaller run with the same verdicts on the
gate and the monitors, for CI.

Each demo run is isolated: its own topic prefix and chDB directory under
``$REWARDFLOW_HOME/demo/<run id>/``. Exit code 0 when the counts reconcile.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from rewardflow.settings import load_settings

DEMO_OVERRIDES: dict[str, Any] = {
    "partitions": 4,  # after the traffic, the demo moves event time past the last deadline with signed ticks
    "active_spec_versions": ["v1"],  # v2 is the next spec: the demo replays under it what it would change
}
STORY_SESSIONS = 4_000
QUICK_SESSIONS = 400


def command(
    sessions: Annotated[int | None, typer.Option(
        min=3, help=f"Sessions to simulate (default: {STORY_SESSIONS:,}; {QUICK_SESSIONS} with --quick).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A smaller run: the same gate and monitor verdicts, "
                                                        "gains not resolved.")] = False,
    turns_per_session: Annotated[int, typer.Option(min=1, help="Agent turns per session.")] = 8,
    seed: Annotated[int, typer.Option(help="Simulation seed.")] = 7,
    hack: Annotated[str, typer.Option(help="What the second candidate does: over-ask | broken-tools (reward hacks) | "
                                                   "hide-failures (its clients send failing turns malformed).")] = "over-ask",
    candidate_profile: Annotated[str, typer.Option(
        help="The first candidate: published (the published A/B gains) | regress (clearly worse persistence).")] = "published",
    policy: Annotated[Path | None, typer.Option(help="Deploy gate policy TOML (default: the shipped example gate).")] = None,
    noise: Annotated[bool, typer.Option("--noise/--no-noise", help="Plant duplicates, late, orphan and malformed events.")] = True,
    json_only: Annotated[bool, typer.Option("--json", help="Print the JSON summary only.")] = False,
    out_dir: Annotated[Path | None, typer.Option(help="Where to write report.html and summary.json.")] = None,
    timeout_s: Annotated[float, typer.Option(help="Give up waiting for finalisation after this many seconds.")] = 600.0,
) -> None:
    """Run the whole loop locally: Kafka, edge, worker, sink, three simulated checkpoints, verdicts."""
    from rewardflow.analysis.gate import DEFAULT_POLICY, PolicyError, load_policy
    from rewardflow.demo.present import console
    from rewardflow.demo.runner import DemoRunner
    from rewardflow.sim.profiles import CANDIDATE_KINDS, HACKS

    if hack not in HACKS:
        raise typer.BadParameter(f"use one of {', '.join(HACKS)}", param_hint="--hack")
    try:
        load_policy(policy or DEFAULT_POLICY)
    except PolicyError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from None
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
    runner = DemoRunner(settings, run_dir, console(stderr=True))
    code = runner.run(sessions=sessions or (QUICK_SESSIONS if quick else STORY_SESSIONS), turns_per_session=turns_per_session, seed=seed, hack=hack, noise=noise,
                      json_only=json_only, out_dir=out_dir or run_dir / "report", timeout_s=timeout_s,
                      candidate_kind=candidate_profile, policy=policy)
    raise typer.Exit(code)
