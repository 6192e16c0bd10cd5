"""SessionState: pruning, wake-up times and the stored object (read back by older and newer code alike)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rewardflow.core.config import JSON_OPTS
from rewardflow.core.session import SessionState, Tombstone
from rewardflow.core.turn import TurnState
from tests.factories import T0

_ts = st.integers(T0, T0 + 10_000_000)


@st.composite
def sessions(draw: st.DrawFn) -> SessionState:
    """A session as read back from the store: open turns, seen ids, tombstones (some without first_ts)."""
    n_turns, n_done = draw(st.integers(0, 3)), draw(st.integers(0, 8))
    turns = [TurnState(f"open{i}", "s1", "org", draw(_ts)) for i in range(n_turns)]
    done = {f"done{i}": Tombstone(draw(_ts), draw(st.integers(0, 99)), draw(st.one_of(st.just(-1), _ts)),
                                  None, None, draw(st.one_of(st.none(), _ts)))
            for i in range(n_done)}
    seen = {f"e{i}": [draw(_ts), draw(st.integers(0, 99)), draw(st.integers(0, 9))] for i in range(draw(st.integers(0, 12)))}
    state = SessionState("s1", 0, {t.request_id: t for t in turns}, seen, done)
    read_back: bool = draw(st.booleans())
    if seen and read_back:  # with its stored floor (the cache), or without
        state = SessionState.from_obj(orjson.loads(orjson.dumps(state.to_obj())), "")
    return state


def reference_prune(s: SessionState, wm: int, dedup_ms: int, keep_done_ms: int, closed_through: int,
                    seen_wm: int | None) -> list[Any]:
    """The plain definition of prune, on a copy; returns the stored object after it."""
    s = SessionState.from_obj(orjson.loads(orjson.dumps(s.to_obj())), "")
    done = {k: t for k, t in s.done.items() if t.wm >= wm - keep_done_ms or t.served_ts >= closed_through}
    seen = s.seen
    if seen:
        limit = (wm if seen_wm is None else min(wm, seen_wm)) - dedup_ms
        limit = min([limit, *(t.first_ts for t in s.turns.values()),
                     *(t.first_ts for t in done.values() if t.first_ts is not None)])
        if min(v[0] for v in seen.values()) < limit:
            seen = {k: v for k, v in seen.items() if v[0] >= limit}
    floor = min(v[0] for v in seen.values()) if seen else None
    return [s.session_id, s.partition, [t.to_obj() for t in s.turns.values()], seen,
            {k: t.to_obj() for k, t in done.items()}, floor]


_ms = st.integers(0, 5_000_000)


@settings(max_examples=300, deadline=None)
@given(s=sessions(), wm=st.integers(T0, T0 + 12_000_000), dedup=_ms, keep=_ms, closed=st.integers(T0, T0 + 12_000_000),
       seen_wm=st.one_of(st.none(), st.integers(T0, T0 + 12_000_000)))
def test_prune_equals_the_plain_definition_and_keeps_order(s: SessionState, wm: int, dedup: int, keep: int,
                                                           closed: int, seen_wm: int | None) -> None:
    expected = reference_prune(s, wm, dedup, keep, closed, seen_wm)
    s.prune(wm, dedup, keep, closed, seen_wm=seen_wm)
    assert orjson.dumps(s.to_obj()) == orjson.dumps(expected)  # dict order included: state is hashed as JSON
    s.note_seen("late", T0 - 1, 0, 0)  # the floor cache stays exact after pruning
    assert s.seen_floor() == T0 - 1


@settings(max_examples=200, deadline=None)
@given(s=sessions(), deadlines=st.lists(_ts, max_size=3), dedup=_ms, keep=_ms, step=_ms)
def test_next_wake_is_the_earliest_need(s: SessionState, deadlines: list[int], dedup: int, keep: int,
                                        step: int) -> None:
    cands = list(deadlines)
    floor = min(v[0] for v in s.seen.values()) if s.seen else None
    pins = [t.first_ts for t in s.turns.values()] + [t.first_ts for t in s.done.values() if t.first_ts is not None]
    if floor is not None and all(p > floor for p in pins):  # else an open turn or tombstone keeps every id
        cands.append(floor + dedup)
    if s.done:
        cands.append(min(t.wm for t in s.done.values()) + max(keep, step))
    assert s.next_wake(deadlines, dedup, keep, step) == (min(cands) if cands else None)
    assert s.is_empty() == (not (s.turns or s.seen or s.done))


@settings(max_examples=100, deadline=None)
@given(s=sessions())
def test_stored_object_round_trips_in_order(s: SessionState) -> None:
    obj = s.to_obj()
    assert obj[4] == {k: t.to_obj() for k, t in s.done.items()} and list(obj[4]) == list(s.done)
    back = SessionState.from_obj(orjson.loads(orjson.dumps(obj)), "")
    assert orjson.dumps(back.to_obj()) == orjson.dumps(obj)
    assert back.done == s.done and list(back.turns) == list(s.turns)


def test_state_written_before_first_ts_and_the_floor_is_still_read() -> None:
    old = ["s1", 0, [], {"e1": [T0, 3, 0]}, {"r1": [T0 + 10, 3, T0, None, None]}]  # no floor, 5-field tombstone
    s = SessionState.from_obj(old, "")
    assert s.done["r1"] == Tombstone(T0 + 10, 3, T0, None, None, None)
    assert s.seen_floor() == T0 and s.to_obj()[4] == {"r1": [T0 + 10, 3, T0, None, None, None, 0]}


def test_prune_keeps_unchanged_tombstones_and_drops_expired_ones_in_order() -> None:
    done = {f"r{i}": Tombstone(T0 + i * 1000, i, T0, None, None, T0 + i) for i in range(5)}
    s = SessionState("s1", 0, done=dict(done))
    s.prune(T0 + 2500, 0, 1000, closed_through=T0 + 1)  # r0, r1 expired and their windows closed
    assert list(s.done) == ["r2", "r3", "r4"]
    s.prune(T0 + 2500, 0, 1000, closed_through=T0 + 1)
    assert list(s.done) == ["r2", "r3", "r4"]


def test_prune_holds_tombstones_pruned_at_an_uncommitted_offset_until_the_commit_passes_it() -> None:
    done = {f"r{i}": Tombstone(T0 + i * 1000, i, T0 + i * 100, None, None, T0 + i) for i in range(5)}
    s = SessionState("s1", 0, done=dict(done))
    s.note_seen("e0", T0, 0, 0)
    s.prune(T0 + 2500, 0, 1000, closed_through=T0 + 1000, keep_offset=None, offset=7)  # commit unknown: dropped
    assert list(s.done) == ["r2", "r3", "r4"] and s.held == {}
    s.prune(T0 + 3500, 0, 1000, closed_through=T0 + 1000, keep_offset=7, offset=9)  # r2 pruned at 9 >= 7: held
    assert list(s.done) == ["r3", "r4"] and s.held == {"r2": (9, done["r2"])}
    assert "e0" not in s.seen  # r0 is neither done nor held: its seen id goes
    back = SessionState.from_obj(orjson.loads(s.to_json()), "")
    assert back.held == s.held and back.done == s.done and not back.is_empty()
    s.prune(T0 + 3500, 0, 1000, closed_through=T0 + 1000, keep_offset=9, offset=12)
    assert list(s.held) == ["r2"]  # the batch that pruned it (offset 9) may still be replayed
    s.prune(T0 + 3500, 0, 1000, closed_through=T0 + 1000, keep_offset=10, offset=12)
    assert s.held == {} and len(orjson.loads(s.to_json())) == 6  # no held part written when empty


def test_pruning_the_oldest_tombstones_cuts_the_kept_encodings_of_done_and_held() -> None:
    done = {f"r{i}": Tombstone(T0 + i * 1000, i, T0 + i * 100, None, None, T0 + i) for i in range(5)}
    s = SessionState("s1", 0, done=dict(done))
    s.to_json()
    s.prune(T0 + 2500, 0, 1000, closed_through=T0 + 1000, keep_offset=7, offset=9)  # r0, r1: the oldest, held
    assert s._done_json is not None and s._done_json.of(s.done)  # cut from the kept bytes, not encoded anew
    assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)
    held = s._held_json
    assert held is not None and list(s.held) == ["r0", "r1"]
    s.prune(T0 + 2500, 0, 1000, closed_through=T0 + 1000, keep_offset=8, offset=9)  # nothing to drop from held
    assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS) and s._held_json is held  # reused
    s.finalise("r9", Tombstone(T0, 9, T0 - 50, None, None, T0))  # an old one last: a prune leaves a gap
    s.prune(T0 + 2500, 0, 1000, closed_through=T0 + 1000, keep_offset=8, offset=10)
    assert list(s.done) == ["r2", "r3", "r4"] and list(s.held) == ["r0", "r1", "r9"]
    assert s._done_json is not None and s._done_json.of(s.done)  # a gap too: the kept entries' bytes
    assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)
    s.prune(T0 + 2500, 0, 1000, closed_through=T0 + 1000, keep_offset=10, offset=11)  # the commit passed 9
    assert list(s.held) == ["r9"] and s._held_json is not None and s._held_json.of(s.held)  # cut, not anew
    assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)


def test_a_tombstone_is_encoded_once_from_done_to_held_and_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finalised, written, pruned into ``held`` above the commit, then out of it: the tombstone's JSON
    form is made when it is first written and never again; every write is orjson's bytes."""
    s = SessionState("s1", 0)
    s.finalise("r0", Tombstone(T0, 0, T0, {"reward": 1.0, "r0": [1]}, None, T0))
    s.to_json()
    made: list[int] = []
    to_obj = Tombstone.to_obj
    monkeypatch.setattr(Tombstone, "to_obj", lambda t: made.append(t.offset) or to_obj(t))
    s.finalise("r1", Tombstone(T0 + 5000, 1, T0 + 5000, {"reward": 0.0}, None, T0 + 5000))  # added in the batch
    s.prune(T0 + 2000, 0, 1000, closed_through=T0 + 10**6, keep_offset=3, offset=4)
    assert list(s.held) == ["r0"] and list(s.done) == ["r1"]
    assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)
    s.prune(T0 + 2000, 0, 1000, closed_through=T0 + 10**6, keep_offset=5, offset=6)
    assert s.held == {} and s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)
    assert made.count(1) == 1
    assert made.count(0) == 2  # only for to_obj's value of held (the write's and the check's), not encoded


_ops = st.lists(st.one_of(
    st.tuples(st.just("seen"), st.integers(0, 30), _ts),        # note_seen (a new id, or one seen before)
    st.tuples(st.just("finalise"), st.integers(0, 30), _ts),    # finalise (a new turn, or a replaced tombstone)
    st.tuples(st.just("prune"), st.integers(T0, T0 + 12_000_000), _ms),
    st.tuples(st.just("turn"), st.integers(0, 5), _ts),         # open a turn (not cached: encoded every time)
    st.tuples(st.just("write"), st.just(0), st.just(0)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(s=sessions(), ops=_ops)
def test_to_json_is_the_encoding_of_to_obj_after_any_changes(s: SessionState, ops: list[tuple[str, int, int]]) -> None:
    """to_json reuses the encodings of seen and done between calls; after any sequence of changes
    through the state's methods it must still give exactly ``orjson.dumps(to_obj())``."""
    for op, a, b in ops:
        if op == "seen":
            s.note_seen(f"e{a}", b, a, 0)
        elif op == "finalise":
            s.finalise(f"done{a}", Tombstone(b, a, b, {"h": {"30": a}}, None, b))
        elif op == "prune":  # (holds pruned tombstones decided at or after offset b % 31)
            s.prune(a, b, b, a, keep_offset=b % 31 if b % 2 else None, offset=a % 37)
        elif op == "turn":
            s.turns[f"open{a}"] = TurnState(f"open{a}", "s1", "org", b)
        assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)


def test_to_json_reencodes_a_changed_part_and_reuses_an_unchanged_one() -> None:
    s = SessionState("s1", 0)
    s.note_seen("e1", T0, 1, 0)
    first = s.to_json()
    assert s.to_json() == first and s._seen_json is not None
    cached = s._seen_json[2]
    s.finalise("r1", Tombstone(T0 + 5, 1, T0, None, None, T0))
    assert s._seen_json[2] is cached  # seen unchanged: its bytes are reused...
    assert orjson.loads(s.to_json())[4] == {"r1": [T0 + 5, 1, T0, None, None, T0, 0]}  # ...done is encoded anew
    s.note_seen("e2", T0 + 1, 2, 0)
    assert list(orjson.loads(s.to_json())[3]) == ["e1", "e2"]
    assert s._seen_json[2] == cached[:-1] + b',"e2":[' + str(T0 + 1).encode() + b',2,0]}'  # appended
    s.note_seen("e1", T0 + 2, 3, 0)  # an id noted again: its value changes in place
    assert orjson.loads(s.to_json())[3] == {"e1": [T0 + 2, 3, 0], "e2": [T0 + 1, 2, 0]}


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 40), st.integers(-50_000, 400_000), st.integers(0, 3_000_000),
                                st.booleans()), max_size=60))
def test_pruning_seen_ids_in_order_or_not_is_the_plain_filter(steps: list[tuple[int, int, int, bool]]) -> None:
    """Seen ids mostly arrive oldest first (pruning then drops a prefix in place); some arrive out of
    order or again. Either way a prune keeps exactly the ids at or after its limit, in their order,
    and the next encoding is exactly orjson's."""
    s, clock = SessionState("s1", 0), T0
    for i, (eid, step, dedup, prune) in enumerate(steps):
        clock += step  # (a negative step: an event older than the last one)
        s.note_seen(f"e{eid}", clock, i, 0)
        if i % 3 == 0:
            s.to_json()  # (an encoding kept before the prune: the prune cuts it)
        if prune:
            before = dict(s.seen)
            limit = clock - dedup
            s.prune(clock, dedup, 10**12, 0)
            assert list(s.seen.items()) == [(k, v) for k, v in before.items() if v[0] >= limit]
            assert not s.seen or s.seen_floor() <= min(v[0] for v in s.seen.values())  # (a floor, never above)
        assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)


_tricky_ids = st.lists(st.text(alphabet=st.sampled_from(['a', 'b', '"', '\\', ',', ':', '[', ']', '{', '}', 'é', '\x01']),
                               max_size=6), unique=True, min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(ids=_tricky_ids, cut=st.integers(0, 12), again=st.booleans())
@example(ids=['x"a', "a"], cut=1, again=False)  # the kept id's entry, quoted and followed by ':', inside a pruned one
@example(ids=["a", ',"a', "b"], cut=2, again=True)
@example(ids=['",\\"a\\":', "\\", "a"], cut=2, again=False)
def test_dropping_the_oldest_seen_ids_cuts_their_encoding_whatever_the_ids_hold(ids: list[str], cut: int,
                                                                               again: bool) -> None:
    """The kept encoding of ``seen`` loses the pruned ids' prefix by finding where the first kept id's
    entry starts: ids holding quotes, backslashes, commas, colons and brackets (one id a prefix or a
    suffix of another) must still cut at exactly that entry."""
    s = SessionState("s1", 0)
    for i, eid in enumerate(ids):
        s.note_seen(eid, T0 + i, i, 0)
    s.to_json()  # the encoding the prune cuts
    s.prune(T0 + cut, 0, 10**12, 0)
    assert list(s.seen) == ids[cut:]
    assert s._seen_json is not None and s._seen_json[0] is s.seen  # cut, not encoded anew
    assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)
    if again and s.seen:  # a later id, then a second cut of the cut encoding
        s.note_seen('z"\\,"', T0 + 100, 100, 0)
        s.to_json()
        s.prune(T0 + cut + 1, 0, 10**12, 0)
        assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)


@settings(max_examples=200, deadline=None)
@given(ids=_tricky_ids, first=st.integers(0, 12), second=st.integers(0, 12))
@example(ids=['x"a', "a", "b"], first=1, second=2)
@example(ids=["a", ',"a":[', 'b"', "c"], first=2, second=3)
def test_pruned_tombstones_cut_the_encodings_of_done_and_held_whatever_the_request_ids_hold(
        ids: list[str], first: int, second: int) -> None:
    """Tombstones under request ids holding quotes, backslashes, commas and brackets, with outcomes
    holding nested objects keyed by those ids: the oldest go from ``done`` to ``held`` in two prunes
    above the commit (at offsets 10 and 20), then the commit passes the first: each kept encoding is
    cut from the last, and is orjson's."""
    second = max(first, second)
    done = {rid: Tombstone(T0 + i * 1000, i, T0 + i * 100, {"reward": 0.5, "h": {"30": i, rid: [i]}}, None, T0 + i)
            for i, rid in enumerate(ids)}
    s = SessionState("s1", 0, done=dict(done))
    s.to_json()
    for n, offset in ((first, 10), (second, 20)):
        s.prune(T0 + n * 1000 - 1, 0, 0, closed_through=T0 + 10**9, keep_offset=0, offset=offset)
        assert list(s.done) == ids[n:] and list(s.held) == ids[:n]
        assert s._done_json is not None and s._done_json.of(s.done)  # cut from the kept bytes, not encoded anew
        assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)
    s.prune(T0 + second * 1000 - 1, 0, 0, closed_through=T0 + 10**9, keep_offset=15, offset=21)
    assert list(s.held) == ids[min(first, len(ids)):min(second, len(ids))]  # the commit passed offset 10 only
    if s.held:
        assert s._held_json is not None and s._held_json.of(s.held)
    assert s.to_json() == orjson.dumps(s.to_obj(), option=JSON_OPTS)
