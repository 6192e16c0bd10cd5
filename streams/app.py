"""The Faust worker: raw client records in, rewards/windows/dead letters out.

The agent is a thin shell over :class:`rewardflow.core.processor.PartitionProcessor`:
for each raw record it calls ``process`` and sends the returned rows. All
domain logic (validation, dedup, join, reward, windows) lives in the core.

Delivery: at-least-once, agent concurrency 1 (faust #606). Output sends and
changelog writes go through Faust's producer, which Faust flushes *before* it
commits offsets, so a committed offset implies its outputs are in Kafka.
An unexpected exception in the core, or a refused output send, stops the
process (exit 70) instead of letting Faust ack the record (Faust acks events
whose processing raised). Output rows are split into records of at most
``max_record_bytes`` (and at most 1 MB, the broker's default limit).

Idle partitions: a timer sends a *tick* record (header ``rf-format: tick``) to
each idle partition of the raw topic, carrying a watermark that follows the
wall clock. Ticks are ordinary records, so replays see the same watermarks.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import faust
import orjson

from rewardflow import topics as T
from rewardflow.core.config import JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import TICK, PartitionProcessor, record_format
from rewardflow.rewards.registry import active_specs
from rewardflow.settings import Settings
from rewardflow_streams.metrics import WorkerMetrics
from rewardflow_streams.state import TableStore

log = logging.getLogger("rewardflow.streams")
_JSON = orjson.OPT_NON_STR_KEYS
_TICK_HEADERS = {"rf-format": b"tick"}
# Output records stay under the broker's default max.message.bytes (1,048,588), which
# ensure_topics does not raise, whatever max_record_bytes allows for input records.
_MAX_OUTPUT_RECORD = 1_000_000


def _now_ms() -> int:
    return int(time.time() * 1000)


class JoinWorker:
    """Faust app, topics, table and agent for one deployment's settings."""

    def __init__(self, settings: Settings, *, web: bool = True) -> None:
        self.settings = settings
        self.cfg = JoinConfig.from_settings(settings)
        self.specs = active_specs(settings)
        self.metrics = WorkerMetrics(settings.dead_letter_ratio_limit, settings.dead_letter_window_s)
        self.processors: dict[int, PartitionProcessor] = {}
        self.app = faust.App(
            settings.topic("worker"),
            broker=f"kafka://{settings.kafka_bootstrap}",
            broker_credentials=_credentials(settings),
            store="memory://",
            topic_partitions=settings.partitions,
            topic_replication_factor=1,
            autodiscover=False,
            web_enabled=web,
            web_bind=settings.web_host,
            web_host=settings.web_host,
            web_port=settings.web_port + 1,
            producer_acks=-1,
            producer_max_request_size=settings.max_record_bytes * 2,
            consumer_auto_offset_reset="earliest",
            stream_wait_empty=False,
            table_standby_replicas=0,
            broker_commit_interval=1.0,
        )
        raw = dict(key_serializer="raw", value_serializer="raw")
        self.raw_topic = self.app.topic(settings.topic(T.RAW), partitions=settings.partitions, **raw)
        self.out_topics = {
            name: self.app.topic(settings.topic(name), partitions=settings.partitions, **raw)
            for name in (T.VALID, T.REWARDS, T.WINDOWS, T.DEADLETTERS, T.LATE, T.EXCLUSIONS)
        }
        # value_type=bytes makes the changelog topic itself "raw" (orjson bytes written by TableStore):
        # setting table.value_serializer afterwards left recovery decoding the changelog as JSON.
        # The changelog accepts what the producer may send (2 x max_record_bytes); the store refuses
        # larger values up front, since a refused changelog send is only logged by Faust.
        changelog_max = 2 * settings.max_record_bytes
        self.table = self.app.Table("join-state", default=None, partitions=settings.partitions,
                                    key_type=str, value_type=bytes,
                                    extra_topic_configs={"max.message.bytes": str(changelog_max)})
        self.store = TableStore(self.table, max_bytes=changelog_max - 4096)
        self.app.agent(self.raw_topic, name="join", concurrency=1)(self._agent)
        self.app.timer(interval=max(0.2, settings.idle_timeout_s / 2))(self._idle_ticks)
        self.app.on_partitions_assigned.connect(self._on_assigned)
        if web:
            self.app.page("/metrics")(self._metrics_view)

    # ------------------------------------------------------------------ agent
    async def _agent(self, stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            proc = self._processor(msg.partition)
            try:
                out = proc.process(msg.value, msg.headers, msg.offset, _now_ms())
                await self._emit(out, msg.key or str(msg.partition).encode(), msg.partition)
            except Exception:  # a bug or a refused send, never bad input: do not let Faust ack it
                log.exception("processing or sending the outputs of %s[%d]@%d failed; exiting without commit",
                              msg.topic, msg.partition, msg.offset)
                os._exit(70)
            self.metrics.observe(out, tick=record_format(msg.headers) == TICK)

    async def _emit(self, out: Outputs, key: bytes, partition: int) -> None:
        sends = ((T.VALID, out.valid), (T.REWARDS, out.rewards), (T.DEADLETTERS, out.dead),
                 (T.LATE, out.late), (T.EXCLUSIONS, out.excluded))
        limit = min(self.settings.max_record_bytes, _MAX_OUTPUT_RECORD)
        for name, rows in sends:
            for value in _chunks(rows, limit):
                await self.out_topics[name].send(key=key, value=value)
        for value in _chunks(out.windows, limit):
            await self.out_topics[T.WINDOWS].send(key=str(partition).encode(), value=value)

    def _processor(self, partition: int) -> PartitionProcessor:
        proc = self.processors.get(partition)
        if proc is None:
            proc = PartitionProcessor(self.cfg, self.specs, self.store, self.settings.topic(T.RAW), partition)
            # Idle time counts from when this worker took the partition. Left at 0, a restart whose
            # first record read is a tick made the next idle tick carry maxts + now x rate (year ~4800).
            proc.last_event_wall = _now_ms()
            self.processors[partition] = proc
        return proc

    async def _on_assigned(self, app: Any, assigned: Any, **_: Any) -> None:
        """Any rebalance invalidates derived state: rebuild on each partition's next record."""
        self.processors.clear()

    # ------------------------------------------------------------------ idle clock
    async def _idle_ticks(self) -> None:
        now = _now_ms()
        timeout_ms = int(self.settings.idle_timeout_s * 1000)
        for partition, proc in list(self.processors.items()):
            target = proc.idle_target(now, timeout_ms, self.settings.idle_clock_rate)
            if target is not None and target > proc.wm and proc.pending():
                await self.raw_topic.send(value=orjson.dumps({"wm": target}), partition=partition,
                                          headers=_TICK_HEADERS)

    async def _metrics_view(self, request: Any) -> Any:
        return self.app.web.text(self.metrics.prometheus(), content_type="text/plain")


def _chunks(rows: list[Any], limit: int) -> Iterator[bytes]:
    """orjson lists of ``rows``, split so each is at most ``limit`` bytes (a lone larger row goes alone).

    One record can settle thousands of turns (a tick); a single output record of them all would
    exceed the producer's max request size and the broker's max message size.
    """
    if not rows:
        return
    value = orjson.dumps(rows, option=_JSON)
    if len(value) <= limit or len(rows) == 1:
        yield value
    else:
        half = len(rows) // 2
        yield from _chunks(rows[:half], limit)
        yield from _chunks(rows[half:], limit)


def _credentials(s: Settings) -> Any:
    if s.kafka_security_protocol.startswith("SASL") and s.kafka_sasl_password is not None:
        # without an ssl_context Faust speaks SASL_PLAINTEXT, even when SASL_SSL is configured
        return faust.SASLCredentials(
            username=s.kafka_sasl_username, password=s.kafka_sasl_password.get_secret_value(),
            mechanism=s.kafka_sasl_mechanism,
            ssl_context=_tls_context(s) if s.kafka_security_protocol == "SASL_SSL" else None,
        )
    if s.kafka_security_protocol == "SSL":
        return faust.SSLCredentials(_tls_context(s))
    return None


def _tls_context(s: Settings) -> Any:
    import ssl

    return ssl.create_default_context(cafile=str(s.kafka_ssl_cafile) if s.kafka_ssl_cafile else None)
