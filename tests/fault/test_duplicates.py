"""Duplicate deliveries from the producer side, without any process fault (the suite's control run).

The workload already carries client duplicates (the same event sent again),
whole batches resent by a second SDK client and Avro records produced twice
(a retry without idempotence). Every copy must end as one ``duplicate``
exclusion; rewards, windows and events are stored once, exactly as the pure
core computes them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from tests.fault.pipeline import SinkThread, wait_drained
from tests.fault.sender import Sender
from tests.fault.verify import check, collect, stop_merges
from tests.fault.workload import build_workload

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(300)]
SEED = 20261129


def test_duplicate_deliveries_and_batch_resends_are_stored_once(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack, record_property: Any) -> None:
    d = deployment()
    workload = build_workload(d.settings, SEED)
    stop_merges(ch_db.client)  # so the summary counts rows stored more than once
    sink = SinkThread(d.sink_settings(ch_db.dsn.secret))
    stack.callback(sink.stop)
    sender = Sender(d.settings, wire_format="json")
    stack.callback(sender.close)

    sender.send(workload.items)
    sender.finish()

    def healthy() -> None:
        sink.check()
        assert d.worker.alive, "the worker exited"

    drained_s = wait_drained(d.settings, 120, healthy)
    sink.stop()
    summary = check(collect(ch_db.client), workload, sender)
    assert summary["exclusions"]["duplicate"] >= workload.summary["resends"] + workload.summary["twice"]
    record_property("fault_summary", {**workload.summary, **summary, "drained_s": round(drained_s, 1)})
    print("workload", workload.summary, "result", summary)
