"""``rewardflow simulate``: send realistic, seeded A/B traffic through the producer SDK.

Valid events go through :class:`~rewardflow.client.EventProducer` (batched per
session); planted malformed records go as raw bytes through a plain
confluent-kafka producer to the same topic (key = session id, header
``rf-format: json``), because the SDK refuses invalid events by design.

Ordering: every ``--sync-every-s`` seconds of *event* time, and before each
planted late event, the SDK and the raw producer are flushed, so records
reach Kafka in event-time order up to that interval (the SDK's per-session
batching could otherwise reorder sessions by more than the grace period).
``--time-scale X`` sends X event-seconds per wall second (0: as fast as
possible); event times stay realistic either way.

Exit codes: 0 sent, 1 delivery failed, 2 configuration or broker unreachable.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from rewardflow.cli.lateness import warn_if_late
from rewardflow.kafka import topics
from rewardflow.settings import Settings, load_settings
from rewardflow.sim.config import ab_config, default_start_ms
from rewardflow.sim.generator import Simulator
from rewardflow.sim.profiles import HACKS
from rewardflow.sim.send import WireFormat, hack_of, send_simulation
from rewardflow.sim.truth import GroundTruth



def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _check_broker(settings: Settings, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    from rewardflow.cli.run import ensure_kafka

    ensure_kafka(settings, start=False, hint="")
    try:
        quiet = logging.getLogger("rewardflow.simulate.librdkafka")  # its retries would bury our one line
        meta = AdminClient(settings.kafka_client_config(), logger=quiet).list_topics(timeout=5)
    except Exception as exc:  # (it answered a moment ago)
        raise _fail(f"Kafka at {settings.kafka_bootstrap} stopped answering ({exc})") from None
    if topic not in meta.topics:
        raise _fail(f"topic {topic} does not exist on {settings.kafka_bootstrap}; create the topics first")


def _warn_if_ahead(settings: Settings, start_ms: int, safe_ms: int, console: Console) -> None:
    """Warn when a ``--start-ms`` puts the simulation's events ahead of the broker's clock as they are sent:
    ``safe_ms`` is the default start (the whole span in the past, with an hour to spare)."""
    ahead_ms = start_ms - (safe_ms + 3_600_000)
    if ahead_ms <= settings.max_clock_skew_ms:
        return
    console.print(f"[yellow]warning:[/] with --start-ms {start_ms} this simulation's last events are dated up to "
                  f"{ahead_ms / 1000:,.0f} s after the time they are sent; events more than "
                  f"{settings.max_clock_skew_ms / 1000:g} s ahead of the broker's clock (REWARDFLOW_MAX_CLOCK_SKEW_MS) "
                  f"are dead-lettered as future_ts. Start at or before {safe_ms} (the default), or raise --time-scale.")


def summary_table(truth: GroundTruth, sent: int | None, malformed: int | None) -> Table:
    """Ground truth as printed after a run."""
    table = Table(title="simulation summary", title_justify="left", show_header=False)
    rows: list[tuple[str, str]] = []
    if sent is not None:
        rows.append(("events sent (SDK, acknowledged)", f"{sent:,}"))
    rows += [("valid events generated", f"{truth.events_generated:,}"), ("sessions", f"{truth.sessions:,}")]
    for arm, ck in truth.arms.items():
        c = truth.checkpoints[ck]
        rows.append((f"turns {ck} ({arm})", f"{c.turns:,} (+{c.orphan_turns} orphan)"))
    rows += [("planted duplicates", f"{truth.duplicates:,}"), ("planted late events", f"{truth.late:,}"),
             ("planted out-of-order", f"{truth.out_of_order:,}"), ("planted orphan turns", f"{truth.orphan_turns:,}"),
             ("planted malformed", f"{truth.malformed:,}" + (f" (sent {malformed:,})" if malformed is not None else ""))]
    for k, v in rows:
        table.add_row(k, v)
    return table


def command(
    sessions: Annotated[int, typer.Option(min=1, help="Sessions to simulate.")] = 200,
    turns_per_session: Annotated[int, typer.Option(min=1, help="Agent turns per session.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed: equal seeds give equal traffic.")] = 0,
    baseline_checkpoint: Annotated[str, typer.Option(help="Checkpoint of the control arm.")] = "ckpt-base",
    candidate_checkpoint: Annotated[str, typer.Option(help="Checkpoint of the treatment arm.")] = "ckpt-cand",
    hack: Annotated[str | None, typer.Option(help=f"Plant a reward hack in the candidate: {' | '.join(HACKS)}.")] = None,
    noise: Annotated[bool, typer.Option("--noise", help="Plant duplicates, out-of-order, late, orphan and malformed events.")] = False,
    time_scale: Annotated[float, typer.Option(min=0, help="Event seconds sent per wall second; 0 = as fast as possible.")] = 0.0,
    duration_s: Annotated[float, typer.Option(min=1, help="Session starts spread over this many event seconds.")] = 3600.0,
    start_ms: Annotated[int | None, typer.Option(help="Event time of the start, epoch ms (default: early enough that the whole simulation lies in the past; the pipeline refuses events dated ahead of the broker's clock).")] = None,
    wire_format: Annotated[str, typer.Option("--format", help="Wire format of the SDK: avro | json.")] = "avro",
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers (default: REWARDFLOW_KAFKA_BOOTSTRAP).")] = None,
    sync_every_s: Annotated[float, typer.Option(min=0.1, help="Flush every this many event seconds (keeps event-time order).")] = 10.0,
    truth_out: Annotated[Path | None, typer.Option(help="Write the ground truth as JSON to this file.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Generate and summarise only; send nothing.")] = False,
) -> None:
    """Send seeded A/B traffic (baseline vs candidate checkpoint) and print its ground truth."""
    if wire_format not in ("avro", "json"):
        raise _fail(f"--format {wire_format!r}: use avro or json")
    if hack is not None and hack not in HACKS:
        raise _fail(f"--hack {hack!r}: use one of {', '.join(HACKS)}")
    settings = load_settings(**({"kafka_bootstrap": bootstrap} if bootstrap else {}))
    safe_ms = default_start_ms(int(time.time() * 1000), duration_s=duration_s, turns_per_session=turns_per_session,
                               time_scale=time_scale)
    try:
        cfg = ab_config(baseline_checkpoint, candidate_checkpoint, hack=hack_of(hack), noise=noise, sessions=sessions,
                        turns_per_session=turns_per_session, seed=seed, time_scale=time_scale, duration_s=duration_s,
                        start_ms=start_ms if start_ms is not None else safe_ms,
                        grace_ms=settings.grace_ms, lateness_ms=settings.allowed_lateness_ms,
                        correction_ms=settings.correction_window_ms)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise _fail(f"{'.'.join(str(p) for p in err['loc']) or 'simulation'}: {err['msg']}") from None
    console = Console(stderr=True)
    sim = Simulator(cfg)
    sent: int | None = None
    malformed: int | None = None
    if dry_run:
        for _ in sim.stream():
            pass
    else:
        _check_broker(settings, settings.topic(topics.RAW))
        warn_if_late(settings, cfg.start_ms, console, "this simulation's first", "pace it in real time (--time-scale 1)")
        if start_ms is not None:
            _warn_if_ahead(settings, start_ms, safe_ms, console)
        from rewardflow.client import ProducerError

        try:
            fmt: WireFormat = "avro" if wire_format == "avro" else "json"
            stats, malformed = send_simulation(sim, settings, fmt, int(sync_every_s * 1000), console)
        except ProducerError as exc:
            raise _fail(str(exc).splitlines()[0], 1) from None
        sent = stats.sent
    Console().print(summary_table(sim.truth, sent, malformed))
    if truth_out is not None:
        truth_out.write_bytes(sim.truth.to_json())
        console.print(f"ground truth written to {truth_out}")
