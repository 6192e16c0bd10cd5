"""Worker counters, the dead-letter ratio alarm and their Prometheus text form.

Contract: in-memory only, updated from the agent's loop (single thread).
"""

from __future__ import annotations

import logging
import time
from collections import deque

from rewardflow.core.outputs import Outputs

log = logging.getLogger("rewardflow.streams")
STAGES = ("wait", "admit", "process", "encode", "confirm")


class WorkerMetrics:
    """Counts of what the worker consumed and emitted, plus a sliding DLQ ratio."""

    def __init__(self, dlq_limit: float, window_s: float) -> None:
        self.counters: dict[str, int] = {
            "records_in": 0, "events_valid": 0, "dead_letters": 0, "late": 0, "duplicates": 0,
            "orphans": 0, "rewards_final": 0, "rewards_provisional": 0, "windows_closed": 0, "ticks": 0,
            "offset_gaps": 0, "offset_gap_records_lost": 0, "state_reads": 0, "state_decodes": 0,
        }
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

    def time(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` to ``stage`` (one of :data:`STAGES`)."""
        self.stage_seconds[stage] += seconds

    def observe(self, out: Outputs, records: int = 1, ticks: int = 0) -> None:
        """Count one batch: ``records`` raw records (``ticks`` of them idle ticks) and its outputs."""
        c = self.counters
        c["records_in"] += records
        c["ticks"] += ticks
        c["events_valid"] += len(out.valid)
        c["dead_letters"] += len(out.dead)
        c["late"] += len(out.late)
        for x in out.excluded:
            c["orphans" if x["reason"] == "orphan" else "duplicates"] += 1
        for r in out.rewards:
            c["rewards_provisional" if r["provisional"] else "rewards_final"] += 1
        c["windows_closed"] += len(out.windows)
        for d in out.dead:
            self.dead_by_reason[d["reason_code"]] = self.dead_by_reason.get(d["reason_code"], 0) + 1
        if out.valid or out.dead:
            self._slide(len(out.valid), len(out.dead))

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
        lines = []
        for k, v in self.counters.items():
            lines += [f"# TYPE rewardflow_{k}_total counter", f"rewardflow_{k}_total {v}"]
        for reason, v in sorted(self.dead_by_reason.items()):
            lines.append(f'rewardflow_dead_letters_by_reason_total{{reason="{reason}"}} {v}')
        lines.append("# TYPE rewardflow_stage_seconds_total counter")
        for stage, sec in self.stage_seconds.items():
            lines.append(f'rewardflow_stage_seconds_total{{stage="{stage}"}} {sec:.6f}')
        lines += ["# TYPE rewardflow_dead_letter_ratio gauge", f"rewardflow_dead_letter_ratio {self.dlq_ratio:.6f}",
                  f"rewardflow_dead_letter_alarm {int(self.alarm)}"]
        return "\n".join(lines) + "\n"
