"""Several collector processes on one listening socket (``rewardflow collect --processes N``).

One interpreter serves about one core; the edge's work is per request and shares nothing but the
keys, so N processes accept from the same socket and each produces to Kafka on its own. Each
reads the keys from the configured ClickHouse itself: a server, or the read endpoint of the
process that owns the embedded chDB (``rewardflow run``). Prometheus metrics are per process
(a scrape reaches one of them).

Contract: :func:`serve_processes` blocks until every child has stopped. SIGINT/SIGTERM reach the
children, which finish their requests in flight and flush Kafka. A child that dies on its own
stops the others; the exit code is then 1.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import time
from typing import Any

from rewardflow.settings import load_settings

log = logging.getLogger(__name__)


def _child(sock: socket.socket, log_level: str) -> None:
    from rewardflow.clickhouse.connect import open_reader
    from rewardflow.collector.server import Collector, keys_from_reader

    logging.basicConfig(level=log_level, format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")
    settings = load_settings()
    Collector(settings, keys_from_reader(open_reader(settings)), sock=sock).serve()


def serve_processes(sock: socket.socket, n: int, log_level: str = "INFO") -> int:
    """Serve the edge from ``n`` child processes on ``sock``; returns the exit code."""
    ctx = multiprocessing.get_context("spawn")
    children = [ctx.Process(target=_child, args=(sock, log_level), name=f"rewardflow-collect-{i}") for i in range(n)]
    for child in children:
        child.start()
    log.info("collector: %d processes on %s", n, sock.getsockname())
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.is_alive() and child.pid is not None:
                child.terminate()  # SIGTERM: uvicorn finishes requests in flight, then Kafka is flushed

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = 0
    while any(c.is_alive() for c in children):
        died = [c for c in children if not c.is_alive() and c.exitcode not in (0, None, -signal.SIGTERM)]
        if died and not stopping:
            log.error("collector process %s exited with %s: stopping the others", died[0].name, died[0].exitcode)
            code = 1
            stop()
        time.sleep(0.2)
    for child in children:
        child.join()
    return code
