"""The stream worker as a subprocess: start, wait until it owns its partitions, SIGKILL, restart, stop.

Contract: :class:`WorkerProcess` runs ``python -m rewardflow_streams.main`` with
an environment built only from :data:`BASE_SETTINGS` plus overrides (every
inherited ``REWARDFLOW_*`` variable is dropped), in its own process group, with
stdout and stderr appended to ``log_path``. :meth:`wait_joined` blocks until
the consumer group is stable with one live member of this start owning every
raw partition, or raises with the log tail. :meth:`stop` never leaves the
process running, and the worker is SIGKILLed if the test process dies first.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from rewardflow import topics as T
from rewardflow.settings import Settings
from tests.streams.kafka_io import LIBRDKAFKA_LOG

# Small event-time rules so a test sees turns settle and windows close within seconds:
# settle = last horizon 120 s + grace 1 s; the idle clock runs 50x the wall clock after 1 s idle.
BASE_SETTINGS: dict[str, Any] = {
    "partitions": 2, "allowed_lateness_ms": 500, "grace_ms": 1000, "horizons_s": [30, 120],
    "window_sizes_s": [60], "idle_timeout_s": 1.0, "idle_clock_rate": 50.0, "provisional": True,
    "dedup_horizon_ms": 600_000, "tombstone_ms": 600_000, "max_record_bytes": 65_536, "max_batch_events": 500,
}
# Faust reads these from the environment: a SIGKILLed member leaves the group after 6 s, not 60 s.
FAUST_ENV = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the test process dies without its teardown (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _env_value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, list | bool) else str(v)


class WorkerProcess:
    """One deployment's worker; may be started, killed and restarted any number of times."""

    def __init__(self, bootstrap: str, prefix: str, workdir: Path, **overrides: Any) -> None:
        fields = {**BASE_SETTINGS, "reward_specs_dir": None, "active_spec_versions": [], **overrides,
                  "kafka_bootstrap": bootstrap, "topic_prefix": prefix, "home": workdir / "home"}
        self.settings = Settings(**fields)
        self.group = self.settings.topic("worker")  # Faust's app id is its consumer group
        self.workdir, self.log_path = workdir, workdir / "worker.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
        self.env.update(FAUST_ENV, PYTHONFAULTHANDLER="1")  # SIGABRT writes every thread's stack to the log
        self.env.update({f"REWARDFLOW_{k.upper()}": _env_value(v) for k, v in fields.items() if v is not None})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._gone_members: set[str] = set()
        self._admin: Any = AdminClient({"bootstrap.servers": bootstrap}, logger=LIBRDKAFKA_LOG)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "worker already running"
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== worker start #{self.starts} at {time.strftime('%H:%M:%S')} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen([sys.executable, "-m", "rewardflow_streams.main"], env=self.env,
                                         cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_parent)

    def kill(self) -> None:
        """SIGKILL: no flush, no commit. Its group membership lingers until the session times out."""
        self._gone_members |= {m.member_id for m in self._members()}
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._note("SIGKILL")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (graceful: flush + commit), SIGKILL after ``timeout``; idempotent."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            self._note(f"no exit {timeout:.0f}s after SIGTERM: SIGKILL")

    def close(self) -> None:
        """Stop the worker and drop the admin client."""
        self.stop()
        self._admin = None

    def restart(self, timeout: float = 40.0) -> None:
        self.start()
        self.wait_joined(timeout)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ------------------------------------------------------------------ readiness
    def _members(self) -> list[Any]:
        try:
            return list(self._admin.describe_consumer_groups([self.group])[self.group].result(timeout=5).members)
        except Exception:  # group not created yet, coordinator loading
            return []

    def wait_joined(self, timeout: float = 40.0) -> None:
        """Block until one member of *this* start owns every raw partition of a stable group."""
        raw = self.settings.topic(T.RAW)
        want = set(range(self.settings.partitions))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise AssertionError(f"worker exited with {self.proc and self.proc.returncode}:\n{self.log_tail()}")
            members = self._members()
            if len(members) == 1 and members[0].member_id not in self._gone_members:
                owned = {tp.partition for tp in members[0].assignment.topic_partitions if tp.topic == raw}
                if owned == want:
                    return
            time.sleep(0.25)
        raise AssertionError(f"worker did not join group {self.group} within {timeout:.0f}s:\n{self.log_tail()}")

    def abort_with_stacks(self) -> None:
        """SIGABRT a running worker so faulthandler writes where each thread is to the log (diagnosis)."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Block until the group has committed every raw record that exists now (the worker read them all)."""
        raw = self.settings.topic(T.RAW)
        parts = [TopicPartition(raw, p) for p in range(self.settings.partitions)]
        consumer = Consumer({"bootstrap.servers": self.settings.kafka_bootstrap, "group.id": self.group},
                            logger=LIBRDKAFKA_LOG)
        try:  # a consumer that never subscribes does not join the group; it only reads its offsets
            ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
            deadline = time.monotonic() + timeout
            while True:
                committed = [tp.offset for tp in consumer.committed(parts, timeout=10)]
                if all(c >= e or e == 0 for c, e in zip(committed, ends, strict=True)):
                    return
                if not self.alive or time.monotonic() > deadline:
                    raise AssertionError(f"worker did not commit raw offsets {ends} (at {committed}):\n{self.log_tail()}")
                time.sleep(0.2)
        finally:
            consumer.close()

    # ------------------------------------------------------------------ log
    def _note(self, text: str) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"===== {text} at {time.strftime('%H:%M:%S')} =====\n".encode())

    def log_tail(self, max_chars: int = 20_000) -> str:
        if not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_bytes().decode(errors="replace").replace("\r", "\n")
        text = text.replace("\x1b[?25l", "").replace("\x1b[?25h", "")
        return text[-max_chars:]
