"""``rewardflow emit FILE.jsonl``: send events from a JSON-lines file through the producer SDK.

Each non-blank line is one event object. A line that is not JSON, or whose
event breaks the contract, is *rejected* (reported with its line number,
field and reason) and nothing of it is sent; the other lines go on. After the
last line the command waits up to ``--timeout`` seconds for the broker's
acknowledgements, then prints a summary: sent, rejected, failed (delivery
failures by reason, plus events still unacknowledged at the timeout).

Exit codes: 0 when every accepted event was delivered; 1 when any failed
(or, with ``--strict``, when any line was rejected); 2 for a configuration
error (one line on stderr).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from rewardflow.client import BufferFull, EventProducer, ProducerConfig, ProducerStats, UndeliveredEvents
from rewardflow.events.errors import EventError, InvalidEvent
from rewardflow.cli.lateness import warn_if_late
from rewardflow.cli.run import ensure_kafka
from rewardflow.settings import load_settings

SHOWN_REJECTIONS = 20


class WireFormat(str, Enum):
    avro = "avro"
    json = "json"


@dataclass
class Outcome:
    """What happened to the file's lines."""

    rejected: list[tuple[int, str, str]] = field(default_factory=list)  # (line, field, reason)
    not_sent: int = 0  # lines never emitted because the producer stayed full
    stats: ProducerStats = field(default_factory=ProducerStats)
    first_ts: int | None = None  # the earliest event time emitted

    @property
    def failed(self) -> int:
        return self.stats.failed + self.stats.pending + self.not_sent


def command(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True,
                                         help="JSON-lines file: one event object per line (blank lines are skipped).")],
    wire_format: Annotated[WireFormat, typer.Option("--format", help="Wire format of the Kafka records.")] = WireFormat.avro,
    topic: Annotated[str | None, typer.Option("--topic", help="Topic to write. (default: <REWARDFLOW_TOPIC_PREFIX>events.raw)")] = None,
    bootstrap: Annotated[str | None, typer.Option("--bootstrap", help="Kafka bootstrap servers. (default: REWARDFLOW_KAFKA_BOOTSTRAP)")] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for acknowledgements (and for room when the SDK's buffer is full).")] = 60.0,
    strict: Annotated[bool, typer.Option("--strict", help="Exit with 1 when any line is rejected, not only when deliveries fail.")] = False,
) -> None:
    """Send the events of a JSON-lines file to Kafka, batched per session, and report what happened.

    Invalid lines are rejected (line number, field, reason) and the rest are sent.
    Exit code 1 if any event failed delivery (or, with --strict, any line was rejected).
    """
    settings = load_settings(**({"kafka_bootstrap": bootstrap} if bootstrap else {}))
    ensure_kafka(settings, start=False, hint="")
    # librdkafka gives up on a record after `timeout`; close waits a little longer so that the
    # reason of a failure (e.g. _MSG_TIMED_OUT) is reported rather than a bare "unacknowledged"
    config = ProducerConfig(topic=topic, wire_format=wire_format.value, block_timeout_s=timeout,
                            delivery_timeout_ms=max(1_000, int(timeout * 1000)), close_timeout_s=timeout + 2.0)
    try:
        producer = EventProducer(settings, config)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    console = Console(stderr=True)
    outcome = _send(file, producer, console)
    _report(outcome, producer.config.topic)
    if outcome.first_ts is not None:
        warn_if_late(settings, outcome.first_ts, console, "the file's earliest event", "date the events now")
    if outcome.failed or (strict and outcome.rejected):
        raise typer.Exit(1)


def _send(file: Path, producer: EventProducer, console: Console) -> Outcome:
    outcome = Outcome()
    with file.open("rb") as f:
        total = sum(1 for _ in f)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress, file.open("rb") as lines:
        task = progress.add_task("emit", total=total)
        for number, line in enumerate(lines, start=1):
            progress.advance(task)
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
                producer.emit(event)
                ts = event.get("ts") if isinstance(event, dict) else None
                if type(ts) is int and (outcome.first_ts is None or ts < outcome.first_ts):
                    outcome.first_ts = ts
            except orjson.JSONDecodeError as exc:
                outcome.rejected.append((number, "<line>", f"not JSON: {exc}"))
            except InvalidEvent as exc:
                outcome.rejected.append((number, exc.field, str(exc).split(": ", 1)[-1]))
            except EventError as exc:
                outcome.rejected.append((number, "<event>", str(exc)))
            except BufferFull as exc:
                console.print(f"[red]stopped at line {number}: {exc}", highlight=False)
                outcome.not_sent = 1 + sum(1 for rest in lines if rest.strip())
                break
        progress.update(task, description="waiting for acknowledgements")
        try:
            outcome.stats = producer.close()
        except UndeliveredEvents as exc:
            outcome.stats = exc.stats
    return outcome


def _report(outcome: Outcome, topic: str) -> None:
    """The summary, on stdout."""
    out = Console()
    out.print(f"rewardflow emit → {topic}", markup=False, highlight=False)
    summary = Table(show_header=False)
    summary.add_row("sent", f"[green]{outcome.stats.sent}")
    summary.add_row("rejected", f"[yellow]{len(outcome.rejected)}")
    summary.add_row("failed", f"[red]{outcome.failed}" if outcome.failed else "0")
    out.print(summary)
    for number, name, reason in outcome.rejected[:SHOWN_REJECTIONS]:
        out.print(f"  rejected line {number}: {name}: {reason}", markup=False, highlight=False)
    if len(outcome.rejected) > SHOWN_REJECTIONS:
        out.print(f"  … and {len(outcome.rejected) - SHOWN_REJECTIONS} more rejected lines")
    for reason, count in sorted(outcome.stats.failures.items(), key=lambda kv: -kv[1]):
        out.print(f"  failed: {count} events: {reason}", markup=False, highlight=False)
    if outcome.stats.pending:
        out.print(f"  failed: {outcome.stats.pending} events unacknowledged when the timeout ran out")
    if outcome.not_sent:
        out.print(f"  failed: {outcome.not_sent} lines not sent (the producer's buffer stayed full)")
