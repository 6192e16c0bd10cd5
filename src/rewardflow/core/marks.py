"""Batch marks: the watermark at the start of each uncommitted batch, and the one seen ids are pruned at.

Seen ids are pruned at the watermark as of the committed offset, not the current one: a replay
after a crash starts at that offset and must recognise its records' events as redeliveries (a
far-future tick would otherwise make it forget them and judge them late). Tombstones and
everything else follow the current watermark, so decisions do not depend on commit timing; but a
tombstone pruned at an offset not committed yet is only moved aside
(:attr:`~rewardflow.core.session.SessionState.held`) until the commit passes that offset, since
a restart replays its batch against state written after it.

Contract: pure.
"""

from __future__ import annotations


def mark(marks: list[list[int]], first_offset: int, wm: int, committed: int | None,
         keep: int) -> tuple[list[list[int]], int | None]:
    """``marks`` ([first offset of a batch, watermark before it], oldest first) with this batch's added,
    trimmed to what a replay from ``committed`` needs (the last ``keep`` when unknown), and the
    watermark seen ids are pruned at (None when the commit is unknown)."""
    if not marks or first_offset > marks[-1][0]:  # a replayed batch adds no mark
        marks.append([first_offset, wm])
    if committed is None:
        return marks[-keep:], None
    at = [i for i, m in enumerate(marks) if m[0] <= committed]
    marks = marks[at[-1]:] if at else marks
    return marks, min(m[1] for m in marks)
