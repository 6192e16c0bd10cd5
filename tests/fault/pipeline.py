"""The processes of one fault-test deployment, and how to tell that it has drained.

* the stream worker: :class:`tests.streams.worker.WorkerProcess` (a subprocess
  that can be SIGKILLed and restarted), with :data:`~tests.fault.workload.FAULT_SETTINGS`;
* the sink in this process: :class:`SinkThread` (``RewardSink.run`` in a thread,
  optional ``fault`` hook), for a ClickHouse engine this process owns;
* the sink in a subprocess: :class:`SinkProcess` (``python -m tests.fault.sinkproc``),
  which can kill itself between an insert and its offset commit.

:func:`wait_drained` returns once the worker has committed the whole raw topic
and then the sink has committed every output topic (so every output row is in
ClickHouse), or raises with the lags it saw.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rewardflow import topics as T
from rewardflow.clickhouse.sink import RewardSink
from rewardflow.lag import group_lag
from rewardflow.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def release_admin(worker: Any) -> None:
    """Destroy the worker handle's admin client now (only ``wait_joined`` and ``kill`` use it).

    librdkafka's destroy of an admin client hangs for good once its broker
    went away (seen at interpreter exit after the session broker stopped, and
    after a broker restart), so destroy it while its broker is healthy.
    """
    worker._admin = None
    gc.collect()


def sink_group(settings: Settings) -> str:
    return f"{settings.topic_prefix}sink"


class SinkThread:
    """``RewardSink.run`` on a thread; :meth:`stop` sets its stop event and joins (close flushes, commits)."""

    def __init__(self, settings: Settings, fault: Callable[[str], None] | None = None) -> None:
        self.sink = RewardSink(settings, group_id=sink_group(settings), fault=fault, serve_reads=False)
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


class SinkProcess:
    """``python -m tests.fault.sinkproc run`` with ``settings`` in its environment; log appended to ``log_path``."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("REWARDFLOW_", "RF_FAULT_"))}
        self.env.update(settings_env(settings))
        self.log_path = workdir / "sink.log"
        self.report_path = workdir / "sink-fault.json"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, kill_at_commit: int = 0, stop_merges: bool = True) -> None:
        env = {**self.env, "RF_FAULT_KILL_AT_COMMIT": str(kill_at_commit), "RF_FAULT_REPORT": str(self.report_path),
               "RF_FAULT_STOP_MERGES": "1" if stop_merges else "0"}
        with self.log_path.open("ab") as log:
            log.write(f"\n===== sink start (kill at commit #{kill_at_commit}) =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.fault.sinkproc", "run"], env=env, cwd=REPO,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the sink did not exit within {timeout:.0f}s:\n{self.log_tail()}") from None

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (flush + commit), SIGKILL after ``timeout``; idempotent."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 8_000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else "(no log)"


def settings_env(settings: Settings) -> dict[str, str]:
    """``REWARDFLOW_*`` variables that reproduce ``settings`` in a subprocess (secrets included)."""
    import json

    out: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        out[f"REWARDFLOW_{name.upper()}"] = json.dumps(value) if isinstance(value, list | bool) else str(value)
    return out


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
    """(worker lag on the raw topic, sink lag summed over the output topics); None = no answer."""
    cfg = settings.kafka_client_config()
    worker = group_lag(cfg, settings.topic("worker"), settings.topic(T.RAW), timeout=5)
    sink: int | None = 0
    for name in T.OUTPUT_TOPICS:
        lag = group_lag(cfg, sink_group(settings), settings.topic(name), timeout=5)
        sink = None if lag is None or sink is None else sink + lag
    return worker, sink


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
