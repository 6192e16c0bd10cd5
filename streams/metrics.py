"""Worker counters, the dead-letter ratio alarm and their Prometheus text form (prometheus_client).

Contract: in-memory only, updated from the agent's loop (single thread); :meth:`WorkerMetrics.prometheus`
renders the current values through a registry of this instance's own (no process-global state).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rewardflow.core.outputs import Outputs

log = logging.getLogger("rewardflow.streams")
STAGES = ("wait", "admit", "process", "encode", "confirm")


@dataclass(slots=True)
class Tally:
    """What one batch emitted, counted: all :meth:`WorkerMetrics.observe` needs of its outputs. The
    worker keeps this, not the rows, until the batch is confirmed (the rows are sent and freed)."""

    valid: int = 0
    dead: int = 0
    late: int = 0
    orphans: int = 0
    duplicates: int = 0
    rewards_final: int = 0
    rewards_provisional: int = 0
    windows: int = 0
    dead_by_reason: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, out: Outputs) -> Tally:
        t = cls(valid=len(out.valid), dead=len(out.dead), late=len(out.late), windows=len(out.windows))
        for x in out.excluded:
            if x["reason"] == "orphan":
                t.orphans += 1
            else:
                t.duplicates += 1
        for r in out.rewards:
            if r["provisional"]:
                t.rewards_provisional += 1
            else:
                t.rewards_final += 1
        for d in out.dead:
            t.dead_by_reason[d["reason_code"]] = t.dead_by_reason.get(d["reason_code"], 0) + 1
        return t


class WorkerMetrics:
    """Counts of what the worker consumed and emitted, plus a sliding DLQ ratio."""

    def __init__(self, dlq_limit: float, window_s: float) -> None:
        self.counters: dict[str, int] = {
            "records_in": 0, "events_valid": 0, "dead_letters": 0, "late": 0, "duplicates": 0,
            "orphans": 0, "rewards_final": 0, "rewards_provisional": 0, "windows_closed": 0, "ticks": 0,
            "offset_gaps": 0, "offset_gap_records_lost": 0, "state_reads": 0, "state_decodes": 0,
            "recoveries": 0, "recovery_stalls": 0, "stalls_resumed": 0,
            "commit_stops": 0,  # batches stopped for a commit: a session's held tombstones reached its limits
        }
        self.recovery_seconds = 0.0  # summed over finished changelog recoveries
        self.recovery_last_s = 0.0
        self.recovery_max_s = 0.0
        self.restoring = 0  # partitions with changelog records still to restore
        self.dead_by_reason: dict[str, int] = {}
        self.dlq_limit, self.window_s = dlq_limit, window_s
        self._recent: deque[tuple[float, int, int]] = deque()
        self._recent_valid = self._recent_dead = 0  # running sums over _recent
        self.dlq_ratio = 0.0
        self.alarm = False
        # seconds the agent spent per pipeline stage (where a worker's time goes, without a profiler):
        # wait = for the next batch; admit = gap check; process = the core; encode = output rows to
        # bytes and queued sends; confirm = until the sends are acknowledged
        self.stage_seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self._registry: CollectorRegistry | None = None

    def recovered(self, seconds: float) -> None:
        """Count one finished changelog recovery that took ``seconds``."""
        self.counters["recoveries"] += 1
        self.recovery_seconds += seconds
        self.recovery_last_s = seconds
        self.recovery_max_s = max(self.recovery_max_s, seconds)

    def time(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` to ``stage`` (one of :data:`STAGES`)."""
        self.stage_seconds[stage] += seconds

    def observe(self, out: Outputs | Tally, records: int = 1, ticks: int = 0) -> None:
        """Count one batch: ``records`` raw records (``ticks`` of them idle ticks) and its outputs
        (the rows, or their :class:`Tally`)."""
        t = out if isinstance(out, Tally) else Tally.of(out)
        c = self.counters
        c["records_in"] += records
        c["ticks"] += ticks
        c["events_valid"] += t.valid
        c["dead_letters"] += t.dead
        c["late"] += t.late
        c["orphans"] += t.orphans
        c["duplicates"] += t.duplicates
        c["rewards_final"] += t.rewards_final
        c["rewards_provisional"] += t.rewards_provisional
        c["windows_closed"] += t.windows
        for reason, n in t.dead_by_reason.items():
            self.dead_by_reason[reason] = self.dead_by_reason.get(reason, 0) + n
        if t.valid or t.dead:
            self._slide(t.valid, t.dead)

    def _slide(self, valid: int, dead: int) -> None:
        now = time.monotonic()
        self._recent.append((now, valid, dead))
        self._recent_valid += valid
        self._recent_dead += dead
        while self._recent and self._recent[0][0] < now - self.window_s:
            _, old_valid, old_dead = self._recent.popleft()
            self._recent_valid -= old_valid
            self._recent_dead -= old_dead
        v, d = self._recent_valid, self._recent_dead
        self.dlq_ratio = d / (v + d) if v + d else 0.0
        alarm = self.dlq_ratio > self.dlq_limit and v + d >= 20
        if alarm and not self.alarm:
            log.error("DEAD-LETTER RATIO %.1f%% over the last %.0fs exceeds the limit %.1f%% (by reason: %s)",
                      100 * self.dlq_ratio, self.window_s, 100 * self.dlq_limit, self.dead_by_reason)
        self.alarm = alarm

    def prometheus(self) -> str:
        """The Prometheus text exposition of the current values."""
        if self._registry is None:
            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(_Collector(self))
        return generate_latest(self._registry).decode()


class _Collector(Collector):
    """Yields a :class:`WorkerMetrics`' values as metric families at each scrape."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        for name, value in m.counters.items():
            yield CounterMetricFamily(f"rewardflow_{name}", f"worker {name.replace('_', ' ')}", value=value)
        by_reason = CounterMetricFamily("rewardflow_dead_letters_by_reason", "dead letters by reason code",
                                        labels=["reason"])
        for reason, value in sorted(m.dead_by_reason.items()):
            by_reason.add_metric([reason], value)
        yield by_reason
        stages = CounterMetricFamily("rewardflow_stage_seconds", "seconds the agent spent per stage", labels=["stage"])
        for stage, seconds in m.stage_seconds.items():
            stages.add_metric([stage], seconds)
        yield stages
        yield GaugeMetricFamily("rewardflow_dead_letter_ratio", "dead-letter share over the sliding window",
                                value=m.dlq_ratio)
        yield GaugeMetricFamily("rewardflow_dead_letter_alarm", "1 while the ratio exceeds its limit", value=int(m.alarm))
        yield CounterMetricFamily("rewardflow_recovery_seconds", "seconds spent in finished changelog recoveries",
                                  value=m.recovery_seconds)
        yield GaugeMetricFamily("rewardflow_recovery_last_seconds", "how long the last changelog recovery took",
                                value=m.recovery_last_s)
        yield GaugeMetricFamily("rewardflow_recovery_max_seconds", "the longest changelog recovery of this process",
                                value=m.recovery_max_s)
        yield GaugeMetricFamily("rewardflow_partitions_restoring", "partitions with changelog records left to restore",
                                value=m.restoring)
