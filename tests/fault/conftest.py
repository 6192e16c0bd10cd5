"""Fixtures of the fault suite: one deployment per test, every process stopped at teardown.

``deployment(bootstrap=None) -> Deployment`` creates unique topics on the
session broker (or on ``bootstrap``), starts a stream worker subprocess and
waits until it owns every raw partition. ``Deployment.sink_settings(dsn)``
gives the settings a sink for the same deployment needs. ``stack`` is an
``ExitStack`` whose callbacks run at teardown (last registered first), so a
test registers every process, thread and client it starts right away. A
failed test's report shows the logs registered in ``logs``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from rewardflow.kafka.provision import ensure_topics
from rewardflow.settings import Settings
from tests.fault.pipeline import release_admin
from tests.fault.workload import FAULT_SETTINGS
from tests.streams.worker import WorkerProcess


@dataclass
class Deployment:
    worker: WorkerProcess
    workdir: Path

    @property
    def settings(self) -> Settings:
        return self.worker.settings

    def sink_settings(self, dsn: str, **overrides: Any) -> Settings:
        """The deployment's settings with a ClickHouse DSN and small, frequent sink batches."""
        values = {**self.settings.model_dump(), "clickhouse_dsn": SecretStr(dsn), "sink_batch_rows": 2_000,
                  "sink_batch_seconds": 0.3, **overrides}
        return Settings(**values)


def _release(worker: WorkerProcess) -> None:
    worker.stop()
    release_admin(worker)


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as s:
        yield s


@pytest.fixture
def logs(request: pytest.FixtureRequest) -> list[tuple[str, Callable[[], str]]]:
    found: list[tuple[str, Callable[[], str]]] = []
    request.node._fault_logs = found
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for name, tail in getattr(item, "_fault_logs", ()):
            report.sections.append((name, tail()))
    if report.when == "teardown":
        item._fault_logs = ()  # type: ignore[attr-defined]  # release the processes' clients


@pytest.fixture
def deployment(kafka_broker: Any, tmp_path: Path, stack: contextlib.ExitStack,
               logs: list[tuple[str, Callable[[], str]]]) -> Callable[..., Deployment]:
    def make(bootstrap: str | None = None, **overrides: Any) -> Deployment:
        prefix = f"f{uuid.uuid4().hex[:10]}."
        workdir = tmp_path / prefix.strip(".")
        workdir.mkdir()
        worker = WorkerProcess(bootstrap or kafka_broker.bootstrap, prefix, workdir, **{**FAULT_SETTINGS, **overrides})
        stack.callback(_release, worker)
        logs.append((f"worker log ({worker.log_path})", worker.log_tail))
        ensure_topics(worker.settings)
        worker.start()
        worker.wait_joined(60)
        return Deployment(worker, workdir)

    return make
