"""SIGKILL of the stream worker at random points, six times in one run, restarting it each time.

The workload is sent in chunks. After each chunk the worker is killed after a
random delay (it is then mid-way through the chunk: some records processed,
some changelog writes and output sends done, nothing committed since the last
commit); sometimes the next chunk is produced while it is down, so the
restarted worker starts with a backlog; the last kill lands while it drains
after the final ticks. The in-process sink keeps running throughout.

After recovery, ClickHouse read with ``FINAL`` must hold exactly what the pure
core computes (see :mod:`tests.fault.verify`). Rows the restarted worker
re-emits (same ids, new offsets, so new insert tokens) are stored again until
a merge collapses them; with merges stopped, the summary counts them.
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Any

import pytest

from tests.fault.pipeline import SinkThread, lags, wait_drained
from tests.fault.sender import Sender
from tests.fault.verify import check, collect, stop_merges
from tests.fault.workload import build_workload

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(420)]
SEED = 7_100_529
KILLS = 6


def test_worker_sigkilled_six_times_loses_and_duplicates_nothing(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack, record_property: Any) -> None:
    rng = random.Random(SEED)
    d = deployment()
    workload = build_workload(d.settings, SEED)
    stop_merges(ch_db.client)  # so the summary counts the re-emitted rows stored twice
    sink = SinkThread(d.sink_settings(ch_db.dsn.secret))
    stack.callback(sink.stop)
    sender = Sender(d.settings, wire_format="avro")
    stack.callback(sender.close)

    pending, finished = workload.chunks(8), False

    def send_next() -> bool:
        nonlocal finished
        if pending:
            sender.send(pending.pop(0))
        if not pending and not finished:
            sender.finish()
            finished = True
            return True
        return bool(pending)

    kills: list[dict[str, Any]] = []
    for _ in range(KILLS):
        more = send_next()
        delay = rng.uniform(0.0, 1.5)
        time.sleep(delay)
        d.worker.kill()
        kills.append({"after_s": round(delay, 2), "raw_lag": lags(d.settings)[0], "sending": more})
        if rng.random() < 0.5 and not finished:  # produced while the worker is down: a backlog at restart
            send_next()
            kills[-1]["backlog"] = True
        d.worker.restart(60)
        sink.check()
    while not finished:
        send_next()
    assert len(kills) == KILLS >= 5 and d.worker.starts == KILLS + 1

    def healthy() -> None:
        sink.check()
        assert d.worker.alive, f"the worker exited:\n{d.worker.log_tail(3000)}"

    drained_s = wait_drained(d.settings, 180, healthy)
    sink.stop()
    results = collect(ch_db.client)
    summary = check(results, workload, sender, late_ok=False)  # every invariant, late rows included
    record_property("fault_summary", {**workload.summary, **summary, "kills": kills, "drained_s": round(drained_s, 1)})
    print("kills", kills, "result", summary)
