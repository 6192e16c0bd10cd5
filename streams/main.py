"""Run the stream worker in this process: ``python -m rewardflow_streams.main``.

Contract: blocks until SIGINT/SIGTERM, then lets Faust stop gracefully (the
agent finishes its record, the producer is flushed, offsets are committed)
and returns. ``on_stopped`` callbacks run after the worker has stopped, in
order — the sink uses this to flush and commit last.

Exit codes: 0 after a stop it was asked for, even when one of Faust's services crashed during that
stop (logged as a warning; a stop that has not ended :data:`CRASH_STOP_ASKED_S` after such a crash is
ended hard, still 0: offsets are committed only for records whose outputs were acknowledged, so
nothing a hard end skips is lost); 1 when the app crashed before any stop was asked for (the worker stops
itself, so that its supervisor starts it again); 75 when it left its group over a stall or an
assignment it cannot serve (:mod:`rewardflow_streams.watch`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import faust

from rewardflow import logrepeats
from rewardflow.kafka.provision import ensure_topics
from rewardflow.settings import Settings, load_settings
from rewardflow_streams.app import JoinWorker

log = logging.getLogger("rewardflow.streams")


GC_THRESHOLDS = (400_000, 50, 100)
CRASH_POLL_S = 0.5
CRASH_STOP_S = 60.0  # a crashed worker that has not stopped this long after its SIGTERM is ended hard
CRASH_STOP_ASKED_S = 20.0  # a stop asked for, not ended this long after a crash during it, is ended hard


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a long-running worker.

    The core allocates a few dicts per event, nearly all freed by reference counting, yet
    every 700 allocations CPython's default thresholds start a collection, and the older
    generations (Faust, aiokafka, the table) get traversed again and again: 20-30% of the
    core's time on the stream benchmark. ``gc.freeze()`` moves everything allocated at start
    out of the collector's sight. The first threshold sits above what one batch holds alive at
    once (up to 16,000 records a partition, a few objects an event): a collection that comes
    mid-batch traverses every live object of it (measured in bench/README.md, "The garbage
    collector and a batch's working set"). Cycles are still collected, only later (slightly more
    memory, never a leak).
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class Worker(faust.Worker):
    """Faust's worker, knowing whether it was asked to stop (SIGTERM, SIGINT) while its app was healthy.

    A stop asked for can make a starting service fail: the stop cancels a changelog topic's
    creation, and the answer that comes later raises ``InvalidStateError`` in Faust's task, which
    marks the app crashed, so Faust exits 1. Such a crash is part of the stop, not a fault to
    restart for: :func:`run_worker` exits 0 for it, with a warning.
    """

    asked_to_stop = False

    def _schedule_shutdown(self, sig: signal.Signals) -> None:
        if not self._signal_stop_time and not self.app.crashed:
            self.asked_to_stop = True
        super()._schedule_shutdown(sig)


async def exit_on_crash(app: Any, stop: Callable[[], None], stopping: Callable[[], bool] = lambda: False,
                        poll_s: float = CRASH_POLL_S) -> None:
    """Once any of the app's services crashed, call ``stop`` and return; only return when ``stopping()``
    says a stop was asked for already (the crash is then part of that stop, and a hard end with 0 is
    armed in case that stop hangs: :data:`CRASH_STOP_ASKED_S`).

    Faust runs its services' start and background work in tasks; an exception there (seen: an
    ``InvalidStateError`` of a changelog topic's creation while a rebalance hit a starting worker)
    marks the app crashed and is only logged, so the process would sit in the group, serving its
    metrics and processing nothing, until a signal came. Never raises; polls every ``poll_s`` s.
    """
    while not app.crashed:
        await asyncio.sleep(poll_s)
    if stopping():
        end_hard_after(CRASH_STOP_ASKED_S, 0, f"the worker's Faust app crashed while stopping as asked "
                       f"({app.crash_reason!r}), and the stop has not ended {CRASH_STOP_ASKED_S:g} s later; ending "
                       "it hard with exit code 0: offsets are committed only for records whose outputs were "
                       "acknowledged, so whatever this stop did not commit is read again by the partitions' next owner")
        return
    log.error("the worker's Faust app crashed (%r); stopping, with exit code 1, so that its supervisor "
              "(rewardflow run) starts it again", app.crash_reason)
    stop()


def end_hard_after(seconds: float, code: int, message: str = "") -> threading.Timer:
    """End the process with ``code`` (``os._exit``: no cleanup) unless it ended within ``seconds``;
    ``message`` is logged as an error first. The timer is a daemon thread, started here."""

    def end() -> None:
        if message:
            log.error("%s", message)
        os._exit(code)

    hard = threading.Timer(seconds, end)
    hard.daemon = True
    hard.start()
    return hard


def _stop_crashed() -> None:
    """Faust's graceful stop (which exits 1 for a crashed app), or a hard exit if that hangs."""
    end_hard_after(CRASH_STOP_S, 1, f"the crashed worker has not stopped {CRASH_STOP_S:.0f} s after its SIGTERM; "
                                    "ending it hard with exit code 1")
    os.kill(os.getpid(), signal.SIGTERM)


def run_worker(settings: Settings, *, web: bool = True, loglevel: str = "WARNING",
               on_stopped: list[Callable[[], None]] | None = None, join: JoinWorker | None = None) -> int:
    """Create topics, start the Faust worker and block until it stops. Returns an exit code."""
    log.info("worker starting: Kafka at %s, consumer group %s; partitions a stopped worker held come back "
             "once the group's session timeout passes if it did not leave the group (%.0f s here; the stopped "
             "worker's own REWARDFLOW_GROUP_SESSION_TIMEOUT_S governs)",
             settings.kafka_bootstrap, settings.topic("worker"), settings.group_session_timeout_s)
    ensure_topics(settings)
    join = join or JoinWorker(settings, web=web)
    worker = Worker(join.app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    if loglevel.upper() != "DEBUG":  # Faust's and its Kafka client's start-up chatter: warnings only
        for name in ("faust", "mode", "aiokafka"):
            logging.getLogger(name).setLevel(logging.WARNING)
        logrepeats.install()  # a broker away: its retries once per 10 s, not every 100 ms
    # No terminal spinner: with one, Faust sets the root logger to DEBUG to spin on every record,
    # so each aiokafka debug call builds a LogRecord (profiled: ~12 per input record, then dropped).
    worker.spinner = None
    tune_gc()
    asyncio.ensure_future(exit_on_crash(join.app, _stop_crashed, lambda: worker.asked_to_stop), loop=worker.loop)
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        join.close_clients()
        for cb in on_stopped or []:
            cb()
    if code and worker.asked_to_stop and join.app.crashed:
        log.warning("the worker's Faust app crashed while stopping as asked (%r); exiting 0: offsets are committed "
                    "only for records whose outputs were acknowledged, so whatever this stop did not commit is "
                    "read again by the partitions' next owner", join.app.crash_reason)
        code = 0
    return join.exit_code or code  # the worker stopped itself (a stalled recovery): say so to its supervisor


def main(argv: list[str] | None = None) -> None:
    """``[--web] [--log-level LEVEL]``: ``--web`` serves Prometheus metrics on ``worker_metrics_port``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rewardflow_streams.main", description="Run one stream worker.")
    parser.add_argument("--web", action="store_true", help="serve /metrics on REWARDFLOW_WORKER_METRICS_PORT "
                                                            "(default web_port + 1)")
    parser.add_argument("--log-level", help="log level of the worker (default: INFO); Faust and aiokafka log "
                                            "warnings only, but at DEBUG")
    args = parser.parse_args(argv)
    level = (args.log_level or "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s level=%(levelname)s pid=%(process)d logger=%(name)s %(message)s")
    sys.exit(run_worker(load_settings(), web=args.web, loglevel=level if args.log_level else "WARNING"))


if __name__ == "__main__":
    main()
