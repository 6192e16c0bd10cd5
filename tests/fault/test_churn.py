"""Membership churn while traffic flows, for several minutes: workers join, leave cleanly and are
SIGKILLed (some while they restore their state), one change after another, on 12 partitions, with
one to four members.

After every change a chunk of the workload is sent, and every raw partition must be processed
again (the group has committed every record sent so far) within :data:`BOUND_S`: a takeover that
stalls in changelog recovery fails the test instead of waiting for a later rebalance by chance.
At the end ClickHouse must hold exactly what the pure core computes (one uninterrupted worker).
A worker that leaves a stalled recovery (exit 75) is started again, as ``rewardflow run`` would,
and counted. The time from each change to caught-up, and each changelog recovery's time as the
workers log it, are reported (p50 / p99 / max).
"""

from __future__ import annotations

import contextlib
import re
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from rewardflow.settings import tick_key
from tests.fault.pipeline import caught_up_after, feed, release_admin, restart_stalled, wait_drained
from tests.fault.verify import check, collect
from tests.fault.workload import FAULT_SETTINGS
from tests.streams.worker import WorkerProcess

pytestmark = [pytest.mark.fault, pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.timeout(600)]
SEED = 6_060_606
PARTITIONS = 12
BOUND_S = 30.0
STALL_S = 8.0  # a stalled takeover is resumed, or left and restarted, well within BOUND_S
# "doomed": a worker joins and is SIGKILLed while it restores its share (before the group caught up)
CHANGES = ("join", "join", "kill", "join", "leave", "join", "kill", "join", "leave", "kill",
           "join", "doomed", "join", "join", "kill", "kill", "join", "leave", "doomed", "join",
           "kill", "leave", "join", "doomed")
DOOMED_AFTER_S = 2.0
_RECOVERED = re.compile(r"changelog recovery finished in ([0-9.]+) s")


def percentiles(xs: list[float]) -> dict[str, float | int | None]:
    """n, p50, p99 and max of ``xs`` (None when empty)."""
    s = sorted(xs)
    if not s:
        return {"n": 0, "p50_s": None, "p99_s": None, "max_s": None}
    return {"n": len(s), "p50_s": statistics.median(s), "p99_s": s[min(len(s) - 1, int(0.99 * len(s)))],
            "max_s": s[-1]}


def test_workers_joining_leaving_and_killed_while_traffic_flows(
        deployment: Any, ch_db: Any, stack: contextlib.ExitStack, tmp_path: Path,
        logs: list[Any], record_property: Any) -> None:
    d = deployment(partitions=PARTITIONS, worker_stall_timeout_s=STALL_S)
    settings = d.settings
    key = tick_key(settings).decode()
    live: list[WorkerProcess] = [d.worker]
    everyone = list(live)
    workload, sink, sender = feed(d, ch_db, stack, SEED, sessions=60)
    chunks = workload.chunks(len(CHANGES) + 1)
    sender.send(chunks[0])

    def join(name: str) -> WorkerProcess:
        workdir = tmp_path / name
        workdir.mkdir()
        w = WorkerProcess(settings.kafka_bootstrap, settings.topic_prefix, workdir,
                          **{**FAULT_SETTINGS, "partitions": PARTITIONS, "tick_key": key,
                             "worker_stall_timeout_s": STALL_S})
        w.argv += ["--log-level", "INFO"]  # the recovery's progress and timing are logged at INFO
        stack.callback(lambda: (w.stop(), release_admin(w)))
        logs.append((f"{name} log", w.log_tail))
        w.start()
        live.append(w)
        everyone.append(w)
        return w

    restarted: list[str] = []

    def supervise() -> None:
        restart_stalled(live, restarted)

    took: list[tuple[str, float]] = []
    for i, change in enumerate(CHANGES):
        started = time.monotonic()
        if change == "join":
            join(f"worker-{i}")
        elif change == "doomed":
            doomed = join(f"worker-{i}")
            sender.send(chunks[i + 1][: len(chunks[i + 1]) // 2])
            time.sleep(DOOMED_AFTER_S)
            live.remove(doomed)
            doomed.kill()
        else:
            gone = live.pop(0)  # the oldest member: it holds the most state
            gone.kill() if change == "kill" else gone.stop()
        sender.send(chunks[i + 1][len(chunks[i + 1]) // 2:] if change == "doomed" else chunks[i + 1])  # traffic flows
        took.append((change, round(caught_up_after(settings, started, BOUND_S, len(live), supervise), 1)))
        sink.check()
    sender.finish()

    def healthy() -> None:
        sink.check()
        supervise()
        for w in live:
            assert w.alive, f"a worker exited:\n{w.log_tail(3000)}"

    drained_s = wait_drained(settings, 180, healthy)
    sink.stop()
    summary = check(collect(ch_db.client), workload, sender, late_ok=False)
    recoveries = [float(x) for w in everyone for x in _RECOVERED.findall(w.log_tail(10**8))]
    figures: dict[str, Any] = {**percentiles([s for _, s in took]), "changes": took,
                               "changelog_recovery": percentiles(recoveries)}
    figures["restarted_after_a_stall"] = restarted
    figures["stalls_resumed"] = sum(w.log_tail(10**8).count("resumed their fetching") for w in everyone)
    record_property("fault_summary", {**summary, "caught_up": figures, "drained_s": round(drained_s, 1)})
    print("caught up after each change", figures, "result", summary)
