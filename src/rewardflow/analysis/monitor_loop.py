"""Live Goodhart monitoring inside ``rewardflow run``.

Every ``interval`` seconds the loop reads the window partials from ClickHouse,
keeps the windows every reporting partition has moved past (see
:func:`closed_rows`), evaluates the monitors of
:mod:`rewardflow.analysis.goodhart` and, given a baseline, the exclusion balance of
:mod:`rewardflow.analysis.balance` (largest window size), and publishes alerts it has not published
before to the ``alerts`` topic (the sink writes them to the ``alerts`` table).

Contract: a daemon thread; any error is logged and retried next round, never
raised. Alert ids are deterministic, so a restart republishing an alert only
produces a duplicate the table collapses.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from rewardflow.kafka import topics as T
from rewardflow.settings import Settings

log = logging.getLogger("rewardflow.monitor")


def closed_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Partials of windows that every partition seen for that size has closed a later window after.

    A partition emits a window's partial only once it closed it; when each
    partition that ever reported for a size has reported a later window, no
    partial of the earlier window can still be missing.
    """
    rows = list(rows)
    latest: dict[tuple[int, int], int] = {}
    for r in rows:
        k = (int(r["window_size_s"]), int(r["source_partition"]))
        latest[k] = max(latest.get(k, -1), int(r["window_start"]))
    horizon: dict[int, int] = {}
    for (size, _), start in latest.items():
        horizon[size] = min(horizon.get(size, start), start)
    return [r for r in rows if int(r["window_start"]) < horizon[int(r["window_size_s"])]]


class MonitorLoop(threading.Thread):
    """Evaluate and publish alerts periodically (see the module doc)."""

    def __init__(self, settings: Settings, baseline: str | None, interval: float = 60.0) -> None:
        super().__init__(name="rewardflow-monitor", daemon=True)
        self.settings, self.baseline, self.interval = settings, baseline, interval
        self.stopped = threading.Event()
        self.published: set[str] = set()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.round()
            except Exception as exc:  # keep monitoring; the next round retries
                log.warning("monitor round failed: %s", str(exc).splitlines()[0] if str(exc) else exc)

    def round(self) -> int:
        """One evaluation; returns the number of new alerts published."""
        from confluent_kafka import Producer

        from rewardflow.analysis.goodhart import MonitorConfig, alert_messages, evaluate_windows
        from rewardflow.analysis.source import fetch_windows_all

        rows = closed_rows(fetch_windows_all(self.settings).to_pylist())
        cfg = MonitorConfig(baseline="same_window" if self.baseline else "trailing")
        alerts = evaluate_windows(rows, self.baseline, cfg)
        if self.baseline:  # the exclusion balance compares arms: it needs the baseline
            alerts += self._balance(rows, self.baseline)
        alerts = [a for a in alerts if a["alert_id"] not in self.published]
        if not alerts:
            return 0
        producer = Producer(self.settings.kafka_client_config())
        for key, value in alert_messages(alerts):
            producer.produce(self.settings.topic(T.ALERTS), value, key)
        if producer.flush(30) == 0:
            self.published.update(a["alert_id"] for a in alerts)
            for a in alerts:
                log.warning("GOODHART ALERT %s on %s: %s", a["monitor"], a["checkpoint_id"], a["message"])
        return len(alerts)

    def _balance(self, rows: list[Mapping[str, Any]], baseline: str) -> list[Any]:
        """Exclusion-balance alerts over the closed windows of the largest size."""
        from rewardflow.analysis.balance import balance_alerts, mean_rewards
        from rewardflow.analysis.source import fetch_balance

        size = max(self.settings.window_sizes_s)
        spec = max((str(r["spec_version"]) for r in rows), default=None)
        b = fetch_balance(self.settings, rows, window_s=size, spec_version=spec)
        closed = {int(r["window_start"]) for r in rows if int(r["window_size_s"]) == size}
        alerts = balance_alerts(b, baseline, rewards=mean_rewards(rows, window_s=size, spec_version=spec or ""))
        return [a for a in alerts if a["window_start"] in closed]  # exclusions of open windows wait
