"""The stream worker of a test deployment: :class:`rewardflow.demo.worker_proc.WorkerProcess` with test settings.

Contract: :class:`WorkerProcess` runs ``python -m rewardflow_streams.main`` with
settings built only from :data:`BASE_SETTINGS` plus overrides (every
inherited ``REWARDFLOW_*`` variable is dropped) and :data:`FAUST_ENV`,
detached in its own session, with stdout and stderr appended to
``workdir/worker.log``. ``wait_joined`` blocks until the consumer group is
stable with one live member of this start owning every raw partition, or
raises with the log tail. ``stop`` never leaves the process running, and the
worker is SIGKILLed if the test process dies first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from rewardflow.kafka import topics as T
from rewardflow.demo import worker_proc
from rewardflow.settings import Settings
from tests.streams.kafka_io import LIBRDKAFKA_LOG

# Small event-time rules so a test sees turns settle and windows close within seconds:
# settle = last horizon 120 s + grace 1 s; the idle clock runs 50x the wall clock after 1 s idle.
BASE_SETTINGS: dict[str, Any] = {
    "partitions": 2, "allowed_lateness_ms": 500, "grace_ms": 1000, "max_clock_skew_ms": 500, "horizons_s": [30, 120],
    "window_sizes_s": [60], "idle_timeout_s": 1.0, "idle_clock_rate": 50.0, "provisional": True,
    "dedup_horizon_ms": 600_000, "tombstone_ms": 600_000, "max_record_bytes": 65_536, "max_batch_events": 500,
}
# Faust reads these from the environment: a SIGKILLed member leaves the group after 6 s, not 60 s.
FAUST_ENV = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}


class WorkerProcess(worker_proc.WorkerProcess):
    """One deployment's worker; may be started, killed and restarted any number of times."""

    stop_timeout = 20.0

    def __init__(self, bootstrap: str, prefix: str, workdir: Path, **overrides: Any) -> None:
        fields = {**BASE_SETTINGS, "reward_specs_dir": None, "active_spec_versions": [], **overrides,
                  "kafka_bootstrap": bootstrap, "topic_prefix": prefix, "home": workdir / "home"}
        super().__init__(Settings(**fields), workdir / "worker.log", cwd=workdir, env=FAUST_ENV, detach=True)
        self.workdir = workdir

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
