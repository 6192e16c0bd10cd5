"""The fault hooks of the tests, behind one seam: every ``RF_FAULT_*`` variable is read here, once.

Each hook reproduces, on purpose, something that happens rarely in production, so a test
can prove the worker survives it:

* ``RF_FAULT_SKIP_RAW=p:offset,…``: the first delivery of these raw records is lost, as
  Faust's consumer can lose a record around a rebalance (the gap guard must read it again);
* ``RF_FAULT_FAIL_COMMITS_FROM=p:offset``: commits of raw partition ``p`` past ``offset`` fail
  as aiokafka's ``CommitFailedError: … already rebalanced`` does;
* ``RF_FAULT_DIE_BEFORE_OUTPUTS=<marker path>``: the first batch holding a far-future tick
  (watermark ≥ 2**52) dies after its state writes are acknowledged, before its outputs are sent;
* ``RF_FAULT_RAISE_ON_REQUEST=<request id>``: applying an event of that turn raises in the core;
* ``RF_FAULT_NO_HOLE_READ=1``: the gap guard does not read a hole directly (exercises its seek);
* ``RF_FAULT_STALL_RECOVERY=<marker path>``: while the marker does not exist, the first process
  to install the hooks creates it and never resumes fetching its changelog partitions, so its
  changelog recovery waits for events that never come (Faust's "No event received … since
  recovery start");
* ``RF_FAULT_STALL_RAW=<marker path>``: the same for its raw partitions: recovery completes, and
  the records on the raw topic are never fetched;
* ``RF_FAULT_STALE_READ=<marker path>``: while the marker does not exist, the first seek of the
  raw partitions after a recovery is followed by Faust's read offset moving past every record to
  come (as previous-generation records delivered after the seek move it): the records are
  fetched, and Faust's fetch loop drops them as already read;
* ``RF_FAULT_STALE_CHANGELOG_READ=<marker path>``: the same for the changelog partitions, right
  after a recovery's seek, so the recovery receives nothing though records are fetched;
* ``RF_FAULT_NO_CHANGELOG=<marker path>``: while the marker does not exist, the first process to
  be assigned partitions creates it and sees its assignment without the changelog partitions, as a
  member does whose group leader's metadata lacked the changelog topic;
* ``RF_FAULT_CRASH=<marker path>``: while the marker does not exist, the first process to start
  its agent creates it and one of Faust's background tasks raises, as a changelog topic's
  creation did when a rebalance hit a starting worker (Faust marks the app crashed, logs it and
  goes on serving; the worker must stop itself);
* ``RF_FAULT_CRASH_ON_STOP=<marker path>``: while the marker does not exist, the first process to
  start its agent creates it, and once that process is asked to stop, one of its services crashes
  during the stop, as a changelog topic's creation cancelled by the stop does (the stop asked for
  must still end with exit code 0).

Contract: :meth:`Faults.from_env` with none of them set gives hooks that do nothing; nothing
outside this module reads the variables.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from rewardflow.core.processor import PartitionProcessor
from rewardflow.core.ticks import TICK
from rewardflow.events.wire import record_format

log = logging.getLogger("rewardflow.streams")


@dataclass
class Faults:
    """The hooks a test asked for (see the module doc)."""

    skip_raw: set[tuple[int, int]] = field(default_factory=set)
    fail_commits_from: tuple[int, int] | None = None
    die_marker: str = ""
    raise_on_request: str = ""
    no_hole_read: bool = False
    stall_marker: str = ""
    stall_raw_marker: str = ""
    stale_read_marker: str = ""
    stale_changelog_marker: str = ""
    crash_marker: str = ""
    crash_on_stop_marker: str = ""
    no_changelog_marker: str = ""

    @classmethod
    def from_env(cls) -> Faults:
        env = os.environ
        fail = env.get("RF_FAULT_FAIL_COMMITS_FROM", "")
        return cls(
            skip_raw={(int(p), int(o)) for p, o in (x.split(":") for x in env.get("RF_FAULT_SKIP_RAW", "").split(",") if x)},
            fail_commits_from=(int(fail.split(":")[0]), int(fail.split(":")[1])) if fail else None,
            die_marker=env.get("RF_FAULT_DIE_BEFORE_OUTPUTS", ""),
            raise_on_request=env.get("RF_FAULT_RAISE_ON_REQUEST", ""),
            no_hole_read=bool(env.get("RF_FAULT_NO_HOLE_READ")),
            stall_marker=env.get("RF_FAULT_STALL_RECOVERY", ""),
            stall_raw_marker=env.get("RF_FAULT_STALL_RAW", ""),
            stale_read_marker=env.get("RF_FAULT_STALE_READ", ""),
            stale_changelog_marker=env.get("RF_FAULT_STALE_CHANGELOG_READ", ""),
            crash_marker=env.get("RF_FAULT_CRASH", ""),
            crash_on_stop_marker=env.get("RF_FAULT_CRASH_ON_STOP", ""),
            no_changelog_marker=env.get("RF_FAULT_NO_CHANGELOG", ""),
        )

    def assignment(self, assigned: Any, changelog_topic: str) -> Any:
        """``RF_FAULT_NO_CHANGELOG``: ``assigned`` without its changelog partitions (once, in the first process)."""
        if not _claim(self.no_changelog_marker):
            return assigned
        log.warning("fault hook: this assignment is seen without its changelog partitions")
        return {tp for tp in assigned if tp.topic != changelog_topic}

    def crash(self, app: Any) -> None:
        """``RF_FAULT_CRASH``: a task of one of the app's services raises; ``RF_FAULT_CRASH_ON_STOP``: the
        app crashes during its stop (each once, in the first process)."""
        if _claim(self.crash_marker):

            async def fail() -> None:
                raise asyncio.InvalidStateError("RF_FAULT_CRASH: a background task of Faust's table manager failed")

            app.tables.add_future(fail())
        if _claim(self.crash_on_stop_marker):

            async def fail_on_stop(*_: Any, **__: Any) -> None:
                await app.crash(asyncio.InvalidStateError("RF_FAULT_CRASH_ON_STOP: a service failed during the stop"))

            app.on_before_shutdown.connect(fail_on_stop, weak=False)

    def install(self, consumer: Any, raw_topic: str, changelog_topic: str = "") -> None:
        """Install the hooks that replace code: the failing commit, the raising core, the stalled recovery."""
        for marker, topic in ((self.stall_marker, changelog_topic), (self.stall_raw_marker, raw_topic)):
            if topic and _claim(marker):
                _never_resume(consumer, topic)
        if self.stale_read_marker and not os.path.exists(self.stale_read_marker):
            _read_past(consumer, raw_topic, self.stale_read_marker)
        if self.stale_changelog_marker and changelog_topic and not os.path.exists(self.stale_changelog_marker):
            _read_past_changelog(consumer, changelog_topic, self.stale_changelog_marker)
        if self.fail_commits_from is not None:
            _fail_commits(consumer, raw_topic, *self.fail_commits_from)
        if self.raise_on_request:
            _raise_on(self.raise_on_request)

    def skipped(self, msg: Any) -> bool:
        """Whether this delivery of ``msg`` is to be lost (never acked, like a record Faust skipped)."""
        key = (msg.partition, msg.offset)
        if key not in self.skip_raw:
            return False
        self.skip_raw.discard(key)
        msg.acked = True
        log.warning("fault hook: the first delivery of %s[%d]@%d is lost", msg.topic, msg.partition, msg.offset)
        return True

    async def die_before_outputs(self, msgs: list[Any], confirm: Callable[[], Awaitable[None]]) -> None:
        """Exit (code 9) once the state writes of a batch with a far-future tick are acknowledged, before
        its outputs are sent, leaving the marker file; only while the marker does not exist."""
        marker = self.die_marker
        if not marker or os.path.exists(marker):
            return
        if not any(record_format(m.headers) == TICK and orjson.loads(m.value or b"{}").get("wm", 0) >= 2**52
                   for m in msgs):
            return
        await confirm()
        with open(marker, "w") as f:
            f.write(f"{msgs[0].partition}:{msgs[0].offset}..{msgs[-1].offset}")
        log.warning("fault hook: dying after the state writes of %s[%d]@%d..%d, before its outputs",
                    msgs[0].topic, msgs[0].partition, msgs[0].offset, msgs[-1].offset)
        logging.shutdown()
        os._exit(9)


def _fail_commits(consumer: Any, raw: str, partition: int, limit: int) -> None:
    """A commit of ``raw`` partition ``partition`` past ``limit`` returns False (the other partitions'
    offsets are committed), and Faust's ``_committed_offset`` moves on all the same."""
    real = consumer._commit

    async def commit(offsets: Any) -> bool:
        refused = {tp: off for tp, off in offsets.items()
                   if tp.topic == raw and tp.partition == partition and off > limit}
        if not refused:
            return bool(await real(offsets))
        log.warning("fault hook: commit of %s[%d] to %d refused", raw, partition, max(refused.values()))
        rest = {tp: off for tp, off in offsets.items() if tp not in refused}
        if rest:
            await real(rest)
        return False

    consumer._commit = commit


def _never_resume(consumer: Any, topic: str) -> None:
    """Faust pauses the partitions of a rebalance and resumes them to restore (changelog) or to
    process (raw); here the partitions of ``topic`` stay paused."""
    real = consumer.resume_partitions

    def resume(tps: Any) -> Any:
        kept = {tp for tp in tps if tp.topic != topic}
        if len(kept) != len(set(tps)):
            log.warning("fault hook: the partitions of %s stay paused (their progress will stall)", topic)
        return real(kept)

    consumer.resume_partitions = resume


def _read_past(consumer: Any, topic: str, marker: str) -> None:
    """After the first seek of ``topic``'s raw partitions following a recovery, Faust's read offset of
    each is moved far past its end, once (the marker records it). It is moved during that seek too:
    Faust resumes the raw partitions before it, so a fetch can already return their records then."""
    real = consumer.perform_seek

    async def perform_seek() -> None:
        tps = [tp for tp in consumer.assignment() if tp.topic == topic]
        if tps and not os.path.exists(marker):
            for tp in tps:
                consumer._read_offset[tp] = 2**40
        await real()
        _move_read_offsets(tps, consumer, marker, "to come")

    consumer.perform_seek = perform_seek


def _read_past_changelog(consumer: Any, topic: str, marker: str) -> None:
    """After the first recovery seek of ``topic``'s changelog partitions, the same."""
    real = consumer.seek_wait

    async def seek_wait(partitions: Any) -> None:
        await real(partitions)
        _move_read_offsets([tp for tp in partitions if tp.topic == topic], consumer, marker, "to restore")

    consumer.seek_wait = seek_wait


def _claim(marker: str) -> bool:
    """Whether this process fires a once-only hook: true in the first process to find ``marker`` (a
    path; empty: the hook is off) missing, which creates it with its pid."""
    if not marker or os.path.exists(marker):
        return False
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    return True


def _move_read_offsets(tps: list[Any], consumer: Any, marker: str, what: str) -> None:
    if not tps or not _claim(marker):
        return
    for tp in tps:
        consumer._read_offset[tp] = 2**40
    log.warning("fault hook: Faust's read offset of %s is moved past every record %s", tps[0].topic, what)


def _raise_on(request_id: str) -> None:
    real = PartitionProcessor._apply

    def apply(self: PartitionProcessor, st: Any, ev: Any, *args: Any) -> None:
        if ev.request_id == request_id:
            raise RuntimeError(f"fault hook: an event of {request_id} raises")
        real(self, st, ev, *args)

    setattr(PartitionProcessor, "_apply", apply)  # noqa: B010 - replacing a method is the hook
    log.warning("fault hook: events of turn %s raise in the core", request_id)
