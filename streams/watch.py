"""The worker's watch over its own progress: changelog recoveries, and raw partitions that stop moving.

:meth:`WorkerWatch.run` is one task on the worker's event loop, started with the agent (Faust
starts its own timers only after a recovery; this must run during one), and looks once a second:

* **A changelog recovery** is timed and, while it restores, logged every 5 s. A changelog
  partition with records left that receives nothing for ``worker_stall_timeout_s`` is sought back
  once to where Faust's recovery stands; stalled again, the worker leaves the group.
* **A raw partition** with records past the group's committed offset and none processed for
  ``worker_stall_timeout_s`` (judged from the end of the last assignment's recovery) is put back in
  the fetch set and sought back to that committed offset, once (what is not committed is delivered
  again, records processed already included); stalled again, the worker leaves.
* Both first remedies also close any fetch connection whose request is still unanswered
  (:func:`~rewardflow_streams.clientstate.close_unanswered_fetches`), so a fetch a broker never
  answers is asked again at once rather than at the client's request timeout.
* **Leaving** (:meth:`WorkerWatch.leave`): a clean stop through Faust's SIGTERM path (flush, commit,
  leave the group), then exit 75 (:data:`~rewardflow_streams.recovery.EXIT_RECOVERY_STALLED`), so
  a fresh member of the group takes the partitions over; ``rewardflow run`` starts the worker again.

Failure: an exception in one look is logged and the watch goes on. The one blocking call (the
offsets of the assigned raw partitions, an admin round trip) runs in an executor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from rewardflow.settings import Settings
from rewardflow_streams import bulk
from rewardflow_streams.clientstate import close_unanswered_fetches
from rewardflow_streams.metrics import WorkerMetrics
from rewardflow_streams.recovery import (EXIT_RECOVERY_STALLED, RecoveryWatch, fetch_state, snapshot,
                                         stalled_processing)

log = logging.getLogger("rewardflow.streams")


class WorkerWatch:
    """Recovery and processing stall watch of one worker (see the module doc)."""

    def __init__(self, app: Any, settings: Settings, metrics: WorkerMetrics, raw_topic: str,
                 broker_committed: Callable[[list[Any]], dict[Any, int | None]], admin: Callable[[], Any],
                 outputs: Callable[[], str] = lambda: "") -> None:
        """``broker_committed``: the group's committed offsets of some partitions (blocking);
        ``admin``: the worker's confluent-kafka AdminClient; ``outputs``: where the worker's sent
        outputs stand, for a stall's log line."""
        self.app, self.settings, self.metrics = app, settings, metrics
        self.raw_topic = raw_topic
        self._broker_committed, self._admin, self._outputs = broker_committed, admin, outputs
        self.recovery = RecoveryWatch(settings.worker_stall_timeout_s)
        self.exit_code = 0  # set when the worker stops itself (a stall, or an assignment it cannot serve)
        self._progress: dict[int, float] = {}  # raw partition -> when a record of it was last processed
        self._resumed: set[int] = set()  # raw partitions resumed since the assignment
        self._live_since = time.monotonic()  # the last assignment, or the end of its recovery
        self._checked_at = 0.0
        self._restoring_logged = 0.0

    def processed(self, partitions: Iterable[int]) -> None:
        """Records of these raw partitions were just processed."""
        self._progress.update(dict.fromkeys(partitions, time.monotonic()))

    def assigned(self) -> None:
        """A new assignment: every partition is judged afresh from now."""
        self._progress.clear()
        self._resumed.clear()
        self._live_since = time.monotonic()

    async def run(self) -> None:
        """Look once a second, until cancelled."""
        while True:
            await asyncio.sleep(1.0)
            try:
                await self._look()
            except Exception:  # noqa: BLE001 - the watch must outlive an odd snapshot; the worker goes on
                log.exception("watching the changelog recovery failed")

    async def _look(self) -> None:
        """Time each changelog recovery, log what is still restoring, and leave the group when one stalls."""
        now = time.monotonic()
        seen = self.recovery.observe(snapshot(cast(Any, self.app.tables).recovery, now))
        self.metrics.restoring = len(seen.restoring)
        if seen.finished_s is not None:
            self.metrics.recovered(seen.finished_s)
            log.info("changelog recovery finished in %.1f s", seen.finished_s)
        if seen.restoring and now - self._restoring_logged >= 5.0:
            self._restoring_logged = now
            log.info("restoring %d partition(s) from the changelog: %s", len(seen.restoring),
                     ", ".join(f"{tp.partition}: {n} records left" for tp, n in sorted(seen.restoring.items(), key=str)))
        if seen.restoring or seen.finished_s is not None:
            self._live_since = now  # processing is judged from the end of the recovery
        elif not self.exit_code and now - self._checked_at >= 2.0:
            self._checked_at = now
            await self._check_processing(now)
        fresh = [tp for tp in seen.stalled if not self.recovery.nudged(tp)]
        if fresh and not self.exit_code:
            await self._reseek_changelog(fresh, now)
        elif seen.stalled and not self.exit_code:
            self.leave(f"changelog recovery stalled: partition(s) {', '.join(str(tp.partition) for tp in seen.stalled)} "
                       "have records left to restore and received nothing, even after a seek back,")

    async def _reseek_changelog(self, tps: list[Any], now: float) -> None:
        """First remedy for a stalled recovery: seek each partition back to where Faust's recovery stands
        (its last applied offset, as Faust's own recovery seeks), which also resets Faust's read offset."""
        consumer, recovery = self.app.consumer, cast(Any, self.app.tables).recovery
        seen = {tp: fetch_state(consumer, tp) for tp in tps}
        targets = {tp: max(0, recovery.active_offsets.get(tp, -1)) for tp in tps}
        consumer.resume_partitions(set(tps))
        for tp, offset in targets.items():
            await consumer.seek(tp, offset)
        self.recovery.nudge(tps, now)
        self.metrics.counters["stalls_resumed"] += 1
        log.warning("changelog partition(s) %s have records left to restore and received nothing for %.0f s (%s): "
                    "sought back to offset(s) %s%s", ", ".join(str(tp.partition) for tp in tps),
                    self.settings.worker_stall_timeout_s, "; ".join(f"{tp.partition}: {seen[tp]}" for tp in tps),
                    ", ".join(str(targets[tp]) for tp in tps), _closed(consumer))

    async def _check_processing(self, now: float) -> None:
        """Leave the group when an assigned raw partition has records behind and none processed for the timeout."""
        tps = [tp for tp in self.app.consumer.assignment() if tp.topic == self.raw_topic]
        if not tps or self.app.in_recovery or now - self._live_since < self.settings.worker_stall_timeout_s:
            return
        offsets = await asyncio.get_running_loop().run_in_executor(None, self._behind, tps)
        behind = {p: n for p, (n, _) in offsets.items()}
        stalled = stalled_processing(now, self._live_since, self._progress, behind, self.settings.worker_stall_timeout_s)
        fresh = [p for p in stalled if p not in self._resumed]
        if fresh:  # first remedy: back in the fetch set, and sought back to the group's committed offset
            self._resumed.update(fresh)
            consumer = self.app.consumer
            stuck = {tp.partition: tp for tp in tps if tp.partition in fresh}
            seen = {p: fetch_state(consumer, tp, await _position(consumer, tp)) for p, tp in stuck.items()}
            consumer.resume_partitions(set(stuck.values()))
            # what is not committed is delivered again, even records processed already (their outputs keep
            # their ids, so a redelivery is stored once): whatever kept their commit back goes too
            targets = {p: offsets[p][1] for p in stuck}
            for p, tp in stuck.items():
                await consumer.seek(tp, targets[p])
                self._progress[p] = now  # judged again from now
            log.warning("raw partition(s) %s had records to process (%s) and none was processed for %.0f s (%s; %s): "
                        "resumed their fetching from offset(s) %s%s", ", ".join(map(str, fresh)),
                        ", ".join(str(behind[p]) for p in fresh), self.settings.worker_stall_timeout_s,
                        "; ".join(f"{p}: {seen[p]}" for p in fresh), _loop_state(consumer) + self._outputs(),
                        ", ".join(str(targets[p]) for p in fresh), _closed(consumer))
            self.metrics.counters["stalls_resumed"] += 1
        elif stalled and not self.exit_code:
            self.leave(f"raw partition(s) {', '.join(map(str, stalled))} have records to process "
                       f"({', '.join(str(behind[p]) for p in stalled)}; {_loop_state(self.app.consumer)}) and none "
                       "was processed, even after resuming their fetching,")

    def _behind(self, tps: list[Any]) -> dict[int, tuple[int, int]]:
        """Per raw partition: the records past the group's committed offset, and that offset (one blocking
        admin round; {} when the broker cannot say)."""
        from confluent_kafka import TopicPartition
        import confluent_kafka.admin as kafka_admin

        latest = cast(Any, kafka_admin).OffsetSpec.latest()
        committed = self._broker_committed(tps)
        try:
            ends = self._admin().list_offsets({TopicPartition(tp.topic, tp.partition): latest for tp in tps},
                                              request_timeout=10)
            end = {k.partition: f.result(timeout=10).offset for k, f in ends.items()}
        except Exception:  # noqa: BLE001 - unknown this round: nothing is judged stalled
            return {}
        return {tp.partition: (end[tp.partition] - (committed[tp] or 0), committed[tp] or 0)
                for tp in tps if tp.partition in end}

    def leave(self, why: str, stalled: bool = True) -> None:
        """Stop cleanly (flush, commit, leave the group) and exit 75, so that a fresh member takes over.
        ``stalled``: ``why`` lasted the stall timeout (counted in ``recovery_stalls``)."""
        self.exit_code = EXIT_RECOVERY_STALLED
        if stalled:
            self.metrics.counters["recovery_stalls"] += 1
            why += f" for {self.settings.worker_stall_timeout_s:.0f} s (REWARDFLOW_WORKER_STALL_TIMEOUT_S);"
        log.error("%s stopping cleanly and exiting %d so that a fresh member of the group takes them over "
                  "(rewardflow run starts the worker again)", why, EXIT_RECOVERY_STALLED)
        os.kill(os.getpid(), signal.SIGTERM)  # Faust's graceful stop: flush, commit, leave the group


async def _position(consumer: Any, tp: Any) -> int | None:
    """The consumer's fetch position of ``tp``, for a log line; None when it cannot say within 2 s."""
    try:
        async with asyncio.timeout(2.0):
            return cast(int | None, await consumer.position(tp))
    except Exception:  # noqa: BLE001 - a diagnosis only
        return None


def _closed(consumer: Any) -> str:
    """Close the connections whose fetch is still unanswered (:func:`close_unanswered_fetches`), for a
    first remedy's log line: ``"; closed the fetch connection(s) still awaiting an answer: node 1"`` or ''."""
    closed = close_unanswered_fetches(consumer)
    return f"; closed the fetch connection(s) still awaiting an answer: {closed}" if closed else ""


def _loop_state(consumer: Any) -> str:
    """The flow and the fetch loop's stage, for a stall's log line."""
    return f"flow {'on' if getattr(consumer, 'flow_active', None) else 'off'}, fetch loop {bulk.LOOP.describe()}"
