"""The processes of one fault-test deployment, and how to tell that it has drained.

* the stream worker: :class:`tests.streams.worker.WorkerProcess` (a subprocess
  that can be SIGKILLed and restarted), with :data:`~tests.fault.workload.FAULT_SETTINGS`;
* the sink in this process: :class:`SinkThread` (``RewardSink.run`` in a thread,
  optional ``fault`` hook), for a ClickHouse engine this process owns;
* the sink in a subprocess: :class:`SinkProcess` (``python -m tests.fault.sinkproc``,
  a :class:`~rewardflow.demo.worker_proc.ChildProcess`), which can kill itself
  between an insert and its offset commit.

:func:`wait_drained` returns once the worker has committed the whole raw topic
and then the sink has committed every output topic (so every output row is in
ClickHouse), or raises with the lags it saw.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from rewardflow.kafka import topics as T
from rewardflow.sink.route import RewardSink
from rewardflow.demo.worker_proc import ChildProcess, WorkerProcess, settings_env
from rewardflow.kafka.lag import pipeline_lag, sink_group
from rewardflow.settings import Settings
from tests.streams.kafka_io import LIBRDKAFKA_LOG

REPO = Path(__file__).resolve().parents[2]


def release_admin(worker: WorkerProcess) -> None:
    """:meth:`~rewardflow.demo.worker_proc.WorkerProcess.release_admin`: destroy its admin client while the broker is healthy."""
    worker.release_admin()


class SinkThread:
    """``RewardSink.run`` on a thread; :meth:`stop` sets its stop event and joins (close flushes, commits)."""

    def __init__(self, settings: Settings, fault: Callable[[str], None] | None = None) -> None:
        self.sink = RewardSink(settings, group_id=sink_group(settings), fault=fault)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-sink", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.sink.run(self._stop)
        except BaseException as exc:  # noqa: BLE001 - surfaced by check()
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the sink thread died: {self.error!r}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "sink thread did not stop within 60 s"


class SinkProcess(ChildProcess):
    """``python -m tests.fault.sinkproc run`` with ``settings`` in its environment; log appended to ``workdir/sink.log``."""

    name = "sink"
    stop_timeout = 60.0

    def __init__(self, settings: Settings, workdir: Path) -> None:
        super().__init__(settings, workdir / "sink.log", [sys.executable, "-m", "tests.fault.sinkproc", "run"],
                         cwd=REPO, detach=True)
        for k in [k for k in self.env if k.startswith("RF_FAULT_")]:
            del self.env[k]
        self.report_path = workdir / "sink-fault.json"

    def start(self, kill_at_commit: int = 0, stop_merges: bool = True) -> None:
        self.env.update(RF_FAULT_KILL_AT_COMMIT=str(kill_at_commit), RF_FAULT_REPORT=str(self.report_path),
                        RF_FAULT_STOP_MERGES="1" if stop_merges else "0")
        self._note(f"kill at commit #{kill_at_commit}")
        super().start()


def committed(settings: Settings, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offset of every output-topic partition (negative: none committed)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**settings.kafka_client_config(), "group.id": group, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(settings.topic(n), p) for n in T.OUTPUT_TOPICS for p in range(settings.partitions)]
        return {(tp.topic, tp.partition): tp.offset for tp in c.committed(tps, timeout=10)}
    finally:
        c.close()


def read_results(settings: Settings, env: dict[str, str] | None = None) -> dict[str, Any]:
    """:func:`tests.fault.verify.collect` of the sink's database, read by a subprocess.

    For a chDB directory this process does not own (one process per directory);
    the sink that owned it must have exited.
    """
    import orjson

    proc = subprocess.run([sys.executable, "-m", "tests.fault.sinkproc", "read"], cwd=REPO, capture_output=True,
                          env={**(env or os.environ), **settings_env(settings)}, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return orjson.loads(proc.stdout)  # type: ignore[no-any-return]


def lags(settings: Settings) -> tuple[int | None, int | None]:
    """(worker lag on the raw topic, ticks included, sink lag summed over the output topics); None = no answer."""
    lag = pipeline_lag(settings, skip_ticks=False)
    return lag.worker, lag.sink


def wait_drained(settings: Settings, timeout: float, alive: Callable[[], Any] | None = None) -> float:
    """Block until both lags are 0 twice in a row; returns the seconds waited."""
    start = time.monotonic()
    seen: tuple[int | None, int | None] = (None, None)
    zero_twice = 0
    while True:
        if alive is not None:
            alive()
        seen = lags(settings)
        zero_twice = zero_twice + 1 if seen == (0, 0) else 0
        if zero_twice >= 2:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not drained within {timeout:.0f}s: (worker lag, sink lag) = {seen}")
        time.sleep(0.5)


def feed(deployment: Any, ch_db: Any, stack: Any, seed: int, **sizes: int) -> tuple[Any, SinkThread, Any]:
    """The usual start of a fault test: the workload of ``seed`` (``sizes``: build_workload's sessions and
    turns), merges stopped (so stored duplicates are counted), a sink thread and an avro
    :class:`~tests.fault.sender.Sender`, both registered on ``stack`` for teardown. Returns (workload, sink, sender)."""
    from tests.fault.sender import Sender
    from tests.fault.verify import stop_merges
    from tests.fault.workload import build_workload

    workload = build_workload(deployment.settings, seed, **sizes)
    stop_merges(ch_db.client)
    sink = SinkThread(deployment.sink_settings(ch_db.dsn.secret))
    stack.callback(sink.stop)
    sender = Sender(deployment.settings, wire_format="avro")
    stack.callback(sender.close)
    return workload, sink, sender


def restart_stalled(workers: list[Any], restarted: list[str]) -> None:
    """Start again each worker that left a stall (exit 75), as ``rewardflow run`` does; note its name."""
    from rewardflow_streams.recovery import EXIT_RECOVERY_STALLED

    for w in workers:
        if not w.alive and w.proc is not None and w.proc.returncode == EXIT_RECOVERY_STALLED:
            restarted.append(w.log_path.parent.name)
            w.start()


def caught_up_after(settings: Settings, started: float, bound: float, members: int, supervise: Any) -> float:
    """Seconds from ``started`` until the group is stable with ``members`` members sharing every raw
    partition and has committed every raw record that exists then (``supervise()`` is called while
    waiting). Judged from the membership first, so a join is not "caught up" before its rebalance."""
    raw = settings.topic(T.RAW)
    parts = [TopicPartition(raw, p) for p in range(settings.partitions)]
    group = settings.topic("worker")
    admin = AdminClient(settings.kafka_client_config(), logger=LIBRDKAFKA_LOG)
    c = Consumer({**settings.kafka_client_config(), "group.id": group}, logger=LIBRDKAFKA_LOG)
    try:
        while True:
            try:
                desc = admin.describe_consumer_groups([group])[group].result(timeout=5)
                owners = [{tp.partition for tp in m.assignment.topic_partitions if tp.topic == raw} for m in desc.members]
                settled = (desc.state == ConsumerGroupState.STABLE and len(owners) == members
                           and set().union(*owners) == set(range(settings.partitions)))
            except KafkaException:  # the coordinator is moving or loading: ask again
                settled, owners = False, []
            if settled:
                break
            assert time.monotonic() - started < bound, (
                f"the group did not settle on {members} members within {bound:.0f} s: {len(owners)} own {owners}")
            supervise()
            time.sleep(0.25)
        ends = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        while True:
            committed = [tp.offset for tp in c.committed(parts, timeout=10)]
            if all(e == 0 or got >= e for got, e in zip(committed, ends, strict=True)):
                return time.monotonic() - started
            behind = {p: e - max(got, 0) for p, (got, e) in enumerate(zip(committed, ends, strict=True)) if got < e}
            assert time.monotonic() - started < bound, f"partitions not processed again within {bound:.0f} s: {behind}"
            supervise()
            time.sleep(0.25)
    finally:
        c.close()
