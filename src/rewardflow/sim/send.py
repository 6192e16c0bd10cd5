"""Sending a simulated stream to Kafka, as clients would: valid events through the SDK, planted
malformed records raw (the SDK refuses them). Used by ``rewardflow simulate`` and the demo.

Blocking: returns once every record is acknowledged; shows a progress bar on ``console``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rewardflow.kafka import topics
from rewardflow.settings import Settings
from rewardflow.sim.config import SimConfig
from rewardflow.sim.generator import SendGroup, Simulator
from rewardflow.sim.profiles import HACKS, Hack

WireFormat = Literal["avro", "json"]
_HEADERS: list[tuple[str, str | bytes | None]] = [("rf-format", b"json")]


def send_simulation(sim: Simulator, settings: Settings, fmt: WireFormat, sync_ms: int, console: Console) -> tuple[Any, int]:
    """Send the whole stream; returns (SDK stats, malformed records sent)."""
    from confluent_kafka import Producer

    from rewardflow.client import EventProducer, ProducerConfig

    cfg, topic = sim.config, settings.topic(topics.RAW)
    raw = Producer({**settings.kafka_client_config(), "partitioner": topics.RAW_PARTITIONER})
    est_end = cfg.end_of_starts_ms + cfg.turns_per_session * 90_000 + cfg.settle_ms
    malformed, last_sync, t0 = 0, cfg.start_ms, time.monotonic()
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[sent]:>9,} events"),
               TextColumn("sim {task.fields[clock]}"), TimeElapsedColumn())
    with EventProducer(settings, ProducerConfig(wire_format=fmt, block_timeout_s=60.0)) as sdk, \
            Progress(*columns, console=console) as progress:
        task = progress.add_task("simulating", total=est_end - cfg.start_ms, sent=0, clock="+0 s")

        def sync() -> None:
            sdk.flush()
            raw.flush()

        for g in sim.stream():
            if cfg.time_scale > 0:
                time.sleep(max(0.0, t0 + g.send_at_s - time.monotonic()))
            if g.late or g.due_ms - last_sync >= sync_ms:
                sync()
                last_sync = g.due_ms
            if g.raw is not None:
                raw.produce(topic, g.raw, g.session_id.encode(), headers=_HEADERS)
                raw.poll(0)
                malformed += 1
            else:
                for event in g.events:
                    sdk.emit(event)
            _advance(progress, task, g, cfg, sim)
        sync()
        progress.update(task, completed=est_end - cfg.start_ms)
        return sdk.flush(), malformed


def _advance(progress: Progress, task: Any, g: SendGroup, cfg: SimConfig, sim: Simulator) -> None:
    progress.update(task, completed=g.due_ms - cfg.start_ms, sent=sim.events_sent,
                    clock=f"+{(g.due_ms - cfg.start_ms) // 1000:,} s")



def hack_of(name: str | None) -> Hack | None:
    """The hack named ``name`` (None for none or an unknown name)."""
    for h in HACKS:
        if h == name:
            return h
    return None



