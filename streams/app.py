"""The Faust worker: raw client records in, rewards/windows/dead letters out.

The agent is a thin shell over :class:`rewardflow.core.processor.PartitionProcessor`.
It takes raw records in batches (``worker_batch_records`` or ``worker_batch_s``,
whichever comes first), hands each partition's share to ``process_batch`` and
sends the returned rows. All domain logic (validation, dedup, join, reward,
windows) lives in the core; batching changes no decision, only how often state
is written (once per batch) and how many output records are sent.

Delivery: at-least-once, agent concurrency 1 (faust #606). Output sends and
changelog writes go through Faust's producer, which Faust flushes *before* it
commits offsets; Faust acks a batch only after this agent has processed and
sent it, so a committed offset implies its outputs and state are in Kafka.
An unexpected exception in the core, or a refused output send, stops the
process (exit 70) instead of letting Faust ack the batch. Records Faust's
consumer never delivered are read again (:mod:`rewardflow_streams.gaps`).
Output rows are split into records of at most ``max_record_bytes`` (at most
1 MB); dead letters may reach the dead-letter topic's larger limit, so a
record just over the input limit is dead-lettered whole.

Diagnosis: ``RF_DEBUG_BATCHES=1`` logs one line per processed batch (offsets, committed offset,
watermarks, late/valid counts) at WARNING; at DEBUG level the same lines are logged anyway.

Idle partitions: a timer sends a *tick* record (header ``rf-format: tick``) to
each idle partition of the raw topic, carrying a watermark that follows the
wall clock. Ticks are ordinary records, so replays see the same watermarks.
After a rebalance, a partition nobody writes to gets one no-op tick, so its
state is rebuilt and its idle clock starts.
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
from rewardflow.provision import dead_letter_record_limit
from rewardflow.rewards.registry import active_specs
from rewardflow.settings import Settings
from rewardflow_streams.gaps import GapGuard
from rewardflow_streams.metrics import WorkerMetrics
from rewardflow_streams.state import TableStore

log = logging.getLogger("rewardflow.streams")
_JSON = orjson.OPT_NON_STR_KEYS
_TICK_HEADERS = {"rf-format": b"tick"}
# Output records stay under the broker's default max.message.bytes (1,048,588), which
# ensure_topics does not raise, whatever max_record_bytes allows for input records.
_MAX_OUTPUT_RECORD = 1_000_000
_DEBUG_BATCHES = bool(os.environ.get("RF_DEBUG_BATCHES"))  # per-batch log lines at WARNING (diagnosis)


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
            # outputs and state are written in large bursts (a batch at a time): big batches, lz4
            producer_max_batch_size=1_048_576,
            producer_linger_ms=5,
            producer_compression_type="lz4",
            producer_max_request_size=max(settings.max_record_bytes * 2, dead_letter_record_limit(settings) + 65_536),
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
        self._gaps = GapGuard(self.app, self.metrics, self._broker_committed)
        self._admin: Any = None
        self._assigned_at = 0
        self._woken: set[int] = set()
        # "p:offset,p:offset": records whose first delivery is lost (tests of the gap guard only)
        self._fault_skip = {(int(p), int(o)) for p, o in (x.split(":") for x in
                            os.environ.get("RF_FAULT_SKIP_RAW", "").split(",") if x)}
        self._out_limit = min(settings.max_record_bytes, _MAX_OUTPUT_RECORD)
        self._dead_limit = dead_letter_record_limit(settings)
        self.app.agent(self.raw_topic, name="join", concurrency=1)(self._agent)
        self.app.timer(interval=max(0.2, settings.idle_timeout_s / 2))(self._idle_ticks)
        self.app.on_partitions_assigned.connect(self._on_assigned)
        if web:
            self.app.page("/metrics")(self._metrics_view)

    # ------------------------------------------------------------------ agent
    async def _agent(self, stream: Any) -> None:
        s = self.settings
        async for events in stream.take_events(s.worker_batch_records, within=s.worker_batch_s):
            by_partition: dict[int, list[Any]] = {}
            for event in events:
                if self._fault_skip and self._skipped_by_fault(event.message):
                    continue
                by_partition.setdefault(event.message.partition, []).append(event.message)
            for partition, msgs in by_partition.items():
                await self._process(partition, msgs)

    def _skipped_by_fault(self, msg: Any) -> bool:
        """Fault hook of the tests: lose the first delivery of chosen records, as Faust's consumer can."""
        key = (msg.partition, msg.offset)
        if key not in self._fault_skip:
            return False
        self._fault_skip.discard(key)
        msg.acked = True  # never acked, like a record Faust skipped
        log.warning("fault hook: the first delivery of %s[%d]@%d is lost", msg.topic, msg.partition, msg.offset)
        return True

    async def _process(self, partition: int, msgs: list[Any]) -> None:
        """Process one partition's share of a batch; Faust acks the batch after this returns."""
        if not self._current(msgs):
            return
        proc = self._processor(partition)
        msgs = await self._gaps.admit(proc, partition, msgs)
        if not msgs:
            return
        try:
            self.store.partition = partition
            committed = getattr(self.app.consumer, "_committed_offset", {}).get(msgs[0].tp)
            if committed is None:  # not known to Faust yet: no replay can start before what it delivered
                committed = self._gaps.first_delivered(partition)
            was_ready = proc.ready
            out = proc.process_batch([(m.value, m.headers, m.offset) for m in msgs], _now_ms(), committed)
            if _DEBUG_BATCHES or log.isEnabledFor(logging.DEBUG):
                log.log(logging.WARNING if _DEBUG_BATCHES else logging.DEBUG, "batch p=%d offsets %d..%d (%d) committed=%s rebuilt=%s wm=%s prune_wm=%s late=%d valid=%d",
                          partition, msgs[0].offset, msgs[-1].offset, len(msgs), committed, not was_ready, proc.wm,
                          proc._prune_wm, len(out.late), len(out.valid))
            await self.store.flush()
            await self._emit(out, partition)
        except Exception:  # a bug or a refused send, never bad input: do not let Faust ack it
            log.exception("processing or sending the outputs of %s[%d]@%d..%d failed; exiting without commit",
                          msgs[0].topic, partition, msgs[0].offset, msgs[-1].offset)
            os._exit(70)
        if not self._current(msgs):  # a rebalance happened meanwhile: its recovery may miss these writes
            return
        ticks = sum(1 for m in msgs if record_format(m.headers) == TICK)
        self.metrics.observe(out, records=len(msgs), ticks=ticks)

    def _broker_committed(self, tp: Any) -> int | None:
        """The worker group's committed offset of ``tp`` (blocking admin call; None when none)."""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self.settings.kafka_client_config())
        req = ConsumerGroupTopicPartitions(self.app.conf.id, [TopicPartition(tp.topic, tp.partition)])
        try:
            res = self._admin.list_consumer_group_offsets([req])[self.app.conf.id].result(timeout=10)
        except Exception:  # noqa: BLE001 - unknown: start from the log start, which only widens the check
            log.warning("cannot read the committed offset of %s; assuming the log start", tp, exc_info=True)
            return None
        offset = res.topic_partitions[0].offset
        return offset if offset >= 0 else None

    def _current(self, msgs: list[Any]) -> bool:
        """Whether these messages may be processed now: fetched under the current consumer generation,
        with the flow on. Faust checks this when it delivers a message to a stream; a batch gathered
        before a rebalance reaches the agent after it, while the table may be recovering. Stale ones
        are dropped unacked (Faust seeks back to the committed offset after a rebalance)."""
        gen, active = self.app.consumer_generation_id, self.app.flow_control.is_active()
        if active and all(m.generation_id == gen for m in msgs):
            return True
        for m in msgs:
            m.acked = True  # never acked: Faust cannot commit them
        log.info("%d records of %s[%d] belong to a consumer generation before a rebalance: not acked, "
                 "they are read again",
                 len(msgs), msgs[0].topic, msgs[0].partition)
        return False

    async def _emit(self, out: Outputs, partition: int) -> None:
        """Send the batch's rows, each topic's split into records of at most the output limit.

        Output records are keyed by the source partition: their consumers (the sink) do not
        depend on the key, and one key per batch keeps the records few and large.
        """
        key = str(partition).encode()
        sends = ((T.VALID, out.valid), (T.REWARDS, out.rewards), (T.DEADLETTERS, out.dead),
                 (T.LATE, out.late), (T.EXCLUSIONS, out.excluded), (T.WINDOWS, out.windows))
        for name, rows in sends:
            limit = self._dead_limit if name == T.DEADLETTERS else self._out_limit
            for value in _chunks(rows, limit):
                await self.out_topics[name].send(key=key, value=value)

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
        self._gaps.reset()
        self._assigned_at = _now_ms()
        self._woken.clear()

    # ------------------------------------------------------------------ idle clock
    async def _idle_ticks(self) -> None:
        now = _now_ms()
        timeout_ms = int(self.settings.idle_timeout_s * 1000)
        if now - self._assigned_at >= timeout_ms:
            await self._wake_unread(now)
        for partition, proc in list(self.processors.items()):
            target = proc.idle_target(now, timeout_ms, self.settings.idle_clock_rate)
            if target is not None and target > proc.wm and proc.pending():
                await self.raw_topic.send(value=orjson.dumps({"wm": target}), partition=partition,
                                          headers=_TICK_HEADERS)

    async def _wake_unread(self, now: int) -> None:
        """A no-op tick (watermark 0) to each assigned raw partition with no record read since the
        assignment, once: reading it rebuilds the partition's state, so its idle clock starts and the
        turns it holds finalise even if no client ever writes to it again."""
        raw = self.raw_topic.get_topic_name()
        for tp in self.app.consumer.assignment():
            if tp.topic == raw and tp.partition not in self.processors and tp.partition not in self._woken:
                self._woken.add(tp.partition)
                await self.raw_topic.send(value=b'{"wm": 0}', partition=tp.partition, headers=_TICK_HEADERS)

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
