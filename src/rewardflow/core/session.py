"""State of one session on one partition: open turns, seen event ids, tombstones.

A session's state is the unit of persistence: the stream shell stores it under
key ``s:<org_id><TAB><session_id>`` (:func:`session_key`) in a changelog-backed table, one write
per session a batch of records touched or settled. A session is one org's: two orgs' sessions
that share an id are two states, and nothing one org sends reaches the other's. Keeping all turns of a session together is what amortises
the per-write cost (a session's events travel in one Kafka record).

* ``seen``: ``event_id -> [ts, offset, index]`` — deduplicates client resends
  within the dedup horizon, and recognises a *redelivery* of the very same
  record (same offset and index) so it is skipped without being miscounted.
* ``done``: ``request_id -> tombstone`` — finalised turns, kept to route late
  events, to rebuild window partials after a restart and to re-emit outputs
  whose delivery is uncertain.
* ``held``: ``request_id -> (offset, tombstone)``, tombstones the watermark
  pruned from ``done`` at a source offset not committed yet. A restart replays
  that batch against state written after it, so it still needs them: it
  re-emits their outputs, rebuilds windows from them, and routes late the
  events of a replayed record that came before the prune; nothing else reads
  them. They go at the first prune after the commit passed the offset that
  pruned them.

Contract: pure, JSON-able through :meth:`to_obj` / :meth:`from_obj`;
:meth:`to_json` gives the bytes of ``to_obj()`` as stores write them, re-encoding
a turn, ``seen`` or ``done`` only when it changed since the last call (a session is
rewritten whole, mostly with all but one turn unchanged).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import orjson

from rewardflow.core.config import JSON_OPTS
from rewardflow.core.entries import Entries, encoded_map, entry, from_key, grown, joined, reframed, reusable
from rewardflow.core.turn import TurnState


@dataclass(slots=True)
class Tombstone:
    """A finalised turn: its outcome (or orphan exclusion) and where it was decided.

    With corrections on, a served turn's tombstone also keeps the turn (``turn``, TurnState.to_obj),
    its final ``deadline`` and its corrections ``revs``: ``[revision, source offset, outcome]``,
    oldest first; the latest always (its outcome None: it is the turn's), earlier ones while a
    restart may still replay their record (see :mod:`rewardflow.core.corrections`).
    ``outcome`` stays the one first scored: the windows are rebuilt from it, and a correction's
    window deltas count from it.
    """

    wm: int  # watermark that finalised it
    offset: int  # source offset of the record whose processing finalised it
    served_ts: int  # -1 for orphans
    outcome: dict[str, Any] | None  # outcome_to_obj(...) for served turns
    orphan: dict[str, Any] | None  # Exclusion row for orphans
    first_ts: int | None = None  # event time of the turn's oldest event (None in state written before it)
    n: int = 0  # events the turn held (the session limits count them)
    turn: list[Any] | None = None  # the turn's state, kept for corrections (None: corrections off, or an orphan)
    deadline: int = 0  # anchor + settle when it was finalised
    revs: list[list[Any]] = field(default_factory=list)

    @property
    def rev(self) -> int:
        """The latest revision (0: never corrected)."""
        return int(self.revs[-1][0]) if self.revs else 0

    def to_obj(self) -> list[Any]:
        base = [self.wm, self.offset, self.served_ts, self.outcome, self.orphan, self.first_ts, self.n]
        if self.turn is None:  # (the common shape without corrections: state written before them reads the same)
            return base
        return [*base, self.turn, self.deadline, self.revs]

    @classmethod
    def from_obj(cls, o: list[Any]) -> Tombstone:
        return cls(*o) if len(o) in (7, 10) else cls(*o[:6], *([None] * (6 - len(o))))


@dataclass(slots=True)
class SessionState:
    """Everything the join keeps about one session."""

    session_id: str
    partition: int
    turns: dict[str, TurnState] = field(default_factory=dict)
    seen: dict[str, list[int]] = field(default_factory=dict)
    done: dict[str, Tombstone] = field(default_factory=dict)
    held: dict[str, tuple[int, Tombstone]] = field(default_factory=dict)  # (offset pruned at, tombstone)
    _seen_min: int | None = field(default=None, repr=False, compare=False)  # cache, never persisted
    # whether ``seen`` is in event-time order, oldest first (None: not known), and then its newest ts
    _seen_sorted: bool | None = field(default=None, repr=False, compare=False)
    _seen_top: int = field(default=0, repr=False, compare=False)
    # to_json's encodings of seen (the dict encoded, its length then, the bytes), done and held; never persisted
    _seen_json: tuple[Any, int, bytes] | None = field(default=None, repr=False, compare=False)
    _done_json: Entries | None = field(default=None, repr=False, compare=False)
    _held_json: Entries | None = field(default=None, repr=False, compare=False)
    # to_obj's form of done (the dict, its length then, the forms), and done's oldest (the dict, its
    # length then, the lowest wm, the lowest first_ts or None); kept while done only grows, never persisted
    _done_obj: tuple[Any, int, dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    _done_min: tuple[Any, int, int, int | None] | None = field(default=None, repr=False, compare=False)
    # [turns, events] of the open turns and of every tombstone in ``done`` (never below what
    # :meth:`live_load` counts), and the watermark it was last made exact at
    _load: list[int] | None = field(default=None, repr=False, compare=False)
    _load_at: int | None = field(default=None, repr=False, compare=False)

    org_id: str = ""
    key: str = field(default="", repr=False, compare=False)  # session_key(org_id, session_id)

    def __post_init__(self) -> None:
        self.key = session_key(self.org_id, self.session_id)

    def recorded_org(self) -> str | None:
        """The org named by the turns and tombstones the state holds (None: none names one). For state
        stored under a key without its org: every turn of such a session was of one org."""
        for turn in self.turns.values():
            return turn.org_id
        for tomb in (*self.done.values(), *(h[1] for h in self.held.values())):
            row = tomb.outcome if tomb.outcome is not None else tomb.orphan
            if row is not None and row.get("org_id") is not None:
                return str(row["org_id"])
        return None

    def load(self) -> tuple[int, int]:
        """Turns and events the session holds, expired tombstones not yet pruned included (cheap)."""
        if self._load is None:
            tombs = self.done.values()
            self._load = [len(self.turns) + len(self.done),
                          sum(t.n for t in self.turns.values()) + sum(t.n for t in tombs)]
            self._load_at = None
        return self._load[0], self._load[1]

    def held_reaches(self, turns: int, events: int) -> bool:
        """Whether the tombstones held for an uncommitted batch (``held``) number ``turns`` or more, or
        held ``events`` events or more."""
        held = self.held
        return len(held) >= turns or sum(h[1].n for h in held.values()) >= events

    def live_load(self, wm: int, keep_ms: int) -> tuple[int, int]:
        """Turns and events of the open turns and of the tombstones finalised at most ``keep_ms`` before
        the watermark ``wm``: the count the session limits apply to (:mod:`rewardflow.core.limits`). It
        depends on the session's own turns only, never on when expired tombstones were pruned nor on
        what else keeps them. Computed once per watermark, then kept current by :meth:`note_applied`."""
        if self._load is None or self._load_at != wm:
            since = wm - keep_ms
            kept = [t for t in self.done.values() if t.wm >= since]
            self._load = [len(self.turns) + len(kept),
                          sum(t.n for t in self.turns.values()) + sum(t.n for t in kept)]
            self._load_at = wm
        return self._load[0], self._load[1]

    def note_applied(self, new_turn: bool) -> None:
        """Count an applied event (and the turn it opened)."""
        load = self._load
        if load is not None:
            load[0] += new_turn
            load[1] += 1

    def note_seen(self, event_id: str, ts: int, offset: int, index: int) -> None:
        """Record an applied event (keeps the cached oldest timestamp current)."""
        seen = self.seen
        if event_id in seen:
            self._seen_json = None  # a value changed in place: encode anew (new ids are appended)
            self._seen_sorted = None
        elif self._seen_sorted:
            if ts < self._seen_top:
                self._seen_sorted = False
            else:
                self._seen_top = ts
        seen[event_id] = [ts, offset, index]
        m = self._seen_min
        if m is not None and ts < m:
            self._seen_min = ts

    def finalise(self, request_id: str, tomb: Tombstone) -> None:
        """Record a finalised turn's tombstone, or replace it with its next revision (corrections.py);
        a tombstone is never changed in place."""
        if request_id in self.done:  # replaced in place: made anew (new tombstones are appended)
            self._done_json = self._done_obj = self._done_min = None
        self.done[request_id] = tomb

    def seen_floor(self) -> int:
        """Oldest timestamp among the seen ids (cached; the set must be non-empty)."""
        if self._seen_min is None:
            self._seen_min = min([v[0] for v in self.seen.values()])
        return self._seen_min

    def is_empty(self) -> bool:
        return not (self.turns or self.seen or self.done or self.held)

    def prune(self, wm: int, dedup_ms: int, keep_done_ms: int, closed_through: int,
              seen_wm: int | None = None, keep_offset: int | None = None, offset: int = 0) -> None:
        """Drop seen ids and tombstones that can no longer matter.

        A seen id goes once older than ``dedup_ms``, but not while a turn of
        the session that could hold its event is open or still has its
        tombstone: a record replayed after a crash must be recognised as a
        redelivery even when the watermark jumped past the dedup horizon
        meanwhile (otherwise its events would be re-judged late). A tombstone goes once
        it is older than ``keep_done_ms`` *and* every window containing its
        turn is closed (``served_ts < closed_through``). Seen ids are judged
        against ``seen_wm`` when given (the stream passes the watermark of its
        committed offset, so a replay still recognises its redelivered events;
        no decision other than duplicate-vs-new depends on seen ids).

        ``keep_offset`` is the source's committed offset when known, ``offset`` the one of the record
        being processed. A tombstone pruned at an offset the commit has not passed moves to ``held``
        (with that offset): a restart replays its batch against this state, whose outputs, window
        closes and meta write may be lost, so it still needs the tombstone (only late routing and a
        restart read ``held``). A held tombstone goes at the first prune once ``keep_offset`` is past
        the offset that pruned it. Unknown (None), nothing is held and ``held`` is left as it is.
        """
        done = self.done
        if done:
            limit = wm - keep_done_ms
            if self.done_oldest()[0] < limit:
                for t in done.values():
                    if t.wm < limit and t.served_ts < closed_through:  # something to drop
                        self._drop_done(limit, closed_through, keep_offset, offset)
                        done = self.done
                        break
        if self.held and keep_offset is not None:
            for h in self.held.values():
                if h[0] < keep_offset:  # something to drop (otherwise the dict, and its encoding, stay)
                    self._drop_held(keep_offset)
                    break
        if self.seen:
            limit = (wm if seen_wm is None or wm <= seen_wm else seen_wm) - dedup_ms
            for turn in self.turns.values():  # an open turn's events must stay known, or a resend would count twice
                if turn.first_ts < limit:
                    limit = turn.first_ts
            first = self.done_oldest()[1] if done else None  # ...and so must a finalised turn's, while its
            if first is not None and first < limit:  # tombstone is kept
                limit = first
            for _, t in self.held.values():
                if t.first_ts is not None and t.first_ts < limit:
                    limit = t.first_ts
            if self.seen_floor() < limit:
                if self._seen_in_order():
                    self._drop_oldest_seen(limit)
                else:
                    self.seen = {k: v for k, v in self.seen.items() if v[0] >= limit}
                    self._seen_min = None
                    self._seen_json = None
                    self._seen_sorted = None  # (the ids out of order may have gone)

    def done_oldest(self) -> tuple[int, int | None]:
        """The lowest ``wm`` and the lowest ``first_ts`` (None: none has one) of the tombstones in
        ``done``, which must not be empty; kept while ``done`` only grows by :meth:`finalise`."""
        done, m = self.done, self._done_min
        new: Iterable[Tombstone] = done.values()
        wm, first = 2**63, None
        if m is not None and m[0] is done and m[1] <= len(done):
            if m[1] == len(done):
                return m[2], m[3]
            wm, first, new = m[2], m[3], islice(new, m[1], None)
        for t in new:
            if t.wm < wm:
                wm = t.wm
            if t.first_ts is not None and (first is None or t.first_ts < first):
                first = t.first_ts
        self._done_min = (done, len(done), wm, first)
        return wm, first

    def _drop_done(self, limit: int, closed_through: int, keep_offset: int | None, offset: int) -> None:
        """:meth:`prune`'s filter of ``done``: a tombstone goes once finalised before ``limit`` with
        every window of its turn closed; it moves to ``held`` when the commit has not passed
        ``offset``. The entries that stay, and those that move, are taken from the kept encoding
        (only tombstones added since it was made are encoded)."""
        done, held = self.done, self.held
        forms = self._done_forms()
        enc = reusable(self._done_json, done)
        hold = keep_offset is not None and offset >= keep_offset
        held_enc = reusable(self._held_json, held) if hold and enc is not None else None
        if held_enc is not None and held_enc.n < len(held):  # (made whole first: moved entries append)
            held_enc = held_enc.extended(held, ((k, _held_obj(h)) for k, h in islice(held.items(), held_enc.n, None)))
        at = b"%d," % offset
        kept: dict[str, Tombstone] = {}
        parts: list[bytes] = []
        moved: list[bytes] = []
        for i, (k, x) in enumerate(done.items()):
            part = b"" if enc is None else enc.part(i) if i < enc.n else entry(k, forms[k])
            if x.wm >= limit or x.served_ts >= closed_through:
                kept[k] = x
                if enc is not None:
                    parts.append(part)
                continue
            if hold:
                if k in held:
                    held_enc = None  # a value replaced in place: encode anew
                held[k] = (offset, x)
                if held_enc is not None:
                    moved.append(reframed(k, part, at))
        if hold:
            self._held_json = None if held_enc is None else held_enc.with_parts(held, moved)
        self._done_json = None if enc is None else joined(kept, parts)
        self.done = kept
        self._done_obj = (kept, len(kept), {k: forms[k] for k in kept})
        self._done_min = None
        self._load = None

    def _drop_held(self, keep_offset: int) -> None:
        """:meth:`prune`'s filter of ``held``: a tombstone goes once the commit passed the offset
        that pruned it. The entries that stay are taken from the kept encoding."""
        held = self.held
        enc = reusable(self._held_json, held)
        kept: dict[str, tuple[int, Tombstone]] = {}
        parts: list[bytes] = []
        for i, (k, h) in enumerate(held.items()):
            if h[0] >= keep_offset:
                kept[k] = h
                if enc is not None:
                    parts.append(enc.part(i) if i < enc.n else entry(k, _held_obj(h)))
        self._held_json = None if enc is None else joined(kept, parts)
        self.held = kept

    def _seen_in_order(self) -> bool:
        """Whether ``seen`` is in event-time order, oldest first, as a session's events mostly
        arrive (kept between calls by :meth:`note_seen`; found by one pass when not known)."""
        known = self._seen_sorted
        if known is None:
            known, last = True, -2**63
            for v in self.seen.values():
                if v[0] < last:
                    known = False
                    break
                last = v[0]
            self._seen_sorted, self._seen_top = known, last
        return known

    def _drop_oldest_seen(self, limit: int) -> None:
        """:meth:`prune`'s filter of ``seen`` (every id older than ``limit`` goes) when it is in
        event-time order: those ids are its first ones. They are deleted in place, and the kept
        encoding (:meth:`to_json`) loses their prefix instead of being made again."""
        seen = self.seen
        drop = []
        first_kept = None
        for k, v in seen.items():
            if v[0] >= limit:
                first_kept = k
                break
            drop.append(k)
        if not drop:  # (the floor was low: an id seen again moved on in place)
            self._seen_min = next(iter(seen.values()))[0]
            return
        last, rest = self._seen_json, None
        if last is not None and last[0] is seen and last[1] == len(seen):
            rest = b"{}" if first_kept is None else from_key(last[2], first_kept)
        for k in drop:
            del seen[k]
        self._seen_json = None if rest is None else (seen, len(seen), rest)
        self._seen_min = next(iter(seen.values()))[0] if seen else None

    def next_wake(self, deadlines: list[int], dedup_ms: int, keep_done_ms: int, step_ms: int) -> int | None:
        """Earliest event time at which this session needs attention, or None.

        Seen ids count only while the oldest is older than every open turn and kept tombstone
        (:meth:`prune` keeps the ids of those whatever the watermark): until one of them goes,
        which is a wake-up of its own, no watermark can prune an id.
        """
        best = min(deadlines) if deadlines else None
        if self.seen:
            floor = self.seen_floor()
            if self._seen_unpinned(floor):
                t = floor + dedup_ms
                if best is None or t < best:
                    best = t
        if self.done:
            t = self.done_oldest()[0] + (keep_done_ms if keep_done_ms >= step_ms else step_ms)
            if best is None or t < best:
                best = t
        return best

    def _seen_unpinned(self, floor: int) -> bool:
        """Whether no open turn or kept tombstone began at or before ``floor`` (see :meth:`prune`)."""
        for turn in self.turns.values():
            if turn.first_ts <= floor:
                return False
        first = self.done_oldest()[1] if self.done else None
        if first is not None and first <= floor:
            return False
        for _, t in self.held.values():
            if t.first_ts is not None and t.first_ts <= floor:
                return False
        return True

    def to_obj(self) -> list[Any]:
        obj = [
            self.session_id,
            self.partition,
            [t.encoded()[0] for t in self.turns.values()],
            self.seen,
            self._done_forms(),
            self.seen_floor() if self.seen else None,
        ]
        if self.held:  # absent when empty (almost always): state written before it reads the same
            obj.append({k: _held_obj(h) for k, h in self.held.items()})
        return obj

    def to_json(self, obj: list[Any] | None = None) -> bytes:
        """``orjson.dumps(obj, option=JSON_OPTS)`` byte for byte, where ``obj`` is :meth:`to_obj`'s
        value now (pass it when already made).

        Each turn keeps its encoding until it changes (:meth:`TurnState.encoded`). ``seen``,
        ``done`` and ``held`` keep their last encoding: unchanged, it is reused; grown by new keys
        (dicts keep insertion order, so they are at the end), only those are encoded and appended.
        Every other change must go through :meth:`note_seen`, :meth:`finalise` (which drop the
        encoding when they overwrite a key) or :meth:`prune` (which replaces a dict, or cuts from
        the kept encoding the oldest ids or tombstones it drops); as a guard, an encoding is used
        only for the very dict it was made from, and never when it shrank.
        """
        if obj is None:
            obj = self.to_obj()
        s = self._seen_json = encoded_map(self._seen_json, self.seen, self.seen)
        d = self._done_json = grown(self._done_json, self.done, obj[4])
        head = orjson.dumps(obj[:2], option=JSON_OPTS)  # '[sid,partition]'
        turns = b",".join([t.encoded()[1] for t in self.turns.values()])
        floor = orjson.dumps(obj[5], option=JSON_OPTS)
        if len(obj) > 6:  # ...,seen_floor,{held}]
            h = self._held_json = grown(self._held_json, self.held, obj[6])
            return b"".join((head[:-1], b",[", turns, b"],", s[2], b",", d.body, b",", floor, b",", h.body, b"]"))
        return b"".join((head[:-1], b",[", turns, b"],", s[2], b",", d.body, b",", floor, b"]"))

    def _done_forms(self) -> dict[str, Any]:
        """``done``'s JSON form, ``{request_id: Tombstone.to_obj()}``, made only for the tombstones added
        since the last call (a new dict each time it grew: the last may be held as a stored value)."""
        done, last = self.done, self._done_obj
        if last is not None and last[0] is done and last[1] <= len(done):
            if last[1] == len(done):
                return last[2]
            forms = dict(last[2])
            for k, t in islice(done.items(), last[1], None):
                forms[k] = t.to_obj()
        else:
            forms = {k: t.to_obj() for k, t in done.items()}
        self._done_obj = (done, len(done), forms)
        return forms

    @classmethod
    def from_obj(cls, o: list[Any], org_id: str) -> SessionState:
        """The state ``to_obj`` made, of the session of ``org_id`` (the store key holds it, not ``o``)."""
        turns = [TurnState.from_obj(t) for t in o[2]]
        tomb = Tombstone.from_obj
        return cls(
            o[0],
            o[1],
            {t.request_id: t for t in turns},
            o[3],
            {k: tomb(v) for k, v in o[4].items()},
            {k: (at, tomb(t)) for k, (at, t) in o[6].items()} if len(o) > 6 else {},
            _seen_min=o[5] if len(o) > 5 else None,
            org_id=org_id,
        )


def session_key(org_id: str, session_id: str) -> str:
    """The state's identity, ``<org_id><TAB><session_id>``: one-to-one, as neither id may hold a
    control character (the schema's ``printable`` constraint)."""
    return f"{org_id}\t{session_id}"


def org_of(key: str) -> str:
    """The org of a :func:`session_key`."""
    return key[:key.index("\t")]


def _held_obj(h: tuple[int, Tombstone]) -> list[Any]:
    """A held tombstone's JSON form: [offset pruned at, tombstone]."""
    return [h[0], h[1].to_obj()]


def tombstone_checkpoint(t: Tombstone) -> str:
    """The checkpoint that served a finalised turn ('' for an orphan)."""
    return str(t.outcome["checkpoint_id"]) if t.outcome else ""
