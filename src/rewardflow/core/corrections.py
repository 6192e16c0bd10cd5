"""Corrections: a signal that comes after its turn was finalised, within the correction window.

A persistence check from a laptop that slept, or a follow-up delivered after an outage, reaches
the worker after its turn's rewards were emitted. When the event is dated at most
``JoinConfig.correction_ms`` after the turn's final deadline (anchor + last horizon + grace), the
turn is re-scored under every active spec with the event folded in, exactly as if it had come in
time, and a new *revision* of its reward rows is emitted (same ``sample_id``, ``revision`` + 1,
own ``reward_id``), with a delta partial per window size (:func:`correction_deltas`) so merged
windows count the turn as corrected. Anything else for a finalised turn is late, as without
corrections: an ``InferenceServed`` (it would move the turn to another checkpoint or window),
an event past the window, or one for a turn whose state was not kept.

State: the finalised turn's :class:`Tombstone` keeps the turn (every signal folded in), its
deadline, and its revisions ``[number, source offset, outcome]``: the latest, whose outcome is the
turn's own (stored as None), and the earlier ones whose record is not committed yet, at most
:data:`KEEP_REVISIONS` - 1 of them (a stored outcome costs up to about a kilobyte; the session
limits bound the state a client can make the worker keep, ``docs/trust.md``). ``outcome`` stays the first scoring, which the windows are
rebuilt from and the deltas count from. After a restart, every kept revision whose record is
replayed is re-emitted, in order (:func:`reemit`), so a restart delivers the revisions an
uninterrupted run does (a turn corrected more than :data:`KEEP_REVISIONS` times within records
not committed yet re-emits its last ones); ids are deterministic, so nothing doubles. A revision's
``finalised_wm`` is the turn's (the watermark that first finalised it), so its rows never depend on
when the signal was processed; ``finalised_by`` is ``correction``.

Contract: pure, no I/O; decisions depend only on the tombstone and the event, never on timing.
"""

from __future__ import annotations

from typing import Any

import orjson

from rewardflow.core.config import JSON_OPTS, JoinConfig
from rewardflow.core.rows import RewardRecord, WindowAggregate
from rewardflow.core.score import score
from rewardflow.core.session import Tombstone
from rewardflow.core.spec import RewardSpec
from rewardflow.core.turn import TurnOutcome, TurnState, outcome_from_obj, outcome_to_obj
from rewardflow.core.windows import correction_deltas
from rewardflow.events.models import Envelope, InferenceServed

Scored = list[tuple[RewardSpec, str]]  # each active spec with its content hash
KEEP_REVISIONS = 4


def kept(cfg: JoinConfig, turn: TurnState) -> tuple[list[Any] | None, int]:
    """What the tombstone of a finalised served turn keeps for corrections: its state and deadline
    (None, 0 when corrections are off)."""
    if not cfg.correction_ms:
        return None, 0
    return turn.to_obj(), turn.anchor() + cfg.settle_ms


def correction_keep_ms(cfg: JoinConfig) -> int:
    """How far past the watermark that finalised a turn its tombstone still takes corrections: the
    correction window plus the grace period, so a signal dated within the window that arrives as late
    as an open turn allows is taken. Past it the signal is late, even while the tombstone is kept."""
    return cfg.correction_ms + cfg.grace_ms


def correctable(cfg: JoinConfig, tomb: Tombstone, ev: Envelope, wm: int) -> bool:
    """Whether ``ev``, at the partition's watermark ``wm``, corrects the finalised turn of ``tomb``
    instead of being late: dated at most the correction window after the turn's deadline, and
    arriving while the watermark is at most the window plus the grace period past the one that
    finalised the turn (:func:`correction_keep_ms`: a tombstone kept longer only because its window
    is held open takes no more events, so the session limits bound it)."""
    return (tomb.turn is not None and tomb.outcome is not None and type(ev) is not InferenceServed
            and ev.ts <= tomb.deadline + cfg.correction_ms and wm <= tomb.wm + correction_keep_ms(cfg))


def correct(tomb: Tombstone, ev: Envelope, cfg: JoinConfig, offset: int, committed: int | None, scored: Scored,
            partition: int) -> tuple[Tombstone, list[RewardRecord], list[WindowAggregate]]:
    """Fold ``ev`` (at source ``offset``; ``committed``: the source's committed offset, None when unknown)
    into the finalised turn: the tombstone of its next revision, and that revision's reward rows and
    window deltas."""
    assert tomb.turn is not None and tomb.outcome is not None
    turn = TurnState.from_obj(orjson.loads(orjson.dumps(tomb.turn, option=JSON_OPTS)))  # a copy: the stored value is not touched
    revs: list[list[Any]] = []
    for rev, off, outcome in tomb.revs:  # earlier revisions a restart may still have to re-emit
        if committed is None or off >= committed:
            revs.append([rev, off, outcome if outcome is not None else outcome_to_obj(_latest(turn, cfg, tomb.wm))])
    turn.apply(ev)
    revs = [*revs[-(KEEP_REVISIONS - 1):], [tomb.rev + 1, offset, None]]
    # the turn's earliest event, corrections included: the session keeps the seen ids back to it while the
    # tombstone is kept, so a resend of a correction dated before the turn's other events is a duplicate
    first = ev.ts if tomb.first_ts is None or ev.ts < tomb.first_ts else tomb.first_ts
    new = Tombstone(tomb.wm, tomb.offset, tomb.served_ts, tomb.outcome, tomb.orphan, first, tomb.n + 1,
                    turn.to_obj(), tomb.deadline, revs)
    rewards, windows = revision_rows(new, revs[-1], scored, cfg, partition)
    return new, rewards, windows


def _latest(turn: TurnState, cfg: JoinConfig, wm: int) -> TurnOutcome:
    hz = list(cfg.horizons_s)
    return turn.outcome(hz, hz[-1], provisional=False, wm=wm, by="correction")


def revision_rows(tomb: Tombstone, rev: list[Any], scored: Scored, cfg: JoinConfig,
                  partition: int) -> tuple[list[RewardRecord], list[WindowAggregate]]:
    """The reward rows of revision ``rev`` ([number, offset, outcome or None for the latest]) of a
    tombstone's turn, and its window deltas against the first scoring."""
    assert tomb.outcome is not None and tomb.turn is not None
    first = outcome_from_obj(tomb.outcome)
    latest = outcome_from_obj(rev[2]) if rev[2] is not None else _latest(TurnState.from_obj(tomb.turn), cfg, tomb.wm)
    rewards, windows = [], []
    for spec, h in scored:
        r = score(latest, spec, h, revision=int(rev[0]))
        rewards.append(r)
        windows.extend(correction_deltas(score(first, spec, h), r, list(cfg.window_sizes_s), partition))
    return rewards, windows


def reemit(tomb: Tombstone, first_offset: int, scored: Scored, cfg: JoinConfig,
           partition: int) -> tuple[list[RewardRecord], list[WindowAggregate]]:
    """After a restart from ``first_offset``: the rows of every kept revision whose record is replayed, in order."""
    rewards: list[RewardRecord] = []
    windows: list[WindowAggregate] = []
    for rev in tomb.revs:
        if rev[1] >= first_offset:
            r, w = revision_rows(tomb, rev, scored, cfg, partition)
            rewards.extend(r)
            windows.extend(w)
    return rewards, windows
