"""SIGKILL of the ClickHouse sink between an insert and its offset commit, twice.

The sink runs as a subprocess (:mod:`tests.fault.sinkproc`) that kills itself
at its N-th commit that includes reward rows, after that flush's inserts
returned and before the commit is sent, so the point of death is deterministic:

1. first run, started once the worker has processed the first third of the
   traffic: killed at commit #1. Rows of every table are in ClickHouse, no
   offset is committed;
2. second run: re-reads everything from the start, re-cuts the recorded
   ranges (same insert tokens: the rows are not stored again) and commits
   them (#1); then more traffic arrives and it is killed at commit #2;
3. third run: drains to the end and stops gracefully.

With chDB the sink subprocesses own a private directory (one process per
directory), read back by a reader subprocess once the sink exited; with a
ClickHouse server (``REWARDFLOW_CLICKHOUSE_DSN``) they use the test's database.
Background merges are stopped in the sink's engine, so ``count()`` without
``FINAL`` shows any row stored twice: none may be.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fault.pipeline import SinkProcess, committed, lags, read_results, sink_group, wait_drained
from tests.fault.sender import Sender
from tests.fault.verify import check, collect, stop_merges
from tests.fault.workload import build_workload

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(420)]
SEED = 4_242_001


def test_sink_killed_between_insert_and_commit_stores_every_row_once(
        deployment: Any, ch_db: Any, tmp_path: Path, stack: contextlib.ExitStack,
        logs: list[Any], record_property: Any) -> None:
    d = deployment()
    embedded = ch_db.dsn.embedded
    dsn = f"chdb://{tmp_path / 'sink-chdb'}?database=fault" if embedded else ch_db.dsn.secret
    settings = d.sink_settings(dsn)
    if not embedded:
        stop_merges(ch_db.client)

    def results() -> dict[str, Any]:
        return read_results(settings) if embedded else collect(ch_db.client)

    workload = build_workload(d.settings, SEED)
    sink = SinkProcess(settings, d.workdir)
    stack.callback(sink.stop)
    logs.append((f"sink log ({sink.log_path})", sink.log_tail))
    sender = Sender(d.settings, wire_format="avro")
    stack.callback(sender.close)
    first, second, rest = workload.chunks(3)

    sender.send(first)  # processed before the sink starts, so its first flush writes every table
    deadline = time.monotonic() + 60
    while lags(settings)[0] != 0:
        assert time.monotonic() < deadline, "the worker did not process the first chunk"
        time.sleep(0.5)
    sink.start(kill_at_commit=1, stop_merges=embedded)
    assert sink.wait_exit(120) == -signal.SIGKILL
    fault = json.loads(sink.report_path.read_text())
    offsets = committed(settings, sink_group(settings))
    assert all(offsets[(t, p)] < o for t, p, o in fault["offsets"]), offsets  # that commit never happened
    stored = results()["counts"]
    inserted = {t: c[0] for t, c in stored.items() if c[0]}
    assert "rewards" in inserted, f"the first run's inserts: {inserted}"

    sink.start(kill_at_commit=2, stop_merges=embedded)
    deadline = time.monotonic() + 90
    rewards = [(t, p) for t, p, _ in fault["offsets"] if t.endswith(".rewards")]
    while any(committed(settings, sink_group(settings))[tp] < 0 for tp in rewards):  # the replay, committed
        assert sink.alive and time.monotonic() < deadline, f"the replay was not committed:\n{sink.log_tail()}"
        time.sleep(0.5)
    sender.send(second)
    assert sink.wait_exit(120) == -signal.SIGKILL

    sink.start(kill_at_commit=0, stop_merges=embedded)
    sender.send(rest)
    sender.finish()

    def healthy() -> None:
        assert sink.alive, f"the sink exited:\n{sink.log_tail()}"
        assert d.worker.alive, "the worker exited"

    drained_s = wait_drained(settings, 150, healthy)
    sink.stop()
    assert sink.proc is not None and sink.proc.returncode == 0, sink.log_tail()
    final = results()
    summary = check(final, workload, sender)
    assert summary["stored_duplicates"] == {}, "rows re-inserted after a sink crash were stored twice"
    record_property("fault_summary", {**workload.summary, **summary, "rows_before_first_kill": inserted,
                                      "first_kill_uncommitted": fault["offsets"], "drained_s": round(drained_s, 1)})
    print("first kill: rows stored", inserted, "uncommitted", fault["offsets"], "result", summary)
