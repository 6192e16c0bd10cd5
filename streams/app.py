"""The Faust worker: raw client records in, rewards/windows/dead letters out.

The worker is a thin shell over :class:`rewardflow.core.processor.PartitionProcessor`.
It takes the raw records of each consumer fetch (up to ``worker_batch_records``) as one batch
(:mod:`rewardflow_streams.bulk`, past Faust's per-record delivery; the agent only keeps the raw
topic subscribed), hands each partition's share to ``process_batch`` and sends the returned
rows. All domain logic (validation, dedup, join, reward, windows) lives in the core; batching
changes no decision, only how often state is written (once per batch) and how many output
records are sent.

Delivery: at-least-once. Output rows and changelog writes go through a librdkafka producer
(:mod:`rewardflow_streams.sender`); a batch's records are acked only once its outputs and state
writes are acknowledged, so a committed offset implies they are in Kafka. The next batch is
processed while they are in flight (one batch at most). Before partitions are revoked, every
output and state write queued is acknowledged, so the next owner's restore sees them all; a batch
whose partition a rebalance took while it waited is dropped unprocessed. An unexpected exception
in the core, or a refused output send, stops the process (exit 70) without acking the batch. Records Faust's
consumer never delivered are read again (:mod:`rewardflow_streams.gaps`).
Output rows are split into records of at most ``max_record_bytes`` (at most
1 MB); dead letters may reach the dead-letter topic's larger limit, so a
record just over the input limit is dead-lettered whole.

Diagnosis: ``RF_DEBUG_BATCHES=1`` logs one line per processed batch (offsets, committed offset,
watermarks, late/valid counts) and the seconds spent per stage so far at WARNING; at DEBUG level
the batch lines are logged anyway. ``/metrics`` always has the stage seconds
(``rewardflow_stage_seconds_total{stage=wait|admit|process|encode|confirm}``).

Stalls: :mod:`rewardflow_streams.watch` times each changelog recovery and watches every raw
partition's progress; a stall it cannot undo makes the worker leave the group (exit 75).

Idle partitions: a timer sends a *tick* record (header ``rf-format: tick``) to
each idle partition of the raw topic, carrying a watermark that follows the
wall clock, signed with the deployment's tick key (:mod:`rewardflow.core.ticks`;
the core dead-letters a tick it cannot verify). Ticks are ordinary records, so
replays see the same watermarks. Each record's broker timestamp (the raw topic
stamps LogAppendTime) goes to the core with it: it bounds the event time of what
the record carries, so no client clock moves a watermark past it.
After a rebalance, a partition nobody writes to gets one no-op tick, so its
state is rebuilt and its idle clock starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, cast

import faust

from rewardflow.kafka import topics as T
from rewardflow.core.config import JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import PartitionProcessor
from rewardflow.core.ticks import TICK, TICK_HEADERS, signed_tick
from rewardflow.kafka.provision import changelog_configs, changelog_topic, dead_letter_record_limit, state_record_limit
from rewardflow.rewards.registry import active_specs
from rewardflow.events.wire import record_format
from rewardflow.settings import Settings, tick_key
from rewardflow_streams import bulk
from rewardflow_streams.commits import CommitLedger, install_unique_acks
from rewardflow_streams.credentials import faust_credentials
from rewardflow_streams.faults import Faults
from rewardflow_streams.gaps import GapGuard
from rewardflow_streams.lookups import BrokerLookups
from rewardflow_streams.metrics import Tally, WorkerMetrics
from rewardflow_streams.recovery import unrestored
from rewardflow_streams.sender import OutputSender, SendFailed
from rewardflow_streams.state import TableStore
from rewardflow_streams.stops import CommitStops
from rewardflow_streams.watch import WorkerWatch

log = logging.getLogger("rewardflow.streams")
_TICK_HEADERS = dict(TICK_HEADERS)
_TICK_ITEM = TICK_HEADERS[0]  # in the headers of every tick: a cheap test before record_format's
# Output records stay under the broker's default max.message.bytes (1,048,588), which
# ensure_topics does not raise, whatever max_record_bytes allows for input records.
_MAX_OUTPUT_RECORD = 1_000_000
_DEBUG_BATCHES = os.environ.get("RF_DEBUG_BATCHES", "") not in ("", "0")  # per-batch log lines at WARNING (diagnosis)


def _now_ms() -> int:
    return int(time.time() * 1000)


class JoinWorker:
    """Faust app, topics, table and agent for one deployment's settings."""

    def __init__(self, settings: Settings, *, web: bool = True) -> None:
        self.settings = settings
        self.tick_key = tick_key(settings)
        self.cfg = JoinConfig.from_settings(settings, tick_key=self.tick_key)
        self.specs = active_specs(settings)
        self.metrics = WorkerMetrics(settings.dead_letter_ratio_limit, settings.dead_letter_window_s)
        self.processors: dict[int, PartitionProcessor] = {}
        datadir = settings.home / "worker-data"  # Faust's own files (the tables live in memory and the changelog)
        datadir.mkdir(parents=True, exist_ok=True)
        self.app = faust.App(
            settings.topic("worker"),
            datadir=str(datadir / settings.topic("worker")),
            broker=f"kafka://{settings.kafka_bootstrap}",
            broker_credentials=faust_credentials(settings),
            store="memory://",
            topic_partitions=settings.partitions,
            # (the topics exist before a worker starts, made with the cluster's default when unset: ensure_topics)
            topic_replication_factor=settings.topic_replication_factor or 1,
            autodiscover=False,
            # No leader topic: nothing here needs a leader, and its one partition never holds a record.
            # Fetched alone (while the raw partitions still had records buffered), it made the broker
            # hold the fetch for Faust's fetch_max_wait_ms (1.5 s), and with it every raw partition's
            # next fetch: the worker owning it waited 0.5-0.9 s a fetch.
            topic_disable_leader=True,
            web_enabled=web,
            web_bind=settings.web_host,
            web_host=settings.web_host,
            web_port=settings.worker_metrics_port or settings.web_port + 1,
            producer_acks=-1,
            # Faust's own producer now sends only idle ticks and Faust's internal records; outputs
            # and state writes go through the OutputSender (librdkafka)
            producer_max_batch_size=1_048_576,
            producer_linger_ms=5,
            producer_compression_type="lz4",
            producer_max_request_size=max(settings.max_record_bytes * 2, dead_letter_record_limit(settings) + 65_536),
            consumer_auto_offset_reset="earliest",
            stream_wait_empty=False,
            table_standby_replicas=settings.table_standby_replicas,
            broker_commit_interval=1.0,
            broker_max_poll_records=settings.worker_batch_records,  # a fetch is one batch (bulk.py)
            consumer_max_fetch_size=settings.worker_fetch_bytes,  # (aiokafka's max_partition_fetch_bytes)
            broker_session_timeout=settings.group_session_timeout_s,
            # a member learns of a rebalance at its next heartbeat: a worker that joins a running one
            # (rewardflow run --workers N starts them together; one joins first) waits at most 1 s
            broker_heartbeat_interval=min(1.0, settings.group_session_timeout_s / 3),
            TableManager=CommitLedger,  # records only the commits the broker confirmed
        )
        self.raw_topic = self.app.topic(settings.topic(T.RAW), partitions=settings.partitions,
                                        key_serializer="raw", value_serializer="raw")
        self.out_names = {name: settings.topic(name)
                          for name in (T.VALID, T.REWARDS, T.WINDOWS, T.DEADLETTERS, T.LATE, T.EXCLUSIONS)}
        # value_type=bytes makes the changelog topic itself "raw" (orjson bytes written by TableStore):
        # a table.value_serializer set after the table is made leaves recovery decoding it as JSON.
        # The changelog takes the largest state the session limits allow (state_record_limit); the
        # store refuses larger values up front, since a refused changelog send is only logged by Faust.
        changelog_max = state_record_limit(settings)
        self.table = self.app.Table("join-state", default=None, partitions=settings.partitions,
                                    key_type=str, value_type=bytes,
                                    extra_topic_configs=changelog_configs(settings))
        self.sender = OutputSender(
            settings.kafka_client_config(), client_id=settings.topic("worker-out"),
            max_message_bytes=max(changelog_max, dead_letter_record_limit(settings)),
        )
        self.store = TableStore(self.table, self.sender, max_bytes=changelog_max - 4096,
                                decoded_cache=settings.worker_state_cache,
                                decoded_cache_bytes=settings.worker_state_cache_mb << 20)
        self.lookups = BrokerLookups(settings.kafka_client_config(), self.app.conf.id, self.raw_topic.get_topic_name())
        self._gaps = GapGuard(self.app, self.metrics, self.lookups.committed, self.lookups.log_starts,
                              settings.kafka_client_config())
        self._assigned_at = 0
        self._woken: set[int] = set()
        self.faults = Faults.from_env()  # fault hooks of the tests (none unless RF_FAULT_* is set)
        self._gaps.no_hole_read = self.faults.no_hole_read
        self._out_limit = min(settings.max_record_bytes, _MAX_OUTPUT_RECORD)
        self._dead_limit = dead_letter_record_limit(settings)
        self.app.agent(self.raw_topic, name="join", concurrency=1)(self._agent)
        self._clock = time.perf_counter()  # the end of the last batch (the "wait" stage runs from it)
        self._confirming: asyncio.Future[None] | None = None  # the acks of the batch last sent
        bulk.install(self.app.consumer, self.raw_topic.get_topic_name(), self._handle)
        install_unique_acks(self.app.consumer)
        self.app.timer(interval=max(0.2, settings.idle_timeout_s / 2))(self._idle_ticks)
        self.watch = WorkerWatch(self.app, settings, self.metrics, self.raw_topic.get_topic_name(),
                                 self.lookups.committed, self.lookups.admin, self._outputs_state)
        self._unrestored: set[int] = set()  # raw partitions assigned without their changelog partition
        self.stops = CommitStops(lambda: self.app.consumer, self._committed, self._current, self.metrics)
        self._watching: asyncio.Task[None] | None = None
        self.app.on_partitions_assigned.connect(cast(Any, self._on_assigned))
        self.app.on_partitions_revoked.connect(cast(Any, self._on_revoked))
        if web:
            self.app.page("/metrics")(cast(Any, self._metrics_view))

    # ------------------------------------------------------------------ agent
    async def _agent(self, stream: Any) -> None:
        """Set up at start; then wait. The agent keeps the raw topic subscribed with acks enabled, but
        its records reach :meth:`_handle` through :mod:`rewardflow_streams.bulk`, never the stream."""
        self.faults.install(self.app.consumer, self.raw_topic.get_topic_name(), changelog_topic(self.settings))
        self.faults.crash(self.app)
        if self._watching is None:  # Faust starts its timers only after a recovery: this one must run during it
            self._watching = asyncio.ensure_future(self.watch.run())
        async for event in stream:  # pragma: no cover - a raw record on Faust's route would be acked unprocessed
            log.error("a raw record reached the agent's stream (%s[%d]@%d) instead of the bulk route; exiting "
                      "without commit", event.message.topic, event.message.partition, event.message.offset)
            os._exit(70)

    async def _handle(self, messages: list[Any]) -> None:
        """Process one fetch's raw records (each partition's share in offset order) and send the results.

        The batch's records are acked (:meth:`_ack`) once its outputs and state writes are confirmed,
        so a committed offset implies both are in Kafka; the next batch is processed meanwhile, and
        returns only once this one is acked. Records the gap guard read directly are not acked (Faust
        learns of them through its gap intervals), nor are stale ones (:meth:`_current`).
        """
        timed = self.metrics.time
        start = time.perf_counter()
        timed("wait", start - self._clock)
        by_partition: dict[int, list[Any]] = {}
        for m in messages:
            if self.faults.skip_raw and self.faults.skipped(m):
                continue  # as if Faust never delivered it: not acked, so the gap guard must read it again
            by_partition.setdefault(m.partition, []).append(m)
        self.watch.processed(by_partition)  # per partition, not per record
        done: list[tuple[list[Any], Tally]] = []
        for partition, msgs in by_partition.items():
            done += await self._process(partition, msgs)
        number = self.sender.mark()
        previous, self._confirming = self._confirming, asyncio.ensure_future(self._ack(number, done, messages))
        mark = time.perf_counter()
        if previous is not None:  # one batch in flight while the next is processed, never more
            await previous
        self._clock = time.perf_counter()
        timed("confirm", self._clock - mark)
        if _DEBUG_BATCHES:
            log.warning("stage seconds so far: %s", {k: round(v, 3) for k, v in self.metrics.stage_seconds.items()})

    async def _ack(self, number: int, done: list[tuple[list[Any], Tally]], messages: list[Any]) -> None:
        """Once batch ``number``'s outputs and state writes are acknowledged, ack its fetched messages.

        Runs while the next batch is processed. Anything but a send failure here is a bug: the worker
        exits without commit rather than leave the batch neither acked nor replayed.
        """
        try:
            await self._confirm(done, number)
            fetched, consumer = set(map(id, messages)), self.app.consumer
            for msgs, _ in done:
                bulk.ack_all(consumer, [m for m in msgs if id(m) in fetched])
        except Exception:
            log.exception("acking a confirmed batch failed; exiting without commit")
            os._exit(70)

    async def _confirm(self, done: list[tuple[list[Any], Tally]], number: int) -> None:
        """Wait for batch ``number``'s outputs and state writes to be acknowledged, then count what is kept.

        Faust commits only acked messages, so the batch is acked only after this returns; a failure
        exits without commit (the batch is replayed).
        """
        await self._sent(number)
        for msgs, tally in done:
            if not self._current(msgs):  # a rebalance happened meanwhile: its recovery may miss these writes
                continue
            ticks = sum(1 for m in msgs if _TICK_ITEM in (m.headers or ()) and record_format(m.headers) == TICK)
            self.metrics.observe(tally, records=len(msgs), ticks=ticks)
        self.metrics.counters["state_reads"] = self.store.reads
        self.metrics.counters["state_decodes"] = self.store.decodes

    async def _sent(self, number: int) -> None:
        """Wait until the sends of batches up to ``number`` (``OutputSender.mark``) are acknowledged; exit
        without commit (70) if one failed."""
        try:
            await self.sender.confirm(number)
        except SendFailed:
            log.exception("the outputs or state writes of a batch were not acknowledged; exiting without commit")
            os._exit(70)

    async def _process(self, partition: int, msgs: list[Any]) -> list[tuple[list[Any], Tally]]:
        """Process one partition's share of a batch and queue its state writes and outputs.

        Returns the messages processed and the :class:`Tally` of their outputs (the rows themselves
        are freed once queued for sending), in one or more parts; none when none may be processed now.
        The caller confirms the sends before Faust acks the batch. A part ends early when the core asks
        for a commit first (``process_batch(until_commit=True)``: a session's tombstones kept for the
        uncommitted records reached its limits): it is then confirmed, acked and committed
        (:meth:`_commit_through`) before the rest.
        """
        if not self._current(msgs):
            return []
        if partition in self._unrestored:
            for m in msgs:
                m.acked = True  # never acked: Faust cannot commit them, and the next owner reads them again
            return []
        proc = self._processor(partition)
        timed, mark = self.metrics.time, time.perf_counter()
        generation = self.app.consumer_generation_id
        admitted = await self._gaps.admit(proc, partition, msgs)
        timed("admit", time.perf_counter() - mark)
        # admit may wait on the broker: a rebalance meanwhile revoked the partition, or gave it back
        # with its state to restore anew, and these messages are stale
        if self.app.consumer_generation_id != generation or not self.app.flow_control.is_active():
            self._current(msgs)  # (now False: they are never acked, and it says so)
            return []
        parts: list[tuple[list[Any], Tally]] = []
        msgs = admitted
        while msgs:
            n, tally = await self._process_part(proc, partition, msgs)
            parts.append((msgs[:n], tally))
            if n == len(msgs):
                break
            await self._commit_through(partition, msgs[:n])
            msgs = msgs[n:]
            if not self._current(msgs):  # a rebalance while the commit waited
                break
        return parts

    async def _process_part(self, proc: PartitionProcessor, partition: int, msgs: list[Any]) -> tuple[int, Tally]:
        """Run ``msgs`` through the core and queue the results; how many it processed (a prefix), and their
        :class:`Tally`. Any exception is a bug or a refused send, never bad input: the worker exits (70)."""
        timed = self.metrics.time
        try:
            self.store.partition = partition
            committed = self._committed(msgs[0].tp, partition)
            was_ready = proc.ready
            mark = time.perf_counter()
            out = proc.process_batch([(m.value, m.headers, m.offset, _record_ms(m)) for m in msgs], _now_ms(), committed,
                                     until_commit=self.stops.allowed(partition))
            n = proc.consumed
            timed("process", time.perf_counter() - mark)
            if _DEBUG_BATCHES or log.isEnabledFor(logging.DEBUG):
                log.log(logging.WARNING if _DEBUG_BATCHES else logging.DEBUG, "batch p=%d offsets %d..%d (%d) committed=%s rebuilt=%s wm=%s prune_wm=%s late=%d valid=%d",
                          partition, msgs[0].offset, msgs[n - 1].offset, n, committed, not was_ready, proc.wm,
                          proc.prune_wm, len(out.late), len(out.valid))
            mark = time.perf_counter()
            self.store.send_queued()
            if self.faults.die_marker:
                await self.faults.die_before_outputs(msgs[:n], self.sender.confirm)
            self._emit(out, partition)
            tally = Tally.of(out)  # kept until the batch is confirmed; the rows are sent, and go now
            timed("encode", time.perf_counter() - mark)
        except Exception:  # a bug or a refused send, never bad input: do not let Faust ack it
            log.exception("processing or sending the outputs of %s[%d]@%d..%d failed; exiting without commit",
                          msgs[0].topic, partition, msgs[0].offset, msgs[-1].offset)
            os._exit(70)
        return n, tally

    async def _commit_through(self, partition: int, msgs: list[Any]) -> None:
        """Have the source commit pass ``msgs`` (a processed part of one partition) before the rest of its
        batch: once the batch in flight is acked and this part's sends are confirmed
        (:meth:`~rewardflow_streams.stops.CommitStops.commit_through`)."""
        if self._confirming is not None:  # its records come before these: acked first
            await self._confirming
        await self._sent(self.sender.mark())
        await self.stops.commit_through(partition, msgs)

    def _committed(self, tp: Any, partition: int) -> int | None:
        """An offset of ``tp`` no replay can start below: the highest of the broker's committed
        offset at the assignment and every commit since that the broker confirmed. Never Faust's
        ``_committed_offset``, which also moves on a failed commit (:mod:`rewardflow_streams.commits`)."""
        ledger = cast(CommitLedger, self.app.tables)
        known = [c for c in (self._gaps.start_offset(partition), ledger.confirmed.get(tp)) if c is not None]
        return max(known) if known else None

    def close_clients(self) -> None:
        """Close the Kafka clients this worker made itself (the group's offsets reader); after the app stopped."""
        self.lookups.close()

    @property
    def exit_code(self) -> int:
        """Nonzero once the worker stopped itself (:meth:`WorkerWatch.leave`): its process's exit code."""
        return self.watch.exit_code

    def _outputs_state(self) -> str:
        """``, outputs: 0 records unconfirmed, last batch acked``: for the stall watch's log lines."""
        last = self._confirming
        acks = "none sent" if last is None else "acked" if last.done() else "waiting for its outputs"
        return f", outputs: {self.sender.pending} records unconfirmed, last batch {acks}"

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

    def _emit(self, out: Outputs, partition: int) -> None:
        """Send the batch's rows, each topic's split into records of at most the output limit.

        Output records are keyed by the source partition: their consumers (the sink) do not
        depend on the key, and one key per batch keeps the records few and large.
        """
        key = str(partition).encode()
        sends = ((T.VALID, out.valid), (T.REWARDS, out.rewards), (T.DEADLETTERS, out.dead),
                 (T.LATE, out.late), (T.EXCLUSIONS, out.excluded), (T.WINDOWS, out.windows))
        for name, rows in sends:
            limit = self._dead_limit if name == T.DEADLETTERS else self._out_limit
            self.sender.send_rows(self.out_names[name], rows, limit, key, str_keys=name == T.VALID)

    def _processor(self, partition: int) -> PartitionProcessor:
        proc = self.processors.get(partition)
        if proc is None:
            proc = PartitionProcessor(self.cfg, self.specs, self.store, self.settings.topic(T.RAW), partition)
            # Idle time counts from when this worker took the partition. Left at 0, a restart whose
            # first record read is a tick made the next idle tick carry maxts + now x rate (year ~4800).
            proc.last_event_wall = _now_ms()
            self.processors[partition] = proc
        return proc

    async def _on_revoked(self, app: Any, revoked: Any, **_: Any) -> None:
        """Before partitions are handed over: wait until every output and state write queued so far
        is acknowledged, as Faust flushes its own producer then. A state write still in flight
        could otherwise reach the changelog after the next owner restored from it, and replace
        the state that owner wrote since. A write that fails for good stops the worker (exit 70)."""
        try:
            await self.sender.confirm()
        except SendFailed:
            log.exception("outputs or state writes were not acknowledged before a rebalance; exiting without commit")
            os._exit(70)

    async def _on_assigned(self, app: Any, assigned: Any, **_: Any) -> None:
        """Any rebalance invalidates derived state: rebuild on each partition's next record.

        A raw partition assigned without its changelog partition would be processed from empty
        state (:func:`~rewardflow_streams.recovery.unrestored`): none of its records is processed,
        and the worker leaves the group."""
        changelog = self.table.changelog_topic.get_topic_name()
        self._unrestored = unrestored(self.faults.assignment(assigned, changelog), self.raw_topic.get_topic_name(),
                                      changelog)
        if self._unrestored and not self.exit_code:
            self.watch.leave(f"raw partition(s) {', '.join(map(str, sorted(self._unrestored)))} were assigned without "
                        "their changelog partitions (the group leader's metadata lacks the changelog topic), so "
                        "their state would not be restored;", stalled=False)
        raw = self.raw_topic.get_topic_name()
        mine = sorted(tp.partition for tp in assigned if tp.topic == raw)
        log.info("assigned %s partition(s) %s", raw, ", ".join(map(str, mine)) if mine else "none (a spare)")
        self.processors.clear()
        self._gaps.reset()
        self.watch.assigned()
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
                await self.raw_topic.send(value=self._tick(target), partition=partition, headers=_TICK_HEADERS)

    async def _wake_unread(self, now: int) -> None:
        """A no-op tick (watermark 0) to each assigned raw partition with no record read since the
        assignment, once: reading it rebuilds the partition's state, so its idle clock starts and the
        turns it holds finalise even if no client ever writes to it again."""
        raw = self.raw_topic.get_topic_name()
        for tp in self.app.consumer.assignment():
            if tp.topic == raw and tp.partition not in self.processors and tp.partition not in self._woken:
                self._woken.add(tp.partition)
                await self.raw_topic.send(value=self._tick(0), partition=tp.partition, headers=_TICK_HEADERS)

    def _tick(self, wm: int) -> bytes:
        """A tick's value, signed with the deployment's key (the core refuses unsigned ones)."""
        return signed_tick(self.tick_key, self.raw_topic.get_topic_name(), wm)

    async def _metrics_view(self, request: Any) -> Any:
        return self.app.web.text(self.metrics.prometheus(), content_type="text/plain")


def _record_ms(msg: Any) -> int | None:
    """A message's broker timestamp in ms (Faust gives seconds); the raw topic stamps LogAppendTime."""
    ts = msg.timestamp
    return None if ts is None else round(ts * 1000)
