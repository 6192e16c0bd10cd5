"""The producer's background thread: serves delivery reports and sends batches past their delay.

Every ``interval_s`` it calls ``poll(0)`` on the Kafka producer (delivery
callbacks run in this thread then) and the producer's ``tick`` (which sends
session batches older than ``max_delay_ms``, or flags them for the emitting
thread; ``tick`` must not block on the emit path). It is a daemon thread: it never
keeps the interpreter alive; the producer's ``close()`` stops and joins it.
An exception in ``tick`` is logged and the pump keeps going, so one bad tick
cannot silently stop deliveries.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Pump:
    """Started on construction; :meth:`stop` ends it (idempotent, blocks until the thread exits)."""

    def __init__(self, kafka: Any, tick: Callable[[], None], interval_s: float) -> None:
        self._kafka = kafka
        self._tick = tick
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rewardflow-producer-pump", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._kafka.poll(0)
                self._tick()
            except Exception:  # keep pumping; the failure is visible in the log
                log.exception("producer pump tick failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
