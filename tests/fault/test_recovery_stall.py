"""A changelog recovery that stalls on purpose: the worker notices, leaves the group, and its next
start restores and processes everything exactly.

The worker processes the first part of the workload, stops, and starts again with the fault hook
``RF_FAULT_STALL_RECOVERY``: its changelog partitions are never resumed, so its recovery waits for
events that never come, as Faust's recoveries sometimes do after a rebalance. With
``REWARDFLOW_RECOVERY_STALL_TIMEOUT_S=5`` it must stop itself within seconds with exit code 75
(a supervisor such as ``rewardflow run`` starts it again: tests/test_children.py). Started again
(the hook fires once), it restores the state and finishes the stream; ClickHouse must then hold
exactly what the pure core computes.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from rewardflow_streams.recovery import EXIT_RECOVERY_STALLED
from tests.fault.pipeline import feed, wait_drained
from tests.fault.verify import check, collect

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(300)]
SEED = 5_050_505
STALL_S = 5.0


def test_a_stalled_recovery_is_left_within_its_timeout_and_nothing_is_lost(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack, record_property: Any) -> None:
    d = deployment(recovery_stall_timeout_s=STALL_S)
    workload, sink, sender = feed(d, ch_db, stack, SEED)
    chunks = workload.chunks(2)
    sender.send(chunks[0])
    d.worker.wait_caught_up(60)
    d.worker.stop()  # a clean stop: the join state is in the changelog
    marker = d.workdir / "stall.marker"
    d.worker.env["RF_FAULT_STALL_RECOVERY"] = str(marker)
    started = time.monotonic()
    d.worker.start()
    code = d.worker.wait_exit(STALL_S + 90)
    left_after = time.monotonic() - started
    log = d.worker.log_tail(50_000)
    assert marker.exists(), log[-3000:]
    assert code == EXIT_RECOVERY_STALLED, log[-3000:]
    assert "changelog recovery stalled" in log and "records left" in log
    d.worker.argv += ["--log-level", "INFO"]  # the recovery's timing is logged at INFO
    d.worker.restart(60)  # the hook fired once: this start restores normally
    sender.send(chunks[1])
    sender.finish()

    def healthy() -> None:
        sink.check()
        assert d.worker.alive, f"the worker exited:\n{d.worker.log_tail(3000)}"

    drained_s = wait_drained(d.settings, 180, healthy)
    restarted = d.worker.log_tail(200_000).rsplit("worker start #3", 1)[-1]
    assert "changelog recovery finished in" in restarted and "changelog recovery stalled" not in restarted
    sink.stop()
    summary = check(collect(ch_db.client), workload, sender, late_ok=False)
    record_property("fault_summary", {**summary, "stalled_worker_exited_after_s": round(left_after, 1),
                                      "drained_s": round(drained_s, 1)})
    print("stalled worker exited after", round(left_after, 1), "s; result", summary)
