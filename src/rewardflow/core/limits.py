"""What one session may hold and take: the rules that bound a session's state, whatever a client
sends. Each rule returns a dead-letter code and reason, or None; the processor dead-letters the event.

A session may hold at most ``max_session_turns`` turns (open ones plus finalised ones whose
tombstone is within ``keep_done_ms`` of the watermark) and ``max_session_events`` events in them.
An event beyond either is refused with a dead-letter code; only that session's excess is affected.
The counts depend on the session's own turns and the partition's watermark only: a tombstone is
also kept while a window holding its turn is open, and another session's open turn can hold a
window back, so counting kept tombstones would let another tenant use up a session's limit. Nor
does a decision depend on when expired tombstones happen to be pruned (a restart rebuilds the
wake-up schedule, and prunes at other times).

A session can therefore store more than its limits: tombstones past ``keep_done_ms`` whose
windows are held back, and those a worker keeps until its commit. :func:`stored_factor` bounds how
many times its limits.

Contract: pure. :data:`TURN_BYTES` and :data:`EVENT_BYTES` bound what a turn and an event add
to the stored state at the contract's longest ids, so a session at its limits fits a
changelog record of ``turns * TURN_BYTES + events * EVENT_BYTES`` bytes
times :func:`stored_factor` (``tests/core/test_untrusted.py`` builds such sessions). The bound counts a byte a character:
the ids and labels the state keeps are ``printable`` in the schemas (ASCII that JSON writes as
itself), and the free-text fields it would not fit are kept nowhere in the state.
"""

from __future__ import annotations

from rewardflow.core.config import JoinConfig
from rewardflow.core.corrections import correction_keep_ms
from rewardflow.core.session import SessionState
from rewardflow.events.models import AgentEdit, Envelope, InferenceServed

BROKER_DEFAULT_MAX = 1_048_588
"""Kafka's default ``max.message.bytes``."""
RECORD_SLACK = 64 * 1024
"""Room for a record's framing and headers beyond its value."""


def raw_record_limit(max_record_bytes: int) -> int:
    """The largest raw record (as the broker counts it) the raw topic takes: a little over
    ``max_record_bytes``, and never below the broker's default. A dead letter carries at most this much
    of what it refused, and the dead-letter topic is sized for one carrying it whole."""
    return max(BROKER_DEFAULT_MAX, max_record_bytes + RECORD_SLACK)


TURN_BYTES = 4_096
"""Most bytes one turn adds to its session's stored state, open or as a tombstone: with corrections,
a tombstone keeps its first outcome and up to three earlier revisions' (:mod:`rewardflow.core.corrections`)."""
EVENT_BYTES = 400
"""Most bytes one applied event adds to its session's stored state (its seen id, a check or an edit)."""


def within(st: SessionState, cfg: JoinConfig, new_turn: bool) -> bool:
    """Whether one more event (opening a turn if ``new_turn``) leaves the session within its limits
    even counting its expired tombstones not yet pruned: then :func:`refusal` is None, and the
    processor asks nothing more (this runs for every event)."""
    turns, events = st.load()
    return (not new_turn or turns < cfg.max_session_turns) and events < cfg.max_session_events


def refusal(st: SessionState, cfg: JoinConfig, new_turn: bool, wm: int) -> tuple[str, str] | None:
    """The dead-letter code and reason when one more event (opening a turn if ``new_turn``) would
    put the session over its limits at the watermark ``wm``, else None. Cheap while the session is
    far from them (:func:`within`)."""
    if within(st, cfg, new_turn):
        return None
    turns, events = st.live_load(wm, cfg.keep_done_ms)
    if new_turn and turns >= cfg.max_session_turns:
        return ("session_turn_limit", f"session {st.session_id[:128]!r} holds {turns} turns, the limit "
                f"(REWARDFLOW_MAX_SESSION_TURNS={cfg.max_session_turns}); a finalised turn counts until "
                "its tombstone expires")
    if events >= cfg.max_session_events:
        return ("session_event_limit", f"session {st.session_id[:128]!r} holds {events} events, the limit "
                f"(REWARDFLOW_MAX_SESSION_EVENTS={cfg.max_session_events})")
    return None


def stored_factor(cfg: JoinConfig) -> int:
    """The most times its limits (turns, and events in them) a session's stored state holds.

    What the limits count is the open turns and the tombstones finalised within ``keep_done_ms`` of the
    watermark. What a session stores beyond that:

    * a tombstone whose served event is in a window still open: an open served turn holds its
      partition's windows back by at most the settle time plus ``max_turn_span_ms`` (its deadline is
      ahead of the watermark, its anchor at most the span after its served event, :func:`span_refusal`),
      a window is at most ``longest_window_ms`` long, and a served turn is finalised a settle time after
      its served event at the earliest: so it was finalised at most ``max_turn_span_ms +
      longest_window_ms`` behind the watermark;
    * the seen ids an open turn keeps, back to its first event (at most the settle time plus the span
      behind the watermark), and those kept for ``dedup_ms`` (their turn finalised at most the grace
      period before them);
    * anything expired until the session's next pruning wake-up, at most ``prune_step_ms`` later;
    * the tombstones pruned at an offset the source commit has not passed (``SessionState.held``).

    So what is stored beyond the count, held tombstones aside, was finalised at most ``older`` before the
    oldest counted tombstone. The turns finalised within one stretch of ``keep_done_ms - correction_keep_ms``
    (corrections off: of ``keep_done_ms``) were all counted, at their final size, at one watermark (a
    tombstone takes corrections only within ``correction_keep_ms``), so they are within the limits
    together; the counted ones are within them as well. The held ones are one more multiple: the worker
    stops a batch once a session's held tombstones reach its limits and has the commit pass it
    (``PartitionProcessor.process_batch(until_commit=True)``), so they are below them before any record,
    and a record only moves tombstones there from what the rest of the bound counts.
    """
    keep = cfg.keep_done_ms
    stretch = keep - correction_keep_ms(cfg) if cfg.correction_ms else keep
    held = max(cfg.max_turn_span_ms + max(cfg.longest_window_ms, cfg.settle_ms), cfg.dedup_ms + cfg.grace_ms)
    older = max(0, held - keep) + cfg.prune_step_ms
    return 2 + -(-older // stretch)


def age_refusal(cfg: JoinConfig, ts: int, wm: int, deadline: bool = False) -> tuple[str, str] | None:
    """The dead-letter code and reason of an event for an open turn dated more than its turn's settle time
    plus ``max_turn_span_ms`` behind the watermark ``wm``, else None. For a correction of a finalised turn
    (``deadline``), ``wm`` is the turn's deadline, which every watermark it was open at was below: the
    widest bound the turn had while open.

    An open turn's deadline (its anchor plus the settle time) is still ahead of the watermark, and its
    anchor is at most ``max_turn_span_ms`` after its served event (:func:`span_refusal`), so no event of
    the turn is that old. Without the bound a turn would take events of any date, and each new date is a
    new day partition of the ``events`` table, shared by every tenant."""
    behind = wm - ts
    if behind <= cfg.settle_ms + cfg.max_turn_span_ms:
        return None
    which = "its turn's deadline" if deadline else "the partition's watermark"
    return ("too_old", f"ts {ts} is {behind} ms behind {which}; a turn's events are at most "
            f"{cfg.settle_ms + cfg.max_turn_span_ms} ms behind it (its settle time plus "
            f"REWARDFLOW_MAX_TURN_SPAN_MS)")


def span_refusal(cfg: JoinConfig, ev: Envelope, served_ts: int, first_ts: int | None = None,
                 last_edit: int | None = None) -> tuple[str, str] | None:
    """The dead-letter code and reason of an event that would put its turn's anchor (its latest edit) more
    than ``max_turn_span_ms`` after its served event, or, while it has none, after its first event; else
    None. ``served_ts`` is the turn's served time (negative: none yet), ``first_ts`` its first event's time
    and ``last_edit`` its latest edit's (None: no such turn, or no edit).

    Each edit puts off its turn's deadline, and an open served turn holds back its partition's windows; an
    open turn also keeps its session's seen ids. So an edit dated past the span is refused, and so is an
    ``InferenceServed`` that would become the turn's (the earliest wins) dated more than the span before
    its latest edit, whatever order they come in. A correction of a finalised turn is bound alike."""
    span, kind = cfg.max_turn_span_ms, type(ev)
    if kind is AgentEdit:
        base = served_ts if served_ts >= 0 else first_ts
        if base is not None and ev.ts - base > span:
            which = "InferenceServed" if served_ts >= 0 else "first event (it has no InferenceServed)"
            return ("turn_span_limit", f"edit dated {ev.ts - base} ms after its turn's {which} (allowed: {span} ms, "
                    "REWARDFLOW_MAX_TURN_SPAN_MS)")
    elif kind is InferenceServed and last_edit is not None and (served_ts < 0 or ev.ts < served_ts) \
            and last_edit - ev.ts > span:
        return ("turn_span_limit", f"InferenceServed dated {last_edit - ev.ts} ms before its turn's latest edit "
                f"(allowed: {span} ms, REWARDFLOW_MAX_TURN_SPAN_MS)")
    return None
