"""The settings every read connection runs with, and the refusal of a statement that is not a read.

Two layers, both always applied by rewardflow's read paths:

1. :class:`~.sqlguard.SqlGuard` refuses, on ClickHouse's own parser, any
   statement that is not a single read, writes a file, or reaches outside the
   database; it gives the clear message;
2. the query itself runs with :func:`read_settings`: ``readonly = 1`` (which a
   query cannot switch off) and the limits of time, memory and result size,
   which the engine enforces. This is the guarantee.
"""

from __future__ import annotations

from typing import Any

from rewardflow.settings import Settings

READONLY_SETTINGS: dict[str, int] = {"readonly": 1}


class ReadOnlyViolation(ValueError):
    """The statement would write, or is not a single read statement."""


def read_settings(settings: Settings) -> dict[str, Any]:
    """Session settings of a read connection: the read limits of ``settings``, then ``readonly = 1``
    last (after it, none can change)."""
    return {
        "max_execution_time": settings.read_max_execution_s,
        "max_memory_usage": settings.read_max_memory_bytes,
        "max_result_rows": settings.read_max_result_rows,
        "max_result_bytes": settings.read_max_result_bytes,
        "result_overflow_mode": "throw",
        **READONLY_SETTINGS,
    }
