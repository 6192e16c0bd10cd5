"""Counters of the sink. Updated by the sink's thread only; safe to read from any thread."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SinkMetrics:
    """Monotonic counters since the sink started.

    ``rows_written`` / ``batches`` are per table and count rows as the sink
    counted them (a replayed batch that ClickHouse dropped as a duplicate still
    counts: ClickHouse reports dropped rows as written). ``replayed_batches``
    counts batches re-cut from the ledger (a replay or a retry after restart).
    """

    rows_written: Counter[str] = field(default_factory=Counter)
    batches: Counter[str] = field(default_factory=Counter)
    records_read: int = 0
    retries: int = 0
    dead_lettered: int = 0
    commits: int = 0
    commit_failures: int = 0
    replayed_batches: int = 0
    unavailable_since: float | None = None
    last_error: str = ""

    def snapshot(self) -> dict[str, Any]:
        """A plain-dict copy (for /metrics, logs and tests)."""
        return {
            "rows_written": dict(self.rows_written),
            "batches": dict(self.batches),
            "records_read": self.records_read,
            "retries": self.retries,
            "dead_lettered": self.dead_lettered,
            "commits": self.commits,
            "commit_failures": self.commit_failures,
            "replayed_batches": self.replayed_batches,
            "unavailable": self.unavailable_since is not None,
            "last_error": self.last_error,
        }
