"""A Kafka broker restart (stop and start by PID, same data directory) mid-stream.

The session broker is shared, so this test starts its own
:class:`~rewardflow.kafka_local.LocalBroker` on free loopback ports in a
temporary directory. While the SDK is sending, a background thread stops the
broker (SIGTERM by PID), waits, and starts it again on the same ports and
data. Producers, the stream worker and the sink must ride through it: after
recovery, ClickHouse holds exactly the expected rows.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rewardflow.kafka_local import LocalBroker
from rewardflow.kafka_local.ports import free_ports
from rewardflow.settings import load_settings
from tests.fault.pipeline import SinkThread, lags, release_admin, wait_drained
from tests.fault.sender import Sender
from tests.fault.verify import check, collect, stop_merges
from tests.fault.workload import build_workload

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(420)]
SEED = 5_550_123
DOWN_S = 4.0


def test_broker_restart_mid_stream_loses_and_duplicates_nothing(
        deployment: Any, ch_db: Any, tmp_path: Path, stack: contextlib.ExitStack, logs: list[Any],
        record_property: Any) -> None:
    port, controller = free_ports(2)
    # not die_with_parent: the restart runs in a thread, and the death signal follows the starting thread
    broker = LocalBroker(load_settings().home, port, controller, partitions=2, data_dir=tmp_path / "kafka")
    stack.callback(broker.down, 30)
    logs.append((f"broker log ({broker.log_file})", lambda: broker.log_file.read_text(errors="replace")[-6000:]))
    broker.up(timeout=120)
    d = deployment(broker.bootstrap)
    release_admin(d.worker)  # see release_admin: it would hang at teardown after the restart
    workload = build_workload(d.settings, SEED)
    stop_merges(ch_db.client)  # so the summary counts rows stored more than once
    sink = SinkThread(d.sink_settings(ch_db.dsn.secret))
    stack.callback(sink.stop)
    sender = Sender(d.settings, wire_format="avro")
    stack.callback(sender.close)

    restart: dict[str, Any] = {}

    def bounce() -> None:
        time.sleep(2.0)
        restart["raw_lag"] = lags(d.settings)[0]
        t0 = time.monotonic()
        restart["pid"] = broker.down(timeout=30)
        restart["stopped_s"] = round(time.monotonic() - t0, 1)
        time.sleep(DOWN_S)
        t1 = time.monotonic()
        restart["new_pid"] = broker.up(timeout=120).pid
        restart["started_s"] = round(time.monotonic() - t1, 1)

    bouncer = threading.Thread(target=bounce, name="fault-broker-restart")
    bouncer.start()
    sender.send(workload.items)  # flushes block while the broker is down, then go on
    bouncer.join(180)
    assert restart.get("new_pid") and restart["new_pid"] != restart["pid"], restart
    sender.finish()

    def healthy() -> None:
        sink.check()
        assert d.worker.alive, f"the worker exited after the broker restart:\n{d.worker.log_tail(4000)}"

    drained_s = wait_drained(d.settings, 180, healthy)
    sink.stop()
    summary = check(collect(ch_db.client), workload, sender)
    record_property("fault_summary", {**workload.summary, **summary, "restart": restart, "drained_s": round(drained_s, 1)})
    print("broker restart", restart, "result", summary)
