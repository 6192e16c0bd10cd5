"""ClickHouse unavailable for a period, mid-stream.

The in-process sink's ``fault`` hook (called before every insert) lets the
first inserts through, then raises a connection-type driver error
(clickhouse-connect's ``OperationalError``) for ``OUTAGE_S`` seconds. During
the outage the sink must hold its rows, commit nothing and keep its consumer
in the group; afterwards it resumes by itself. Background merges are stopped,
so a batch stored twice by a retry would show: none may be.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import OperationalError

from tests.fault.pipeline import SinkThread, committed, sink_group, wait_drained
from tests.fault.sender import Sender
from tests.fault.verify import check, collect, stop_merges
from tests.fault.workload import build_workload

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(300)]
SEED = 3_300_017
OUTAGE_S = 8.0


class Outage:
    """Fault hook: inserts pass until ``after`` calls, then fail for ``seconds`` seconds."""

    def __init__(self, after: int, seconds: float) -> None:
        self.after, self.seconds = after, seconds
        self.calls = self.refused = 0
        self.started: float | None = None
        self.began = threading.Event()

    def __call__(self, table: str) -> None:
        self.calls += 1
        if self.started is None and self.calls > self.after:
            self.started = time.monotonic()
            self.began.set()
        if self.started is not None and time.monotonic() - self.started < self.seconds:
            self.refused += 1
            raise OperationalError(f"HTTPDriver for http://127.0.0.1:8123 received error: Connection refused ({table})")


def test_clickhouse_down_for_seconds_mid_stream_loses_and_duplicates_nothing(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack, caplog: pytest.LogCaptureFixture,
        record_property: Any) -> None:
    caplog.set_level(logging.WARNING, logger="rewardflow.sink.route")
    # small worker batches: the whole workload would otherwise reach the sink in a handful of
    # large records, and the outage must begin while rows are still arriving
    d = deployment(worker_batch_records=20)
    workload = build_workload(d.settings, SEED)
    stop_merges(ch_db.client)
    outage = Outage(after=3, seconds=OUTAGE_S)
    settings = d.sink_settings(ch_db.dsn.secret)
    sink = SinkThread(settings, fault=outage)
    stack.callback(sink.stop)
    sender = Sender(d.settings, wire_format="json")
    stack.callback(sender.close)

    sending = threading.Thread(target=sender.send, args=(workload.items,), name="fault-sender")
    sending.start()
    stack.callback(sending.join, 180)
    if not outage.began.wait(120):
        sink.check()
        raise AssertionError(f"the sink never reached its 4th insert: {outage.calls} insert calls, sink "
                             f"{sink.sink.metrics.snapshot()}, sending={sending.is_alive()}, "
                             f"worker alive={d.worker.alive}, sink committed={committed(settings, sink_group(settings))}")
    mid_stream = sending.is_alive()
    time.sleep(0.5)
    during = committed(settings, sink_group(settings))
    assert sink.sink.metrics.snapshot()["unavailable"] is True
    time.sleep(max(0.0, OUTAGE_S - 1.5))
    assert committed(settings, sink_group(settings)) == during, "offsets were committed while ClickHouse was down"
    sending.join(180)
    assert not sending.is_alive()
    sender.finish()

    def healthy() -> None:
        sink.check()
        assert d.worker.alive, "the worker exited"

    drained_s = wait_drained(d.settings, 150, healthy)
    sink.stop()
    metrics = sink.sink.metrics.snapshot()
    assert metrics["retries"] >= 2 and not metrics["unavailable"], metrics
    assert "ClickHouse unavailable" in caplog.text and "available again" in caplog.text, caplog.text
    summary = check(collect(ch_db.client), workload, sender)
    assert summary["stored_duplicates"] == {}, "a retried batch was stored twice"
    record_property("fault_summary", {**workload.summary, **summary, "refused_inserts": outage.refused,
                                      "retries": metrics["retries"], "drained_s": round(drained_s, 1),
                                      "outage_while_sending": mid_stream})
    print("outage: refused", outage.refused, "inserts, retries", metrics["retries"], "while sending", mid_stream,
          "result", summary)
