"""The ClickHouse sink as a killable subprocess, and a reader for a chDB directory it owned.

``python -m tests.fault.sinkproc run``: settings from ``REWARDFLOW_*``;
migrates, then runs :class:`~rewardflow.sink.route.RewardSink` until
SIGTERM (with ``RF_FAULT_STOP_MERGES=1``, background merges stopped: see
:func:`tests.fault.verify.stop_merges`). With ``RF_FAULT_KILL_AT_COMMIT=N``
(N > 0) the process SIGKILLs itself at its N-th offset commit that includes
the rewards topic, *after* that flush's inserts returned and *before* the
commit is sent: exactly "between insert and commit". It first writes what it was about to commit to
``RF_FAULT_REPORT`` (JSON).

``python -m tests.fault.sinkproc read``: prints :func:`tests.fault.verify.collect`
of the configured database as JSON (chDB allows one process per directory,
so the test process cannot open the directory itself).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

import orjson

from rewardflow.clickhouse.connect import as_dsn, get_client
from rewardflow.clickhouse.migrate import ensure_database, migrate
from rewardflow.sink.route import RewardSink
from rewardflow.sink.flush import Flusher
from rewardflow.settings import load_settings
from tests.fault.pipeline import sink_group
from tests.fault.verify import collect, stop_merges

log = logging.getLogger("fault.sink")


def _kill_at_commit(n: int, report: str) -> None:
    original = Flusher._commit
    calls = {"n": 0}

    def commit(self: Flusher, consumer: Any, offsets: dict[tuple[str, int], int]) -> None:
        calls["n"] += any(t.endswith(".rewards") for t, _ in offsets)
        if calls["n"] == n:
            written = dict(self.metrics.rows_written)
            with open(report, "wb") as f:
                f.write(orjson.dumps({"commit": n, "offsets": [[t, p, o] for (t, p), o in offsets.items()],
                                      "rows_written": written}))
            log.warning("FAULT: SIGKILL at commit #%d, after its inserts, before committing %s", n, offsets)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, consumer, offsets)

    Flusher._commit = commit  # type: ignore[method-assign]


def run() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = load_settings()
    dsn = as_dsn(settings.dsn)
    ensure_database(dsn)
    client = get_client(dsn=dsn)
    migrate(client, events_ttl_days=settings.events_ttl_days)
    if os.environ.get("RF_FAULT_STOP_MERGES") == "1":
        stop_merges(client)
    client.close()
    kill_at = int(os.environ.get("RF_FAULT_KILL_AT_COMMIT", "0"))
    if kill_at > 0:
        _kill_at_commit(kill_at, os.environ["RF_FAULT_REPORT"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # a SIGKILLed member keeps its partitions until its session times out (librdkafka: 45 s); shorter here
    timeout_ms = int(os.environ.get("RF_FAULT_SESSION_TIMEOUT_MS", "6000"))
    overrides = {"session.timeout.ms": timeout_ms, "heartbeat.interval.ms": max(500, timeout_ms // 6)}
    sink = RewardSink(settings, group_id=sink_group(settings), consumer_overrides=overrides)
    log.info("sink running (kill at commit #%d)", kill_at)
    sink.run(stop)
    log.info("sink stopped: %s", sink.metrics.snapshot())


def read() -> None:
    settings = load_settings()
    client = get_client(dsn=as_dsn(settings.dsn))
    sys.stdout.buffer.write(orjson.dumps(collect(client)))
    client.close()


if __name__ == "__main__":
    {"run": run, "read": read}[sys.argv[1]]()
