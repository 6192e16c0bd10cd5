"""Fixtures of the stream worker tests: a worker subprocess per test, on unique topics.

``deploy(**settings) -> Deployment`` creates the deployment's topics (prefix
unique to the test), starts ``python -m rewardflow_streams.main``, waits until
it owns every raw partition and has read and committed a probe (a no-op tick
with watermark 0) on each. The test then produces raw records with
``d.raw``, reads outputs with ``d.out`` and may ``d.worker.kill()`` /
``d.worker.restart()``. Teardown stops every worker (SIGTERM, then SIGKILL)
and closes the clients; a failed test's report shows each worker's log, ending
with the stacks of a worker still running (SIGABRT + faulthandler).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rewardflow.kafka.provision import ensure_topics
from rewardflow.settings import Settings
from tests.streams.kafka_io import OutputCollector, RawProducer, tick_record
from tests.streams.worker import WorkerProcess


@dataclass
class Deployment:
    worker: WorkerProcess
    raw: RawProducer
    out: OutputCollector

    @property
    def settings(self) -> Settings:
        return self.worker.settings


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for w in getattr(item, "_stream_workers", ()):
            w.abort_with_stacks()  # a stuck worker shows where it is stuck
            report.sections.append((f"stream worker log ({w.log_path})", w.log_tail()))


@pytest.fixture
def deploy(kafka_broker: Any, tmp_path: Path, request: pytest.FixtureRequest,
           unique_group: str) -> Iterator[Callable[..., Deployment]]:
    made: list[Deployment] = []
    workers: list[WorkerProcess] = []
    request.node._stream_workers = workers

    def make(**settings: Any) -> Deployment:
        n = len(made)
        prefix = f"t{uuid.uuid4().hex[:10]}."
        workdir = tmp_path / f"worker{n}"
        workdir.mkdir()
        worker = WorkerProcess(kafka_broker.bootstrap, prefix, workdir, **settings)
        workers.append(worker)
        ensure_topics(worker.settings)
        d = Deployment(worker, RawProducer(worker.settings), OutputCollector(worker.settings, f"{unique_group}-{n}", worker))
        made.append(d)
        worker.start()
        worker.wait_joined()
        # A probe: a tick carrying watermark 0 (older than any event, so it changes nothing) on each
        # partition, and wait until it is committed. Records fetched around Faust's start-up
        # rebalances can be skipped (faust #216/#221), so test data only go to a consuming worker.
        d.raw.send_many([(p, *tick_record(0, worker.settings)) for p in range(worker.settings.partitions)])
        worker.wait_caught_up()
        return d

    yield make
    for d in made:
        d.worker.close()
        d.out.close()
        d.raw.close()
