"""Kafka clients' retry chatter, told once per interval.

While a broker is away, aiokafka logs each failed attempt to reach it (every 100 ms or so, at ERROR)
and librdkafka each failed connect: one lost broker wrote ~325 lines in 10 s per worker, among which
a real fault is hard to see. :class:`Repeats` lets a message through once per ``every_s`` for each
logger and message template, and says how many it held back on the next one it lets through. The
retried connection errors of :data:`TRANSIENT` are warnings: the clients retry them, and the worker's
stall watch reports a partition that stops moving.

Contract: only filters and rewrites log records; thread-safe; keeps one entry per (logger, template);
a template that starts with its first argument (librdkafka's ``"%s [%s] %s"``, the facility first)
counts per value of that argument.
"""

from __future__ import annotations

import logging
import threading
import time

KAFKA_LOGGERS = ("aiokafka", "aiokafka.conn", "aiokafka.cluster", "aiokafka.consumer.fetcher",
                 "aiokafka.consumer.group_coordinator", "aiokafka.consumer.consumer", "aiokafka.producer.sender",
                 "aiokafka.producer.producer", "rewardflow.librdkafka")
"""The loggers :func:`install` filters: aiokafka's and the one librdkafka's lines go to."""

TRANSIENT = ("Unable connect to node with id", "Failed fetch messages from", "Group Coordinator Request failed",
             "Got error produce response")
"""Starts of aiokafka messages about a broker it cannot reach yet and retries: logged as warnings, as
are librdkafka's ``FAIL`` lines (a connection that failed; it reconnects)."""


class Repeats(logging.Filter):
    """Each (logger, template) once per ``every_s``; see the module doc."""

    def __init__(self, every_s: float = 10.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # -> (when last let through, held back since)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        template = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        if template.startswith("%s") and isinstance(record.args, tuple) and record.args:
            template += f"|{record.args[0]}"  # ("%s [%s] %s": librdkafka's lines, keyed by their facility too)
        key, now = (record.name, template), time.monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.every_s:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            self._seen[key] = (now, 0)
        transient = template.startswith(TRANSIENT) or template.endswith("|FAIL")  # (librdkafka: a failed connect)
        if record.levelno > logging.WARNING and transient:
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        if last is not None and last[1]:  # (the text added holds no %: safe with or without args)
            record.msg = f"{record.msg} ({last[1]} more like it since the last one shown)"
        return True


def install(every_s: float = 10.0) -> Repeats:
    """Filter :data:`KAFKA_LOGGERS` with one :class:`Repeats` (call once a process)."""
    repeats = Repeats(every_s)
    for name in KAFKA_LOGGERS:
        logging.getLogger(name).addFilter(repeats)
    return repeats
