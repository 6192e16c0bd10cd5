"""restore(): a partition's state read back from its store, and the outputs a restart re-emits."""

from __future__ import annotations

import orjson

from rewardflow.core.config import DictStore
from rewardflow.core.outputs import Outputs
from rewardflow.core.restore import meta_key, restore
from rewardflow.core.session import session_key
from tests.core.feed import CFG, SPECS, Feed
from tests.factories import T0, turn

HZ = (30, 120)
SCORED = [(s, s.content_hash) for s in SPECS]


def _settled_feed() -> Feed:
    f = Feed()
    f.send(*turn("r1", "s1", T0, horizons=HZ))
    f.send(*turn("r2", "s2", T0 + 5_000, horizons=HZ))
    f.send(*turn("r3", "s1", T0 + 200_000, horizons=HZ))  # settles r1 and r2; its own settle lies ahead
    f.tick(T0 + 200_000)
    return f


def _finals(out: Outputs) -> set[tuple[str, str]]:
    return {(r["spec_version"], r["sample_id"]) for r in out.rewards if not r["provisional"]}


def test_restore_reads_the_meta_key_and_every_session_of_its_partition() -> None:
    f = _settled_feed()
    out = Outputs()
    r = restore(f.store, CFG, 0, SCORED, f.offset, out)
    assert (r.wm, r.maxts, r.last_offset) == (f.proc.wm, f.proc.maxts, f.offset - 1)
    assert sorted(st.key for st in r.sessions) == [session_key("org", "s1"), session_key("org", "s2")]
    assert list(r.open_served) == [(session_key("org", "s1"), "r3")]
    assert not out.rewards and not r.unkeyed and not r.dropped  # nothing decided at or after first_offset

    other = restore(f.store, CFG, 1, SCORED, 0, Outputs())  # another partition's keys are not its own
    assert not other.sessions and other.last_offset == -1


def test_restore_re_emits_what_was_decided_at_or_after_its_first_offset() -> None:
    f = Feed()
    f.send(*turn("r1", "s1", T0, horizons=HZ))
    f.send(*turn("r2", "s2", T0 + 130_000, horizons=HZ))  # settles r1
    mid = f.offset
    decided_after = f.tick(T0 + 300_000)  # settles r2
    assert _finals(f.total) == {(v, r) for v in ("v1", "v2") for r in ("r1", "r2")}
    assert _finals(decided_after) == {("v1", "r2"), ("v2", "r2")}
    everything = Outputs()
    restore(f.store, CFG, 0, SCORED, 0, everything)
    assert _finals(everything) == _finals(f.total)
    replayed = Outputs()
    restore(f.store, CFG, 0, SCORED, mid, replayed)  # a restart replaying from the tick
    assert _finals(replayed) == _finals(decided_after)
    assert decided_after.windows
    assert [w["window_start"] for w in replayed.windows] == [w["window_start"] for w in decided_after.windows]


def test_state_under_the_session_id_alone_is_taken_by_the_org_its_turns_name() -> None:
    f = _settled_feed()
    store: DictStore = f.store
    own = "s:" + session_key("org", "s2")
    store.put("s:s2", store.get(own))
    store.delete(own)
    r = restore(store, CFG, 0, SCORED, f.offset, Outputs())
    assert r.unkeyed == {session_key("org", "s2"): "s:s2"} and not r.dropped

    store.put(own, store.get("s:s2"))  # beside a state under its own key: dropped
    seen_only = orjson.loads(orjson.dumps(store.get("s:s2")))
    seen_only[0], seen_only[2], seen_only[4] = "s9", [], {}  # no turn or tombstone names an org
    store.put("s:s9", seen_only)
    r = restore(store, CFG, 0, SCORED, f.offset, Outputs())
    assert sorted(r.dropped) == ["s:s2", "s:s9"] and not r.unkeyed
    assert store.get(meta_key(0))["off"] == r.last_offset
