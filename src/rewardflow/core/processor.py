"""The per-partition stream processor: one Kafka record in, output rows out.

``PartitionProcessor.process(value, headers, offset, now_ms, record_ts) -> Outputs``
is the whole route of a raw record — decode → validate → bound → dedup → join →
score → window — as pure code over a :class:`StateStore`. The Faust agent and
batch replay both call it; neither adds logic of its own. What a producer can and
cannot influence is ``docs/trust.md``.

Delivery contract (at-least-once with deterministic ids):

* State writes of a batch of records (:meth:`process_batch`; :meth:`process`
  is a batch of one) reach the store at its end, in this order: settled
  sessions, touched sessions, the window closes of the batch (keys
  ``r:<p>:<offset>:<chunk>``, deleted once the source commit passes them),
  then the partition meta key ``m:<p>`` last, which also records the last
  processed offset. With a changelog that preserves order, a restart therefore
  sees the state after some batch X (plus a prefix of batch X+1's writes). Decisions are taken per record, so
  outputs do not depend on how records are grouped into batches.
* The first record after (re)assignment triggers :meth:`rebuild`: derived
  state (deadline heap, window accumulators) is recomputed from the sessions,
  and every final output decided at or after that record's offset is
  re-emitted, because its delivery is uncertain. Ids are deterministic, so
  re-emission only ever produces duplicates with equal ids.
* State a replay needs is kept until the commit passes it: seen ids are pruned
  at the watermark of the committed offset, and a tombstone the watermark
  prunes at an offset not committed yet is moved to ``SessionState.held``
  (re-emitted and added to windows by :meth:`rebuild`, read by the late routing
  of a replayed record at or before the offset that pruned it, which saw it in
  ``done``; never by other decisions) instead of being dropped. The worker bounds
  what is held: it stops a batch once a session's held tombstones reach its limits,
  and has the commit pass it before going on (``until_commit``).
* A redelivered event (same offset and index as recorded in ``seen``) is not
  applied again nor counted as a duplicate; its valid row is re-emitted (same
  id). A client resend of the same ``event_id`` is a duplicate.
* Provisional rewards are best effort: they are not re-emitted after a crash.
"""

from __future__ import annotations

from typing import Any

from rewardflow.core.closes import KEEP_CLOSES, StoredCloses
from rewardflow.core.config import JoinConfig, StateStore
from rewardflow.core.corrections import correct, correctable
from rewardflow.core.outputs import Outputs, checkpoint_of, dead_letter, event_json, event_row, exclusion, failed_record
from rewardflow.core.limits import age_refusal, raw_record_limit, refusal, span_refusal, within
from rewardflow.core.marks import mark
from rewardflow.core.recent import Recent
from rewardflow.core.restore import NEVER, meta_key, restore
from rewardflow.core.served import OpenServed
from rewardflow.core.session import SessionState, Tombstone, org_of, session_key, tombstone_checkpoint
from rewardflow.core.ticks import TICK, read_tick
from rewardflow.core.settle import settle_turns
from rewardflow.core.turn import TurnState
from rewardflow.core.wakeups import Wakeups, next_after_settle, wake_at
from rewardflow.core.windows import WindowBook
from rewardflow.events.errors import DecodeError
from rewardflow.events.models import Envelope, InferenceServed
from rewardflow.events.validate import split_valid
from rewardflow.events.wire import decode_record, record_format
from rewardflow.core.spec import RewardSpec

Record = tuple[bytes | None, Any, int] | tuple[bytes | None, Any, int, int | None]
"""A raw record: value, headers, offset and, where known, its broker timestamp (ms)."""


class PartitionProcessor:
    """Join state machine of one source partition. Not thread-safe; call in order."""

    def __init__(self, cfg: JoinConfig, specs: list[RewardSpec], store: StateStore, topic: str, partition: int) -> None:
        if not specs:
            raise ValueError("at least one reward spec is required")
        self.cfg, self.specs, self.store = cfg, specs, store
        self._scored = [(s, s.content_hash) for s in specs]  # hash once, not per scored turn
        self._keep = raw_record_limit(cfg.max_record_bytes)  # the most of a refused original a dead letter carries
        self.topic, self.partition = topic, partition
        self.wm = self.maxts = -NEVER
        # the idle clock's anchor: the wall time (ms) at which event time last kept pace, and maxts then
        self.last_event_wall, self.ready = 0, False
        self._paced_ts: int | None = None
        self.book = WindowBook(list(cfg.window_sizes_s), partition)
        self._wakeups = Wakeups()
        # (session key, request id) of an open served turn -> its served ts (request ids need not be unique
        # across sessions: one session's turn settling must not free the windows another's still needs)
        self._open_served = OpenServed()
        self._closes = StoredCloses(partition)
        self._meta_key, self.last_offset = meta_key(partition), -1
        self._marks: list[list[int]] = []  # [first offset of a batch, watermark before it], oldest first
        self._prune_wm: int | None = None
        self._keep_offset: int | None = None  # the committed offset of this batch (None: unknown); see _mark
        # session key -> (the value last written for it, the state it was written from): the next batch
        # takes that state back instead of decoding the value, while the store still returns that very
        # value (a store that holds encoded bytes returns a fresh decode once its cache dropped it). At most
        # ``state_cache`` states and ``state_cache_bytes`` of their encodings (a store without them: 0 each)
        self._states: Recent[tuple[Any, SessionState]] = Recent(cfg.state_cache, cfg.state_cache_bytes)
        self._put_json = getattr(store, "put_json", None)  # a store that takes values with their JSON
        # session key -> the store key of its state stored under the session id alone; store keys to delete
        self._unkeyed: dict[str, str] = {}
        self._dropped: list[str] = []
        # process_batch(until_commit=True): whether a session's held tombstones reached its limits
        self._until_commit = self._commit_needed = False
        self.consumed = 0  # how many records the last process_batch processed (a prefix of those given)

    def process(self, value: bytes | None, headers: Any, offset: int, now_ms: int,
                record_ts: int | None = None) -> Outputs:
        """Process one raw record. Never raises for bad input: it becomes a dead letter."""
        return self.process_batch([(value, headers, offset, record_ts)], now_ms)

    def process_batch(self, records: list[Record], now_ms: int, committed: int | None = None,
                      until_commit: bool = False) -> Outputs:
        """Process consecutive records of this partition, in order; write the state once, at the end.

        Every decision (late, settled, window closed) is taken per record exactly as
        :meth:`process` would, so outputs do not depend on how records are grouped into
        batches; only the store writes are deferred to the end of the batch (each touched
        session once, then the meta key). Never raises for bad input.

        A record's broker timestamp (4th item; None or absent: unbounded) bounds its event times:
        an event dated over ``max_clock_skew_ms`` after it is dead-lettered (``future_ts``) and a
        tick's watermark is capped there.

        A record whose processing raises is dead-lettered (``processing_error``) and the batch runs
        again from the state stored before it, without that record, so nothing of it remains. This
        needs a store that can ``forget`` its decoded values (the worker's table,
        :class:`~rewardflow.core.config.EncodedStore`); over any other the exception propagates.

        ``committed`` is the source partition's committed offset, when the caller knows it (a batch
        that replays records below it counts as committed only up to its lowest offset): window
        closes decided below it can never be replayed, so their stored copies (kept for re-emission
        after a crash) are deleted. Unknown, the closes of the last ``KEEP_CLOSES`` offsets are kept.

        A tombstone pruned at an offset ``committed`` has not passed is kept aside until the commit
        passes it (``SessionState.held``), so a batch spanning much event time (a backlog) would keep
        every turn a session finalised in it. With ``until_commit``, the batch stops after the record at
        which a session's held tombstones reach its limits (``max_session_turns``, or
        ``max_session_events`` in them): :attr:`consumed` then says how many records were processed,
        and the caller must have the source commit pass the last of them before it passes the rest
        (with the new ``committed``). Otherwise every record is processed (:attr:`consumed` is their
        number). Where a batch stops changes no decision, only when state is written and, through the
        commit it leads to, when seen ids are pruned (on which alone it depends whether a client's resend
        of an event, after a far jump of the watermark, is excluded as a duplicate or as late).
        """
        out = Outputs()
        if not records:
            self.consumed = 0
            return out
        low = min(r[2] for r in records)  # a batch may replay offsets below its first (Faust re-seeks)
        if not self.ready:
            self.rebuild(low, out)
        keep = None if committed is None else min(committed, low)
        self._mark(low, keep)
        failed: dict[int, Exception] = {}
        idle_clock = self.last_event_wall, self._paced_ts  # (wall-time bookkeeping: a re-run starts from it again)
        self._until_commit = until_commit
        while True:
            before, at = out.lengths(), -1
            cache: dict[str, SessionState] = {}
            self._commit_needed = False
            try:
                for at, rec in enumerate(records):
                    offset = rec[2]
                    if at in failed:
                        out.dead.append(failed_record(self.topic, self.partition, offset, failed[at], rec[0], now_ms,
                                                     self._keep))
                    else:
                        self._step(rec[0], rec[1], offset, rec[3] if len(rec) > 3 else None, now_ms, cache, out)
                    if offset > self.last_offset:
                        self.last_offset = offset
                    if self._commit_needed:
                        break
                break
            except Exception as exc:  # noqa: BLE001 - whatever a record makes the core do, it alone fails
                forget = getattr(self.store, "forget", None)
                if forget is None or at in failed:
                    raise
                failed[at] = exc
                out.truncate(before)
                forget()  # the store's bytes are the state before this batch: decode them afresh
                self.rebuild(low, Outputs())  # (what rebuild re-emits is in ``out`` already, if anything)
                self.last_event_wall, self._paced_ts = idle_clock
                self._mark(low, keep)
        self.consumed = at + 1
        self._write(cache, committed)
        return out

    def _mark(self, first_offset: int, committed: int | None) -> None:
        """Remember the watermark at the start of this batch, and what pruning must keep (:func:`mark`)."""
        self._keep_offset = committed
        self._marks, self._prune_wm = mark(self._marks, first_offset, self.wm, committed, KEEP_CLOSES)

    def _step(self, value: bytes | None, headers: Any, offset: int, record_ts: int | None, now_ms: int,
              cache: dict[str, SessionState], out: Outputs) -> None:
        touched: list[str] = []
        bound = None if record_ts is None else record_ts + self.cfg.max_clock_skew_ms
        fmt = record_format(headers)
        if fmt == TICK:
            tick = read_tick(value, self.topic, self.cfg.tick_key)
            if tick.wm is None:
                out.dead.append(dead_letter(self.topic, self.partition, offset, -1, tick.code, tick.reason,
                                            None, value, now_ms, self._keep))
            else:
                self.wm = max(self.wm, tick.wm if bound is None else min(tick.wm, bound))
            by = "idle"
        else:
            self._ingest(value, fmt, offset, bound, now_ms, cache, touched, out)
            self.wm = max(self.wm, self.maxts - self.cfg.lateness_ms)
            paced = self._paced_ts
            if paced is None or 2 * (self.maxts - paced) >= now_ms - self.last_event_wall:
                self.last_event_wall, self._paced_ts = now_ms, self._clock_ts()  # (see idle_target)
            by = "watermark"
        self._settle_due(offset, by, cache, touched, out)
        self._close_windows(offset, out)

    @property
    def prune_wm(self) -> int | None:
        """The watermark seen ids are pruned at: that of the committed offset (None: unknown yet)."""
        return self._prune_wm

    def expected_offset(self) -> int | None:
        """The offset this partition's next new record should have, or None when unknown.

        A record above it means records in between were never processed (the stream shell
        must not skip them); a record below it is a redelivery, which is safe.
        """
        if not self.ready:
            meta = self.store.get(self._meta_key) or {}
            off = meta.get("off")
            return None if off is None else int(off) + 1
        return None if self.last_offset < 0 else self.last_offset + 1

    def _ingest(self, value: bytes | None, fmt: str | None, offset: int, bound: int | None, now_ms: int,
                cache: dict[str, SessionState], touched: list[str], out: Outputs) -> None:
        cfg = self.cfg
        try:
            raws = decode_record(value, max_bytes=cfg.max_record_bytes, max_batch_events=cfg.max_batch_events, fmt=fmt)
        except DecodeError as exc:
            out.dead.append(dead_letter(self.topic, self.partition, offset, -1, exc.code, str(exc), None, value, now_ms,
                                        self._keep))
            return
        events, rejected = split_valid(raws)
        carried: int | None = None  # the refused event whose dead letter holds the record's bytes, if any
        for r in rejected:
            raw = r.raw if isinstance(r.raw, dict) else None
            original, reason = event_json(r.raw, None), str(r.error)
            if not original:  # orjson cannot write it: the record's bytes instead, in one dead letter a record
                if carried is None:
                    carried, original = r.index, value or b""
                else:
                    reason += f" (the record's bytes are in the dead letter of its event {carried})"
            out.dead.append(dead_letter(self.topic, self.partition, offset, r.index, r.error.code, reason,
                                        raw, original, now_ms, self._keep))
        if not events:
            return
        if rejected:
            bad = {r.index for r in rejected}
            valid_idx: range | list[int] = [i for i in range(len(raws)) if i not in bad]
        else:
            valid_idx = range(len(raws))
        st: SessionState | None = None  # a record carries one session's events (decode_record refuses any
        # other); a session is one org's, so an event naming another org goes to that org's session
        for idx, ev in zip(valid_idx, events, strict=True):
            raw = raws[idx]
            if bound is not None and ev.ts > bound:
                out.dead.append(dead_letter(
                    self.topic, self.partition, offset, idx, "future_ts",
                    f"ts {ev.ts} is {ev.ts - bound + cfg.max_clock_skew_ms} ms after the record's broker timestamp "
                    f"(allowed: {cfg.max_clock_skew_ms} ms, REWARDFLOW_MAX_CLOCK_SKEW_MS)",
                    raw, event_json(raw, value), now_ms, self._keep))
                continue
            if st is None or st.org_id != ev.org_id:
                st = self._session(session_key(ev.org_id, ev.session_id), cache, create=True)
                assert st is not None
                touched.append(st.key)
            self._apply(st, ev, raw, idx, offset, now_ms, out)

    def _apply(self, st: SessionState, ev: Envelope, raw: dict[str, Any], idx: int, offset: int, now_ms: int,
               out: Outputs) -> None:
        f = ev.__dict__  # the validated fields; pydantic's attribute access costs more, and this runs per event
        event_id, ts = f["event_id"], f["ts"]
        seen = st.seen.get(event_id)
        if seen is not None:
            if seen[1] != offset or seen[2] != idx:
                ck = checkpoint_of(ev, st.turns.get(f["request_id"]), st.done.get(f["request_id"]))
                out.excluded.append(exclusion("duplicate", ev, raw, ck, self.wm, self.partition, offset, idx))
                return
            # a redelivery of the very same record, already applied: not re-applied, but its row's
            # delivery is uncertain (re-emit, same id) and the watermark must still account for it
            if ts > self.maxts:
                self.maxts = ts
            out.valid.append(event_row(ev, raw, self.partition, offset))
            return
        rid = f["request_id"]
        done = st.done.get(rid)
        if done is None and st.held:
            held = st.held.get(rid)
            if held is not None and offset <= held[0]:  # a replay meeting state written after this record:
                done = held[1]  # the tombstone was pruned by this record or a later one, so it was still done
        if done is not None and self._live(done):
            if self.cfg.correction_ms and st.done.get(rid) is done and correctable(self.cfg, done, ev, self.wm):
                if not self._dead(age_refusal(self.cfg, ts, done.deadline, deadline=True)
                                  or span_refusal(self.cfg, ev, done.served_ts), raw, idx, offset, now_ms, out):
                    self._correct(st, rid, done, ev, raw, idx, offset, now_ms, out)
                return
            # the watermark that finalised the turn: a replay after a crash gives the same row
            out.late.append(exclusion("late", ev, raw, tombstone_checkpoint(done), done.wm, self.partition, offset, idx))
            return
        turn = st.turns.get(rid)
        served = type(ev) is InferenceServed
        # too old to start a turn; a served event that old is late even for an open turn, because
        # its served_ts could fall in a window that is already closed
        if ts + self.cfg.settle_ms < self.wm and (turn is None or served):
            ck = checkpoint_of(ev, turn, None)
            out.late.append(exclusion("late", ev, raw, ck, self.wm, self.partition, offset, idx))
            return
        if turn is not None and ts + self.cfg.settle_ms + self.cfg.max_turn_span_ms < self.wm \
                and self._dead(age_refusal(self.cfg, ts, self.wm), raw, idx, offset, now_ms, out):
            return
        if not within(st, self.cfg, turn is None) \
                and self._dead(refusal(st, self.cfg, turn is None, self.wm), raw, idx, offset, now_ms, out):
            return
        if turn is not None and self._dead(span_refusal(self.cfg, ev, turn.served["ts"] if turn.served else -1,
                                                        turn.first_ts, turn.last_edit() if served else None),
                                           raw, idx, offset, now_ms, out):
            return
        new_turn = turn is None
        if turn is None:
            turn = st.turns[rid] = TurnState.start(ev)
        turn.apply(ev)
        st.note_applied(new_turn)
        if served and turn.served is not None:  # (only a served event sets it; it is never unset)
            self._open_served[(st.key, rid)] = turn.served["ts"]
        st.note_seen(event_id, ts, offset, idx)
        if ts > self.maxts:
            self.maxts = ts
        out.valid.append(event_row(ev, raw, self.partition, offset))

    def _correct(self, st: SessionState, rid: str, done: Tombstone, ev: Envelope, raw: dict[str, Any], idx: int,
                 offset: int, now_ms: int, out: Outputs) -> None:
        """A signal for a finalised turn within the correction window: its next revision (corrections.py)."""
        if self._dead(refusal(st, self.cfg, False, self.wm), raw, idx, offset, now_ms, out):
            return
        tomb, rewards, windows = correct(done, ev, self.cfg, offset, self._keep_offset, self._scored, self.partition)
        st.finalise(rid, tomb)
        st.note_applied(False)
        st.note_seen(ev.event_id, ev.ts, offset, idx)
        self.maxts = max(self.maxts, ev.ts)
        out.valid.append(event_row(ev, raw, self.partition, offset))
        out.rewards.extend(rewards)
        out.windows.extend(windows)

    def _dead(self, over: tuple[str, str] | None, raw: dict[str, Any], idx: int, offset: int, now_ms: int,
              out: Outputs, record: bytes | None = None) -> bool:
        """Dead-letter the event under ``over`` (code, reason) from one of :mod:`.limits`' rules, if any."""
        if over is not None:
            out.dead.append(dead_letter(self.topic, self.partition, offset, idx, *over, raw, event_json(raw, record),
                                        now_ms, self._keep))
        return over is not None

    def _live(self, t: Tombstone) -> bool:
        """Whether a tombstone is remembered, pruned or not (so no decision depends on wake-up timing).
        Past ``keep_done_ms``, one whose windows are still open is: a restart rebuilds them from it,
        and a replayed record must find it as the record did."""
        return t.wm >= self.wm - self.cfg.keep_done_ms or t.served_ts >= self.book.min_closed_through()

    def _session(self, key: str, cache: dict[str, SessionState], create: bool) -> SessionState | None:
        """The state of the session under ``key`` (:func:`session_key`), from the batch's ``cache``, the
        store, or (``create``) new; None when there is none and ``create`` is false."""
        st = cache.get(key)
        if st is None:
            obj = self.store.get("s:" + key)
            if obj is None and key in self._unkeyed:
                obj = self.store.get(self._unkeyed[key])
            if obj is not None:
                kept = self._states.pop(key)  # (popped: a batch that fails midway leaves nothing behind)
                st = kept[1] if kept is not None and kept[0] is obj else SessionState.from_obj(obj, org_of(key))
            elif create:
                org, _, sid = key.partition("\t")
                st = SessionState(sid, self.partition, org_id=org)
            else:
                return None
            cache[key] = st
        return st

    def _settle_due(self, offset: int, by: str, cache: dict[str, SessionState], touched: list[str],
                    out: Outputs) -> None:
        """Settle the sessions whose wake-up the watermark reached: a touched session (its turn may now
        be due, or its pruning) first, then the heap's, in wake-up order. A touched session that is
        not due is only rescheduled: settling it would change nothing but its pruning time."""
        due: list[str] = []
        cfg, wm, wakeups = self.cfg, self.wm, self._wakeups
        for sid in dict.fromkeys(touched):
            t = wake_at(cache[sid], cfg, wm)
            if t is not None and t <= wm:
                due.append(sid)
            else:
                wakeups.schedule(sid, t)
        wakeups.pop_due(wm, due, set(due))
        for sid in due:
            st = self._session(sid, cache, create=False)
            if st is not None:
                self._settle(st, offset, by, out)
                self._schedule(st)

    def _settle(self, st: SessionState, offset: int, by: str, out: Outputs) -> None:
        """Settle one session (:func:`settle_turns`), add its final rewards to the windows, prune it."""
        cfg, wm, book = self.cfg, self.wm, self.book
        finals, finalised = settle_turns(st, cfg, wm, offset, by, self._scored, self.partition, out)
        for r in finals:
            book.add(r)
        for rid in finalised:
            self._open_served.pop((st.key, rid))
        st.prune(wm, cfg.dedup_ms, cfg.keep_done_ms, book.min_closed_through(), seen_wm=self._prune_wm,
                 keep_offset=self._keep_offset, offset=offset)
        if self._until_commit and st.held and st.held_reaches(cfg.max_session_turns, cfg.max_session_events):
            self._commit_needed = True  # (process_batch stops after this record)

    def _schedule(self, st: SessionState) -> None:
        self._wakeups.schedule(st.key, next_after_settle(st, self.cfg, self.wm))

    def _close_windows(self, offset: int, out: Outputs) -> None:
        limit = self.wm - self.cfg.settle_ms
        if not self.book.due(limit):
            return
        earliest = self._open_served.earliest()
        if earliest is not None:
            limit = min(limit, earliest)
        closed = self.book.close(limit)
        if closed:
            out.windows.extend(closed)
            self._closes.add(offset, closed)

    def _write(self, cache: dict[str, SessionState], committed: int | None) -> None:
        store, put_json, states, unkeyed = self.store, self._put_json, self._states, self._unkeyed
        # state stored under the session id alone goes once its session's state is written under its own key
        # (a restart that kept a prefix of these writes finds it beside that key, and drops it then)
        moved = [unkeyed.pop(key) for key in cache if key in unkeyed] if unkeyed else []
        for key, st in cache.items():
            if st.is_empty():
                store.delete("s:" + key)
                continue
            obj = st.to_obj()
            size = 0
            if put_json is not None:
                data = st.to_json(obj)
                put_json("s:" + key, obj, data)
                size = len(data)
            else:
                store.put("s:" + key, obj)
            states.put(key, (obj, st), size)
        for old in (*moved, *self._dropped):
            store.delete(old)
        self._dropped = []
        self._closes.write(self.store, committed)  # (closes.py: kept until the source commit passes them)
        self.store.put(self._meta_key, {
            "wm": self.wm, "maxts": self.maxts, "ct": {str(k): v for k, v in self.book.closed_through.items()},
            "off": self.last_offset, "marks": self._marks,
        })

    def rebuild(self, first_offset: int, out: Outputs) -> None:
        """Recompute derived state from the store; re-emit outputs decided at/after ``first_offset``
        (:func:`~rewardflow.core.restore.restore`)."""
        r = restore(self.store, self.cfg, self.partition, self._scored, first_offset, out)
        self.wm, self.maxts, self.last_offset, self.book = r.wm, r.maxts, r.last_offset, r.book
        self._marks, self._prune_wm = r.marks, None
        self._closes = StoredCloses(self.partition, r.closes)
        self._wakeups, self._open_served = Wakeups(), OpenServed(r.open_served)
        self._unkeyed, self._dropped = r.unkeyed, r.dropped
        self._states.clear()
        self._paced_ts = None  # (the idle clock's anchor may hold an event time the rebuilt state lacks)
        for st in r.sessions:
            self._schedule(st)
        self.ready = True

    def pending(self) -> bool:
        """Whether anything (a turn, a tombstone, a window) still waits for the watermark."""
        return bool(self._wakeups) or bool(self.book.open)

    def _clock_ts(self) -> int:
        """The event time the watermark stands for: the newest event's, or further where ticks took it."""
        return max(self.maxts, self.wm + self.cfg.lateness_ms)

    def idle_target(self, now_ms: int, idle_timeout_ms: int, rate: float) -> int | None:
        """Watermark a tick should carry when the partition has been idle, else None.

        Idle: for ``idle_timeout_ms`` of wall time, event time has not moved forward by half the wall time
        since it last did (``last_event_wall``, when the newest event time was ``maxts`` then). Records
        that move no event time (refused, late, duplicate, or a trickle of events a millisecond apart)
        keep no partition from being idle, so no client can hold back another's turns by sending them.
        From then on the watermark follows the wall clock at ``rate`` from that point. After a rebuild (a
        rebalance, a restart) it goes on from the watermark the partition's ticks had reached, so a partition
        handed over again and again still gets to its turns' deadlines.
        """
        if self.maxts == -NEVER or now_ms - self.last_event_wall < idle_timeout_ms:
            return None
        paced = self._clock_ts() if self._paced_ts is None else self._paced_ts  # (None: since a rebuild)
        return max(self.maxts, paced + int((now_ms - self.last_event_wall) * rate)) - self.cfg.lateness_ms

