"""A worker whose Faust app crashes stops itself, so that its supervisor starts it again.

Faust runs its services' background work in tasks; when one raises, it marks the app crashed,
logs the exception and goes on, so a worker could sit in its group doing nothing until a signal
came. The fault hook ``RF_FAULT_CRASH`` makes one such task raise in the first process.

A stop asked for can make a starting service fail the same way (the stop cancels a changelog
topic's creation, whose answer then raises); ``RF_FAULT_CRASH_ON_STOP`` crashes the app during
the stop. That worker did what it was asked, so it exits 0.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rewardflow.kafka import topics as T
from rewardflow.kafka.provision import ensure_topics
from tests.factories import T0, turn
from tests.streams.kafka_io import OutputCollector, RawProducer, json_record
from tests.streams.worker import WorkerProcess

pytestmark = pytest.mark.kafka


@contextmanager
def _deployment(kafka_broker: Any, tmp_path: Path, unique_group: str, monkeypatch: pytest.MonkeyPatch,
                fault: str) -> Iterator[tuple[Path, WorkerProcess, RawProducer, OutputCollector]]:
    """A worker whose first process has the fault hook ``fault`` (its marker file), with a producer
    of raw records and a collector of the outputs; all closed at the end."""
    marker = tmp_path / fault.lower()
    monkeypatch.setenv(fault, str(marker))
    worker = WorkerProcess(kafka_broker.bootstrap, f"t{uuid.uuid4().hex[:10]}.", tmp_path)
    ensure_topics(worker.settings)
    raw, out = RawProducer(worker.settings), OutputCollector(worker.settings, unique_group, worker)
    try:
        yield marker, worker, raw, out
    finally:
        worker.close()
        out.close()
        raw.close()


def test_a_crashed_worker_exits_1_at_once_and_its_next_start_processes(
        kafka_broker: Any, tmp_path: Path, unique_group: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with _deployment(kafka_broker, tmp_path, unique_group, monkeypatch, "RF_FAULT_CRASH") as (marker, worker, raw, out):
        worker.start()
        started = time.monotonic()
        assert worker.wait_exit(60) == 1, worker.log_tail()
        assert marker.exists(), "the fault never fired: the test proves nothing"
        log = worker.log_tail()
        assert "Faust app crashed" in log and "RF_FAULT_CRASH" in log, log
        assert time.monotonic() - started < 45, "the crashed worker waited instead of stopping"

        worker.start()  # the marker exists: this start does not crash
        worker.wait_joined()
        evs = turn("r-crash", "s-crash", T0, horizons=(30, 120))
        raw.send(0, *json_record(*evs))
        out.until(lambda o: len(o.rows[T.VALID]) == len(evs), 30, "the turn's events processed after the restart")
        assert worker.alive


def test_a_worker_that_crashes_during_a_stop_it_was_asked_for_exits_0_and_its_next_start_processes(
        kafka_broker: Any, tmp_path: Path, unique_group: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with _deployment(kafka_broker, tmp_path, unique_group, monkeypatch, "RF_FAULT_CRASH_ON_STOP") as (
            marker, worker, raw, out):
        worker.start()
        worker.wait_joined()
        first = turn("r-stop-1", "s-stop", T0, horizons=(30, 120))
        raw.send(0, *json_record(*first))
        out.until(lambda o: len(o.rows[T.VALID]) == len(first), 30, "the first turn's events processed")
        assert worker.stop(40) == 0, worker.log_tail()
        assert marker.exists(), "the fault never fired: the test proves nothing"
        log = worker.log_tail()
        assert "RF_FAULT_CRASH_ON_STOP" in log and "crashed while stopping as asked" in log, log
        assert "stopping, with exit code 1" not in log, log

        worker.start()  # the marker exists: this stop will not crash
        worker.wait_joined()
        second = turn("r-stop-2", "s-stop", T0 + 1_000, horizons=(30, 120))
        raw.send(0, *json_record(*second))
        out.until(lambda o: {r["request_id"] for r in o.rows[T.VALID]} >= {"r-stop-1", "r-stop-2"}, 30,
                  "the second turn's events processed after the restart")
        assert worker.stop(40) == 0, worker.log_tail()
