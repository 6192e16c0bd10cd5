"""Settling one session at a watermark: its due turns finalised, the others' provisional rewards.

Pure: no store, no clock. :class:`~rewardflow.core.processor.PartitionProcessor` calls
:func:`settle_turns` for each session whose wake-up the watermark reached, then prunes the session
and adds the final rewards to its window book.

* A turn is due once its anchor (:meth:`TurnState.anchor`) plus ``settle_ms`` is at or below the
  watermark. A served turn becomes a final reward under every spec and a tombstone carrying its
  outcome; a turn that was never served, or whose scoring raised, becomes an orphan exclusion and
  a tombstone without outcome. Either way the turn leaves ``st.turns``.
* A turn not due yet, when provisional rewards are on, gets one provisional reward per spec each time
  the watermark passes another of its horizons (plus the grace period); the last horizon is final only.
* Order: turns in the session's order, specs in their order; the outputs are appended in that order.
"""

from __future__ import annotations

from rewardflow.core.config import JoinConfig
from rewardflow.core.corrections import kept
from rewardflow.core.outputs import Outputs, turn_exclusion
from rewardflow.core.rows import RewardRecord
from rewardflow.core.score import score
from rewardflow.core.session import SessionState, Tombstone
from rewardflow.core.spec import RewardSpec
from rewardflow.core.turn import outcome_to_obj


def settle_turns(st: SessionState, cfg: JoinConfig, wm: int, offset: int, by: str,
                 scored: list[tuple[RewardSpec, str]], partition: int, out: Outputs) -> tuple[list[RewardRecord], list[str]]:
    """Settle ``st``'s turns at watermark ``wm`` (reached by the record at ``offset``, ``by`` its cause).

    Appends the rewards and orphans to ``out``; returns the final rewards (for the window book), in the
    order appended, and the request ids of the turns finalised. Never raises for a turn: one whose
    scoring raises is an orphan with the exception as its reason.
    """
    hz, settle_ms = cfg.horizons_s, cfg.settle_ms
    finals: list[RewardRecord] = []
    finalised: list[str] = []
    for rid, turn in list(st.turns.items()):
        anchor = turn.anchor()
        if anchor + settle_ms <= wm:
            recs, o, failure = None, None, ""
            if turn.served is not None:
                try:
                    o = turn.outcome(hz, hz[-1], provisional=False, wm=wm, by=by)
                    recs = [score(o, s, h) for s, h in scored]
                except Exception as exc:  # noqa: BLE001 - the turn alone is excluded, not its record
                    failure = f"{type(exc).__name__}: {exc}"[:500]
            if recs is not None and o is not None:
                out.rewards.extend(recs)
                finals.extend(recs)
                st.finalise(rid, Tombstone(wm, offset, o.served_ts, outcome_to_obj(o), None, turn.first_ts, turn.n,
                                           *kept(cfg, turn)))
            else:
                orphan = turn_exclusion(turn, wm, partition, failure)
                out.excluded.append(orphan)  # type: ignore[arg-type]
                st.finalise(rid, Tombstone(wm, offset, -1, None, orphan, turn.first_ts, turn.n))
            del st.turns[rid]
            finalised.append(rid)
        elif cfg.provisional and turn.served is not None:
            reached = [h for h in hz[:-1] if anchor + h * 1000 + cfg.grace_ms <= wm]
            if reached and reached[-1] > turn.provisional_h:
                turn.note_provisional(reached[-1])
                o = turn.outcome(hz, reached[-1], provisional=True, wm=wm, by=by)
                out.rewards.extend(score(o, s, h) for s, h in scored)
    return finals, finalised
