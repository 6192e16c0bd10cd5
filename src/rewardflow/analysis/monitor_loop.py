"""Live Goodhart monitoring inside ``rewardflow run``.

Every ``interval`` seconds the loop evaluates the windows that closed since its last round (a window is
closed once every partition that reported for its size has reported a later one:
:func:`~rewardflow.analysis.source.fetch_window_horizons`), with the monitors of
:mod:`rewardflow.analysis.goodhart` and, given a baseline, the exclusion balance of
:mod:`rewardflow.analysis.balance` (largest window size), and publishes alerts it has not published
before to the ``alerts`` topic (the sink writes them to the ``alerts`` table).

What a round reads is bounded by what changed, not by the history stored: the windows closed since the last
round, the windows whose partials were stored since (a correction's delta, a partition that reported late)
or, with a baseline, whose exclusions were (a late event, a dead letter), and the windows whose trailing
baseline holds one of those; read in chunks of :data:`CHUNK_WINDOWS` windows, each with the trailing
windows before it. A fresh loop evaluates the :data:`FIRST_LOOKBACK_WINDOWS` windows and the correction
window before the horizon; ``rewardflow alerts --evaluate`` evaluates the whole history on demand.

Contract: a daemon thread; any error is logged and retried next round, never
raised. Alert ids are deterministic, so a restart republishing an alert only
produces a duplicate the table collapses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from rewardflow.analysis.goodhart import MonitorConfig, alert_messages, evaluate_windows
from rewardflow.kafka import topics as T
from rewardflow.settings import Settings

log = logging.getLogger("rewardflow.monitor")

CHUNK_WINDOWS = 48
"""Windows of one size evaluated per read (four hours of 5-minute windows), so a round after a long backlog
reads in bounded pieces: at most this many windows' partials (one a partition, checkpoint, arm, surface and
spec), and the trailing windows before them."""
FIRST_LOOKBACK_WINDOWS = 24
"""Windows before the horizon (besides the correction window) a fresh loop evaluates."""
CHANGE_MARGIN_S = 120.0
"""Rows stored up to this long before the last round started count as changed again (an insert's time is
taken when it starts; its rows become visible when it ends)."""
PUBLISHED_KEPT = 100_000
"""Alert ids remembered as published."""


def chunks(lo: int, hi: int, size_ms: int, n: int = CHUNK_WINDOWS) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` as consecutive ranges of at most ``n`` windows of ``size_ms``."""
    step = n * size_ms
    while lo < hi:
        yield lo, min(lo + step, hi)
        lo += step


class MonitorLoop(threading.Thread):
    """Evaluate and publish alerts periodically (see the module doc)."""

    def __init__(self, settings: Settings, baseline: str | None, interval: float = 60.0) -> None:
        super().__init__(name="rewardflow-monitor", daemon=True)
        self.settings, self.baseline, self.interval = settings, baseline, interval
        self.stopped = threading.Event()
        self.published: dict[str, bool] = {}  # alert ids published, oldest first (at most PUBLISHED_KEPT)
        self.through: dict[int, int] = {}  # window size (s) -> horizon of the windows evaluated so far
        self.last_round: float | None = None  # wall time (s) the last successful round started

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.round()
            except Exception as exc:  # keep monitoring; the next round retries
                log.warning("monitor round failed: %s", str(exc).splitlines()[0] if str(exc) else exc)

    def first_span(self, size_s: int, horizon: int) -> tuple[int, int]:
        """The window starts ``[lo, horizon)`` a fresh loop evaluates for ``size_s``."""
        size_ms = size_s * 1000
        lo = horizon - FIRST_LOOKBACK_WINDOWS * size_ms - self.settings.correction_window_ms
        return lo - lo % size_ms, horizon

    def affected(self, size_s: int, horizon: int, changed: set[int]) -> list[tuple[int, int]]:
        """Ranges of window starts a round evaluates for ``size_s``: the windows closed since the last round,
        those whose partials (or, for the balance, exclusions) were stored since (``changed``: window starts),
        and the windows whose trailing baseline holds one of them; all below ``horizon``."""
        size_ms = size_s * 1000
        done = self.through.get(size_s)
        if done is None:
            return [self.first_span(size_s, horizon)]
        starts = set(range(min(done, horizon), horizon, size_ms))
        trailing = 0 if self.baseline else MonitorConfig().trailing_windows
        for s in changed:
            starts.update(s + k * size_ms for k in range(trailing + 1))
        ranges: list[tuple[int, int]] = []
        for s in sorted(x for x in starts if x < horizon):
            if ranges and ranges[-1][1] == s:
                ranges[-1] = (ranges[-1][0], s + size_ms)
            else:
                ranges.append((s, s + size_ms))
        return ranges

    def round(self) -> int:
        """One evaluation; returns the number of new alerts published."""
        from confluent_kafka import Producer

        from rewardflow.analysis.source import fetch_changed_windows, fetch_window_horizons

        started = time.time()
        horizons = fetch_window_horizons(self.settings)
        since = None if self.last_round is None else self.last_round - CHANGE_MARGIN_S
        largest = max(self.settings.window_sizes_s)
        alerts: list[Any] = []
        for size, horizon in sorted(horizons.items()):
            changed = set() if since is None else fetch_changed_windows(
                self.settings, size, since, exclusions=bool(self.baseline) and size == largest)
            for lo, hi in self.affected(size, horizon, changed):
                for a, b in chunks(lo, hi, size * 1000):
                    alerts += self._evaluate(size, a, b)
        fresh = [a for a in alerts if a["alert_id"] not in self.published]
        if fresh:
            producer = Producer(self.settings.kafka_client_config())
            for key, value in alert_messages(fresh):
                producer.produce(self.settings.topic(T.ALERTS), value, key)
            if producer.flush(30) != 0:
                return 0  # nothing advances: the next round evaluates these windows again
            for a in fresh:
                log.warning("GOODHART ALERT %s on %s: %s", a["monitor"], a["checkpoint_id"], a["message"])
        self.published.update(dict.fromkeys((a["alert_id"] for a in fresh), True))
        while len(self.published) > PUBLISHED_KEPT:  # the oldest: republished, a duplicate the table collapses
            del self.published[next(iter(self.published))]
        self.through.update(horizons)
        self.last_round = started
        return len(fresh)

    def _evaluate(self, size: int, lo: int, hi: int) -> list[Any]:
        """Alerts of the windows of ``size`` starting in ``[lo, hi)``."""
        from rewardflow.analysis.source import fetch_windows_between

        cfg = MonitorConfig(baseline="same_window" if self.baseline else "trailing")
        cfg = replace(cfg, window_size_s=size)
        before = cfg.trailing_windows * size * 1000 if cfg.baseline == "trailing" else 0
        rows = fetch_windows_between(self.settings, size, lo - before, hi).to_pylist()
        alerts = [a for a in evaluate_windows(rows, self.baseline, cfg) if lo <= a["window_start"] < hi]
        if self.baseline and size == max(self.settings.window_sizes_s):
            alerts += self._balance([r for r in rows if r["window_start"] >= lo], self.baseline, (lo, hi))
        return alerts

    def _balance(self, rows: list[Mapping[str, Any]], baseline: str, span: tuple[int, int]) -> list[Any]:
        """Exclusion-balance alerts over ``rows``, closed windows of the largest size starting in ``span``."""
        from rewardflow.analysis.balance import balance_alerts, mean_rewards
        from rewardflow.analysis.source import fetch_balance

        size = max(self.settings.window_sizes_s)
        spec = max((str(r["spec_version"]) for r in rows), default=None)
        b = fetch_balance(self.settings, rows, window_s=size, spec_version=spec, ts_range=span)
        closed = {int(r["window_start"]) for r in rows}
        alerts = balance_alerts(b, baseline, rewards=mean_rewards(rows, window_s=size, spec_version=spec or ""))
        return [a for a in alerts if a["window_start"] in closed]  # exclusions of open windows wait

