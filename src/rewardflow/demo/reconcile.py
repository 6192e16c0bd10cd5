"""Reconciliation of a demo run: what was planted vs what the tables hold.

Contract: pure. Simulated turns = finalised samples + orphan turns; planted
malformed records = refused at the ingestion edge (or, sent straight to Kafka,
dead letters); planted late signals within the correction window = corrected samples
(a revision > 0), past it = late rows; planted duplicates = duplicate exclusions; distinct
valid events = events rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table


@dataclass(frozen=True, slots=True)
class Counts:
    finalised: int
    orphans: int
    duplicates: int
    late: int
    dead_letters: int
    events: int
    corrected: int = 0

    def covers(self, expected: Counts) -> bool:
        """Every expected output has arrived (used to stop waiting)."""
        return (self.finalised + self.orphans >= expected.finalised + expected.orphans
                and self.dead_letters >= expected.dead_letters and self.late >= expected.late
                and self.corrected >= expected.corrected)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    expected: int
    actual: int

    @property
    def ok(self) -> bool:
        return self.expected == self.actual


def expected_counts(truth: Any, *, through_edge: bool = False) -> Counts:
    """What the tables should hold; through the edge, malformed records never reach Kafka."""
    turns = sum(c.turns for c in truth.checkpoints.values())
    return Counts(finalised=turns, orphans=truth.orphan_turns, duplicates=truth.duplicates, late=truth.late,
                  dead_letters=0 if through_edge else truth.malformed, events=truth.valid_events,
                  corrected=truth.corrected)


def reconcile(expected: Counts, actual: Counts, edge: tuple[int, int] | None = None) -> list[Check]:
    """The checks; ``edge`` = (malformed records planted, refused at the edge) when the traffic went through it."""
    planted = [] if edge is None else [Check("planted malformed = refused at the edge", *edge)]
    return planted + [
        Check("simulated turns = finalised samples + orphans", expected.finalised + expected.orphans,
              actual.finalised + actual.orphans),
        Check("finalised samples", expected.finalised, actual.finalised),
        Check("orphan turns", expected.orphans, actual.orphans),
        Check("dead letters" if edge is not None else "planted malformed = dead letters",
              expected.dead_letters, actual.dead_letters),
        Check("planted late signals within the correction window = corrected samples", expected.corrected,
              actual.corrected),
        Check("planted late signals past it = late rows", expected.late, actual.late),
        Check("planted duplicates = duplicate exclusions", expected.duplicates, actual.duplicates),
        Check("distinct valid events = events rows", expected.events, actual.events),
    ]


def reconcile_table(checks: list[Check]) -> Table:
    table = Table(title="reconciliation", title_justify="left")
    for col in ("check", "expected", "actual", ""):
        table.add_column(col)
    for c in checks:
        table.add_row(c.name, f"{c.expected:,}", f"{c.actual:,}", "[green]ok" if c.ok else "[red]MISMATCH")
    return table
