"""Hostile and broken producers against the pure core: what no record may do to another session.

The processor runs as the worker runs it: a tick key, a broker timestamp per record,
session limits and a store of encoded values. Each test states one rule of
``docs/trust.md``; the property test at the end mixes hostile records into honest
streams and requires the honest sessions' rewards to be exactly those of the honest
stream alone.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import random
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewardflow.core.config import DictStore, EncodedStore, JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import PartitionProcessor
from rewardflow.core.session import SessionState, session_key
from rewardflow.core.corrections import correction_keep_ms
from rewardflow.core.limits import EVENT_BYTES, TURN_BYTES, raw_record_limit, stored_factor
from rewardflow.core.ticks import TICK_HEADERS, signed_tick
from rewardflow.events.wire import decode_record, encode_avro, encode_json
from rewardflow.kafka.provision import dead_letter_record_limit
from rewardflow.settings import Settings
from tests.core.feed import JSON_H, SPECS
from tests.factories import T0, ev, turn

KEY, TOPIC, SKEW = b"unit-test-tick-key-0123", "raw", 1_000
CFG = JoinConfig(horizons_s=(30, 120), grace_ms=2_000, lateness_ms=500, window_sizes_s=(60,),
                 max_clock_skew_ms=SKEW, max_session_turns=3, max_session_events=30, tick_key=KEY)
HZ = (30, 120)
TIMING = ("finalised_wm", "finalised_by")


class Broker:
    """One partition as the worker feeds it: consecutive offsets, each record with a broker timestamp."""

    def __init__(self, cfg: JoinConfig = CFG, store: Any = None) -> None:
        self.store = store if store is not None else EncodedStore(check=False)
        self.proc = PartitionProcessor(cfg, list(SPECS), self.store, TOPIC, 0)
        self.offset, self.total = 0, Outputs()

    def record(self, value: bytes | None, headers: Any, at: int) -> Outputs:
        out = self.proc.process(value, headers, self.offset, 1_000_000 + self.offset, record_ts=at)
        self.offset += 1
        self.total.extend(out)
        return out

    def send(self, at: int, *events: dict[str, Any]) -> Outputs:
        return self.record(encode_json(list(events)), JSON_H, at)

    def tick(self, wm: int, at: int, key: bytes = KEY) -> Outputs:
        return self.record(signed_tick(key, TOPIC, wm), TICK_HEADERS, at)

    def finals(self, session: str | None = None) -> dict[tuple[str, str], dict[str, Any]]:
        return {(r["spec_version"], r["sample_id"]): {k: v for k, v in r.items() if k not in TIMING}
                for r in self.total.rewards
                if not r["provisional"] and (session is None or r["session_id"] == session)}


def codes(out: Outputs) -> list[str]:
    return [d["reason_code"] for d in out.dead]


# ---------------------------------------------------------------------------- clocks
def test_an_event_dated_past_the_skew_is_dead_lettered_and_moves_no_watermark() -> None:
    b = Broker()
    honest = turn("r1", "s1", T0, horizons=HZ)
    b.send(T0, *honest[:2])
    wm = b.proc.wm
    out = b.send(T0, ev("InferenceServed", "evil", "s-evil", T0 + SKEW + 1))
    assert codes(out) == ["future_ts"] and "REWARDFLOW_MAX_CLOCK_SKEW_MS" in out.dead[0]["reason"]
    assert b.proc.wm == wm and not out.valid
    at_bound = b.send(T0, ev("InferenceServed", "edge", "s-edge", T0 + SKEW))  # exactly the bound: accepted
    assert len(at_bound.valid) == 1 and not at_bound.dead
    b.send(T0 + 200_000, *honest[2:])  # r1's later signals still count
    assert not b.total.late
    b.tick(2**62, T0 + 10**7)
    assert {k[1] for k in b.finals()} == {"r1", "edge"}


def test_a_single_future_event_cannot_finalise_a_partition() -> None:
    """The report's case: one ``InferenceServed`` in 2099 finalised every open turn of its partition."""
    b = Broker()
    turns = [turn(f"r{i}", f"s{i}", T0 + i, horizons=HZ) for i in range(20)]
    for t in turns:
        b.send(T0 + 20, *t[:3])
    b.send(T0 + 30, ev("InferenceServed", "evil", "s-evil", 4_070_908_800_000))
    rejects = [ev("UserAction", f"r{i}", f"s{i}", T0 + 4_000, action="reject") for i in range(20)]
    for r in rejects:
        b.send(T0 + 4_000, r)
    assert not b.total.late and not [r for r in b.total.rewards if not r["provisional"]]
    for t in turns:
        b.send(T0 + 200_000, *t[3:])
    b.tick(2**62, T0 + 10**7)
    finals = b.finals()
    assert len(finals) == 20 * len(SPECS)
    assert all(r["n_reject"] == 1 for r in finals.values())


def test_a_record_without_broker_time_is_unbounded() -> None:
    """Replays of stored, already accepted events pass no timestamp: nothing is refused for time."""
    b = Broker()
    out = b.proc.process(encode_json([ev("InferenceServed", "r", "s", T0 + 10**9)]), JSON_H, 0, 0)
    assert len(out.valid) == 1


# ---------------------------------------------------------------------------- ticks
@pytest.mark.parametrize("value", [
    orjson.dumps({"wm": 4_102_444_799_999}),  # no MAC
    orjson.dumps({"wm": 18_446_744_073_709_551_615, "mac": "00"}),
    signed_tick(b"another-deployment-key", TOPIC, T0 + 10**6),
    signed_tick(KEY, "another.topic", T0 + 10**6),
    orjson.dumps({"wm": T0 + 10**6 + 1, "mac": orjson.loads(signed_tick(KEY, TOPIC, T0 + 10**6))["mac"]}),
    orjson.dumps({"wm": T0 + 10**6, "mac": "\u00e9"}),  # not ASCII: the comparison itself must not raise
])
def test_a_tick_no_worker_wrote_is_dead_lettered_as_forged(value: bytes) -> None:
    b = Broker()
    b.send(T0, *turn("r1", "s1", T0, horizons=HZ)[:3])
    wm = b.proc.wm
    out = b.record(value, TICK_HEADERS, T0 + 10**7)
    assert codes(out) == ["forged_tick"] and b.proc.wm == wm and not out.rewards


def test_a_tick_with_a_mac_that_is_not_ascii_costs_no_rebuild_of_the_partition() -> None:
    """A record the core raises on is dead-lettered after the partition is rebuilt from its store: a
    tick a client can write must be refused as forged, not by that path."""
    b = Broker()
    b.send(T0, *turn("r1", "s1", T0, horizons=HZ)[:3])
    rebuilds = []
    original = b.proc.rebuild
    b.proc.rebuild = lambda *a, **k: rebuilds.append(1) or original(*a, **k)  # type: ignore[method-assign]
    out = b.record(orjson.dumps({"wm": T0 + 10**6, "mac": "\u00e9" * 64}), TICK_HEADERS, T0 + 10**7)
    assert codes(out) == ["forged_tick"] and not rebuilds


def test_a_signed_tick_is_capped_at_its_record_time_plus_skew() -> None:
    b = Broker()
    b.send(T0, *turn("r1", "s1", T0, horizons=HZ)[:3])
    b.tick(2**62, T0 + 5_000)
    assert b.proc.wm == T0 + 5_000 + SKEW
    b.tick(T0, T0 + 6_000)  # a lower watermark changes nothing
    assert b.proc.wm == T0 + 5_000 + SKEW


def test_without_a_key_unsigned_ticks_pass_for_trusted_replays() -> None:
    cfg = JoinConfig(horizons_s=HZ, grace_ms=2_000, lateness_ms=500, window_sizes_s=(60,))
    proc = PartitionProcessor(cfg, list(SPECS), DictStore(), TOPIC, 0)
    proc.process(orjson.dumps({"wm": T0}), TICK_HEADERS, 0, 0)
    assert proc.wm == T0


# ---------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("value, code", [
    (b"[]", "empty_batch"),
    (b'{"events": []}', "empty_batch"),
    (encode_json([ev("InferenceServed", "a", "s1"), ev("ToolCall", "a", "s2")]), "mixed_sessions"),
])
def test_empty_and_mixed_records_are_dead_lettered_whole(value: bytes, code: str) -> None:
    out = Broker().record(value, JSON_H, T0)
    assert [(d["index"], d["reason_code"]) for d in out.dead] == [(-1, code)] and not out.valid


def test_an_event_batch_naming_another_session_is_dead_lettered() -> None:
    events = [ev("InferenceServed", "a", "s1"), ev("ToolCall", "a", "s1")]
    value = encode_avro(events, batch_id="b")
    forged = value.replace(b"\x04s1", b"\x04s9", 1)  # the batch's own session_id field comes first
    assert forged != value
    out = Broker().record(forged, [("rf-format", b"avro")], T0)
    assert codes(out) == ["batch_session_mismatch"] and not out.valid


def test_a_records_bytes_are_in_one_dead_letter_however_many_of_its_events_orjson_cannot_write() -> None:
    deep = b"[" * 300 + b'"x"' + b"]" * 300  # past orjson's 255 levels: the refused event cannot be written back
    value = b'{"events": [' + b",".join(b'{"extra": ' + deep + b", " + orjson.dumps(ev("ToolCall", f"r{i}", "s1"))[1:]
                                        for i in range(40)) + b"]}"
    out = Broker().record(value, JSON_H, T0)
    assert [d["index"] for d in out.dead] == list(range(40)) and not out.valid
    carrying = [d for d in out.dead if d["original_b64"]]
    assert len(carrying) == 1 and carrying[0]["index"] == 0
    assert base64.b64decode(carrying[0]["original_b64"]) == value
    assert all("the record's bytes are in the dead letter of its event 0" in d["reason"] for d in out.dead[1:])
    assert sum(len(d["original_b64"]) for d in out.dead) < 2 * len(value)


@pytest.mark.parametrize("case", ["escaped", "oversize", "tick"])
def test_a_dead_letter_fits_its_topic_whatever_it_refuses(case: str) -> None:
    """An event of control characters, whose JSON is six times its record's bytes; a record over the limit
    (compressed, the broker can take one); a tick of any size: each dead letter carries as much of what it
    refused as the raw topic takes, names its length and SHA-256, and fits the dead-letter topic at the
    default limits, so the worker can send it and go on."""
    settings = Settings()
    cfg = dataclasses.replace(CFG, max_record_bytes=settings.max_record_bytes)
    if case == "escaped":
        value, headers = encode_avro([ev("FollowUp", "r1", "s1", T0, text_redacted="\x01" * 900_000)]), [("rf-format", b"avro")]
    elif case == "oversize":
        value, headers = encode_json([ev("FollowUp", "r1", "s1", T0, text_redacted="x" * 3_000_000)]), JSON_H
    else:
        value, headers = b"x" * 3_000_000, TICK_HEADERS
    (letter,) = Broker(cfg).record(value, headers, T0).dead
    refused = base64.b64decode(letter["original_b64"])
    whole = orjson.dumps(decode_record(value, headers)[0]) if case == "escaped" else value
    keep = raw_record_limit(cfg.max_record_bytes)
    assert len(whole) > keep and refused == whole[:keep]
    assert f"of {len(whole):,} bytes, sha256 {hashlib.sha256(whole).hexdigest()}" in letter["reason"]
    assert len(orjson.dumps([letter])) <= dead_letter_record_limit(settings)


# ---------------------------------------------------------------------------- volume
def test_a_session_over_its_turn_limit_has_the_excess_dead_lettered_and_others_are_untouched() -> None:
    b = Broker()
    b.send(T0, *turn("h1", "honest", T0, horizons=HZ)[:3])
    flood = [ev("InferenceServed", f"f{i}", "flood", T0 + i) for i in range(10)]
    out = b.send(T0 + 10, *flood)
    assert len(out.valid) == CFG.max_session_turns
    assert codes(out) == ["session_turn_limit"] * (10 - CFG.max_session_turns)
    assert [d["index"] for d in out.dead] == list(range(CFG.max_session_turns, 10))
    more = b.send(T0 + 20, ev("ToolCall", "f0", "flood", T0 + 20))  # an open turn still takes events
    assert len(more.valid) == 1
    b.send(T0 + 200_000, *turn("h1", "honest", T0, horizons=HZ)[3:])
    b.tick(T0 + 300_000, T0 + 300_000)
    assert {k[1] for k in b.finals("honest")} == {"h1"}
    # finalised turns count until their tombstones expire; after that the session may open turns again
    assert codes(b.send(T0 + 300_001, ev("InferenceServed", "f10", "flood", T0 + 300_001))) == ["session_turn_limit"]
    later = T0 + 300_000 + CFG.keep_done_ms + 120_000
    b.tick(later, later)
    assert len(b.send(later, ev("InferenceServed", "f11", "flood", later)).valid) == 1


def test_a_session_over_its_event_limit_has_the_excess_dead_lettered() -> None:
    b = Broker()
    events = [ev("ToolCall", "t", "busy", T0 + i, call_id=f"c{i}") for i in range(40)]
    out = b.send(T0 + 40, *events)
    assert len(out.valid) == CFG.max_session_events
    assert set(codes(out)) == {"session_event_limit"} and len(out.dead) == 40 - CFG.max_session_events


def test_the_limit_does_not_depend_on_when_expired_tombstones_are_pruned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Expired tombstones are not counted, pruned or not: a session whose wake-up came late (as after a
    restart, which rebuilds the wake-up schedule) decides as one that woke on time."""
    def run(prune: bool) -> tuple[list[str], int]:
        with monkeypatch.context() as m:
            if not prune:
                m.setattr(SessionState, "prune", lambda self, *a, **k: None)
            b = Broker()
            b.send(T0, *[ev("InferenceServed", f"f{i}", "s", T0 + i) for i in range(3)])
            b.tick(T0 + 200_000, T0 + 200_000)  # finalised
            gone = T0 + 200_000 + CFG.keep_done_ms + CFG.prune_step_ms + 120_000  # (a pruning wake-up is on its grid)
            b.tick(gone, gone)  # expired: pruned at this wake-up, or (without prune) still stored
            out = b.send(gone + 1, ev("InferenceServed", "f9", "s", gone + 1))
            return codes(out), len(b.store.get("s:org\ts")[4])

    (pruned, kept_pruned), (unpruned, kept_unpruned) = run(True), run(False)
    assert kept_pruned == 0 and kept_unpruned == 3  # the two runs do differ in what they store...
    assert pruned == unpruned == []  # ...but not in what they decide


# Ids and labels are printable ASCII without '"' or '\\', one byte a character in JSON as in UTF-8. The
# fields the contract leaves free (producer, language, tool, error_kind) get a control character, which
# JSON writes six bytes wide: the bound holds because the state keeps none of them.
WIDEST_FREE = "\x01"


@pytest.mark.parametrize("correction_ms", [0, 3_600_000])  # with corrections, tombstones keep their turn
def test_a_session_at_its_limits_with_the_longest_ids_fits_the_bound_the_changelog_is_sized_for(correction_ms: int) -> None:
    long_id, short, free = "x" * 128, "y" * 64, WIDEST_FREE * 64
    cfg = JoinConfig(horizons_s=HZ, grace_ms=2_000, lateness_ms=500, window_sizes_s=(60,),
                     max_session_turns=40, max_session_events=400, correction_ms=correction_ms)

    def event(kind: str, rid: int, i: int, **f: Any) -> dict[str, Any]:
        return ev(kind, f"{rid:04d}" + long_id[4:], long_id, T0 + i, event_id=f"{i:06d}" + short[6:], org_id=long_id,
                  producer={"name": free, "version": free}, **f)

    store = EncodedStore(check=False)
    proc = PartitionProcessor(cfg, list(SPECS), store, TOPIC, 0)
    i, offset, largest = 0, 0, 0
    for rid in range(cfg.max_session_turns):
        events = [event("InferenceServed", rid, i := i + 1, checkpoint_id=long_id, experiment_arm=short,
                        ttft_ms=2**31 - 1, latency_ms=2**31 - 1, prompt_tokens=2**31 - 1, completion_tokens=2**31 - 1)]
        for k in range(cfg.max_session_events // cfg.max_session_turns - 1):
            edit = f"{k:04d}" + long_id[4:]
            events.append(event("AgentEdit", rid, i := i + 1, edit_id=edit, file_path_hash=long_id, language=free,
                                lines_added=2**31 - 1, lines_removed=2**31 - 1, chars_inserted=2**31 - 1,
                                content_fingerprint=long_id) if k % 2 == 0 else
                          event("PersistenceCheck", rid, i := i + 1, edit_id=f"{k - 1:04d}" + long_id[4:],
                                horizon_s=604_800 - k, survival_score=0.1234567890123, revert_score=0.1234567890123,
                                unchanged=True, surviving_chars=2**31 - 1, branch_changed=True))
        out = proc.process(encode_json(events), JSON_H, offset, 0)
        assert not out.dead, out.dead[:1]
        offset += 1
        largest = max(largest, len(store.data["s:" + session_key(long_id, long_id)]))
    proc.process(orjson.dumps({"wm": T0 + 200_000}), TICK_HEADERS, offset, 0)  # every turn a tombstone
    largest = max(largest, len(store.data["s:" + session_key(long_id, long_id)]))
    bound = cfg.max_session_turns * TURN_BYTES + cfg.max_session_events * EVENT_BYTES
    assert largest <= bound, f"{largest:,} bytes over the {bound:,} the limits promise"


def test_edits_dated_past_the_turn_span_are_refused_and_hold_back_no_window_of_the_partition() -> None:
    """A client that keeps dating edits of one served turn minutes apart would keep that turn open, and with
    it every window of its partition (and the expiry of every session's remembered turns there)."""
    cfg = JoinConfig(horizons_s=HZ, grace_ms=2_000, lateness_ms=500, window_sizes_s=(60,), max_clock_skew_ms=SKEW,
                     tick_key=KEY, max_turn_span_ms=300_000)
    b = Broker(cfg)
    b.send(T0, ev("InferenceServed", "held", "s-evil", T0))
    honest = turn("r1", "s1", T0 + 1, horizons=HZ)
    assert not b.send(T0 + 130_000, *honest).dead
    fate = []
    for k in range(1, 61):  # an edit a minute for an hour, each dated at its record's broker time
        at = T0 + k * 60_000
        out = b.send(at, ev("AgentEdit", "held", "s-evil", at, edit_id=f"e{k}"))
        fate.append("applied" if out.valid else "late" if out.late else codes(out)[0])
        b.tick(at, at)  # the partition's time goes on (a refused event moves no watermark)
    # the first five are within the span (the fifth exactly at it); the turn settles on the deadline the fifth
    # gave it (+ HZ[-1] s + grace: between the eighth and the ninth), and what comes after is late
    assert fate[:5] == ["applied"] * 5 and fate[5:8] == ["turn_span_limit"] * 3 and set(fate[8:]) == {"late"}
    assert "REWARDFLOW_MAX_TURN_SPAN_MS" in b.total.dead[0]["reason"]
    closed = {w["window_start"] for w in b.total.windows}
    assert T0 - T0 % 60_000 in closed  # the honest turn's window closed within the hour
    assert b.finals("s-evil") and b.finals("s1")  # and both turns were scored


def _finalised_turn() -> Broker:
    """A partition whose turn r1 of s1 is finalised, within its correction window."""
    cfg = JoinConfig(horizons_s=HZ, grace_ms=2_000, lateness_ms=500, window_sizes_s=(60,), max_clock_skew_ms=SKEW,
                     tick_key=KEY, max_turn_span_ms=60_000, correction_ms=600_000)
    b = Broker(cfg)
    b.send(T0, ev("InferenceServed", "r1", "s1", T0))
    b.tick(T0 + 150_000, T0 + 150_000)  # finalised: a later signal may correct it
    assert b.finals("s1")
    return b


def test_an_edit_past_the_turn_span_is_refused_as_a_correction_too() -> None:
    b = _finalised_turn()
    at = T0 + 200_000
    out = b.send(at, ev("AgentEdit", "r1", "s1", at, edit_id="late-edit"))
    assert codes(out) == ["turn_span_limit"] and not out.rewards and not out.valid
    within = b.send(at, ev("FollowUp", "r1", "s1", at, dissatisfied=True))  # other signals still correct it
    assert {r["revision"] for r in within.rewards} == {1}


def test_a_correction_refuses_events_dated_further_behind_than_its_turn_took_while_open() -> None:
    b = _finalised_turn()
    at = T0 + 200_000
    fate = {}
    for name, ts in (("the turn's time", T0 + 1_000), ("a day back", T0 - 86_400_000), ("the year 2000", 946_684_800_000)):
        out = b.send(at, ev("FollowUp", "r1", "s1", ts, dissatisfied=True))
        fate[name] = "corrected" if out.rewards else codes(out)[0] if out.dead else "late"
    assert fate == {"the turn's time": "corrected", "a day back": "too_old", "the year 2000": "too_old"}
    assert "its turn's deadline" in b.total.dead[0]["reason"]


def test_a_correction_dated_after_its_served_event_is_taken_however_late_its_turn_was_finalised() -> None:
    """A partition that got no record for a while finalises its turns at a watermark far past their
    deadlines: the bound is the turn's deadline, not that watermark."""
    cfg = JoinConfig(horizons_s=HZ, grace_ms=2_000, lateness_ms=500, window_sizes_s=(60,), max_clock_skew_ms=SKEW,
                     tick_key=KEY, max_turn_span_ms=60_000, correction_ms=600_000)
    b = Broker(cfg)
    b.send(T0, ev("InferenceServed", "r1", "s1", T0))
    b.tick(T0 + 700_000, T0 + 700_000)  # the deadline was T0 + 122 s
    assert b.finals("s1")
    out = b.send(T0 + 750_000, ev("FollowUp", "r1", "s1", T0 + 300_000, dissatisfied=True))
    assert not out.dead and {r["revision"] for r in out.rewards} == {1}


def test_an_open_turn_refuses_events_dated_further_behind_the_watermark_than_a_turn_can_span() -> None:
    """Each date an event carries is a day partition of the shared events table: an open turn that took
    events of any date would let one client add a partition a day back to the year 2000."""
    cfg = JoinConfig(horizons_s=HZ, grace_ms=2_000, lateness_ms=500, window_sizes_s=(60,), max_clock_skew_ms=SKEW,
                     tick_key=KEY, max_turn_span_ms=60_000)
    b = Broker(cfg)
    b.send(T0, ev("InferenceServed", "r1", "s1", T0))
    at = T0 + 100_000  # the watermark, the turn still open (its deadline: T0 + 122 s)
    b.send(at, ev("FollowUp", "other", "s2", at + 500))
    bound = cfg.settle_ms + cfg.max_turn_span_ms
    fate = {}
    for name, ts in (("at the bound", at - bound), ("a day back", T0 - 86_400_000), ("the year 2000", 946_684_800_000)):
        out = b.send(at, ev("ToolCall", "r1", "s1", ts, call_id=name, status="broken"))
        fate[name] = "applied" if out.valid else codes(out)[0] if out.dead else "late"
    assert fate == {"at the bound": "applied", "a day back": "too_old", "the year 2000": "too_old"}
    assert "REWARDFLOW_MAX_TURN_SPAN_MS" in b.total.dead[0]["reason"]
    b.tick(T0 + 200_000, T0 + 200_000)
    assert {r["n_tool_broken"] for r in b.finals("s1").values()} == {1}  # only the one within the bound counts


# ---------------------------------------------------------------------------- tenants
def _as(org: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "org_id": org} for e in events]


def _of(b: Broker, org: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The final rewards of ``org``'s sessions, by (spec, session, request)."""
    return {(r["spec_version"], r["session_id"], r["sample_id"]): {k: v for k, v in r.items() if k not in TIMING}
            for r in b.total.rewards if not r["provisional"] and r["org_id"] == org}


def test_two_orgs_sessions_sharing_an_id_are_two_sessions_and_neither_bends_the_others_reward() -> None:
    honest = _as("org-a", turn("r1", "s1", T0, horizons=HZ))
    hostile = _as("org-b", [ev("InferenceServed", "r1", "s1", T0 - 1, checkpoint_id="ck-b"),
                            ev("FollowUp", "r1", "s1", T0 + 3_000, dissatisfied=True),
                            ev("ToolCall", "r1", "s1", T0 + 3_000, call_id="x", status="broken")])

    def run(a: bool, b_: bool) -> Broker:
        b = Broker()
        if a and b_:  # one record holding both orgs' first events: each goes to its org's session
            assert not b.send(T0 + 130_000, honest[0], hostile[0]).dead
        elif a:
            b.send(T0 + 130_000, honest[0])
        elif b_:
            b.send(T0 + 130_000, hostile[0])
        for e in hostile[1:] if b_ else []:
            assert not b.send(T0 + 130_000, e).dead
        if a:
            b.send(T0 + 130_000, *honest[1:])
        b.tick(T0 + 400_000, T0 + 400_000)
        return b

    both, alone_a, alone_b = run(True, True), run(True, False), run(False, True)
    assert _of(alone_a, "org-a") and _of(both, "org-a") == _of(alone_a, "org-a")
    assert _of(alone_b, "org-b") and _of(both, "org-b") == _of(alone_b, "org-b")
    assert _of(both, "org-a") != {k: {**v, "org_id": "org-a"} for k, v in _of(both, "org-b").items()}
    assert not both.total.dead and not both.total.excluded


def test_another_org_cannot_take_a_sessions_event_ids_ahead_of_it() -> None:
    b = Broker()
    first, *rest = _as("org-a", turn("r1", "s1", T0, horizons=HZ))
    b.send(T0 + 130_000, first)
    squat = _as("org-b", [ev("FollowUp", "r9", "s1", T0 + 1, event_id=e["event_id"]) for e in rest])
    assert len(b.send(T0 + 130_000, *squat).valid) == len(squat)  # its own session's events
    out = b.send(T0 + 130_000, *rest)
    assert not out.excluded and len(out.valid) == len(rest)  # none taken for a duplicate


def test_an_org_keeps_its_session_id_after_another_org_used_it() -> None:
    """Whenever they come, one org's events never make another org's events for the same session id refused."""
    b, at = Broker(), T0
    for i in range(4):
        for org in ("org-a", "org-b") if i % 2 else ("org-b", "org-a"):
            assert not b.send(at, *_as(org, [ev("InferenceServed", f"{org}-{i}", "s", at)])).dead
        at += CFG.keep_done_ms + CFG.prune_step_ms + 120_000  # every turn finalised and forgotten between
        b.tick(at, at)
    assert {k[2] for k in _of(b, "org-a")} == {f"org-a-{i}" for i in range(4)}
    assert {k[2] for k in _of(b, "org-b")} == {f"org-b-{i}" for i in range(4)}


def _through(events: list[dict[str, Any]], b: Broker | None = None) -> Broker:
    """``events`` sent one record each, then every turn finalised."""
    b = b or Broker()
    for e in events:
        b.send(T0 + 130_000, e)
    b.tick(T0 + 400_000, T0 + 400_000)
    return b


def _restart(store: EncodedStore, offset: int) -> Broker:
    """A worker restarting over ``store`` at the record after ``offset``'s last."""
    b = Broker(store=store)
    b.offset = offset
    return b


def _unkey(store: EncodedStore) -> None:
    """Move every session's state to a key of its session id alone, as state was stored without the org."""
    for key in [k for k in store.data if k.startswith("s:")]:
        store.data["s:" + key.split("\t", 1)[1]] = store.data.pop(key)
    store.forget()


def test_state_stored_under_the_session_id_alone_is_taken_as_its_orgs_and_moved_to_its_key() -> None:
    events = _as("org-a", turn("r1", "s1", T0, horizons=HZ)) + _as("org-a", turn("r2", "s2", T0, horizons=HZ))
    whole = _through(events)
    first = Broker()
    for e in events[:5]:
        first.send(T0 + 130_000, e)
    _unkey(first.store)
    assert "s:s1" in first.store.data
    again = _through(events[5:], _restart(first.store, first.offset))  # a restart over the stored state
    assert _of(again, "org-a") == _of(whole, "org-a")
    assert not [k for k in again.store.data if k.startswith("s:") and "\t" not in k]


class _Changelog(EncodedStore):
    """An encoded store that keeps its writes in order, as the changelog receives them."""

    def __init__(self, data: dict[str, bytes]) -> None:
        super().__init__(check=False)
        self.data, self.log = dict(data), list[tuple[str, bytes | None]]()

    def put_json(self, key: str, value: Any, data: bytes) -> None:
        super().put_json(key, value, data)
        self.log.append((key, data))

    def put(self, key: str, value: Any) -> None:
        super().put(key, value)
        self.log.append((key, self.data[key]))

    def delete(self, key: str) -> None:
        super().delete(key)
        self.log.append((key, None))


def test_a_restart_after_any_prefix_of_the_moving_batchs_writes_keeps_the_sessions_turn() -> None:
    events = _as("org-a", turn("r1", "s1", T0, horizons=HZ))
    whole = _through(events)
    first = Broker()
    for e in events[:3]:
        first.send(T0 + 130_000, e)
    _unkey(first.store)
    moving = _restart(_Changelog(first.store.data), first.offset)  # the new build's first batch moves the state
    moving.send(T0 + 130_000, events[3])
    log = moving.store.log
    assert ("s:s1", None) in log
    for n in range(len(log) + 1):  # the changelog kept the first n writes, then the worker died
        kept = EncodedStore(check=False)
        kept.data = dict(first.store.data)
        for key, value in log[:n]:
            if value is None:
                kept.data.pop(key, None)
            else:
                kept.data[key] = value
        again = _through(events[3:], _restart(kept, first.offset))  # the batch was not committed: read again
        assert _of(again, "org-a") == _of(whole, "org-a"), log[:n]


def test_stored_state_without_an_org_to_take_it_is_dropped() -> None:
    b = Broker()
    b.send(T0, *_as("org-a", [ev("InferenceServed", "r1", "s1", T0)]))
    b.store.data["s:s1"] = b.store.data["s:" + session_key("org-a", "s1")]  # beside its own key: dropped
    obj = orjson.loads(b.store.data["s:s1"])
    obj[0], obj[2], obj[4] = "s9", [], {}  # seen ids only: no turn or tombstone names its org
    b.store.data["s:s9"] = orjson.dumps(obj)
    b.store.forget()
    again = _restart(b.store, b.offset)
    again.tick(T0 + 1_000, T0 + 1_000)
    assert "s:s9" not in again.store.data and "s:s1" not in again.store.data
    assert "s:" + session_key("org-a", "s1") in again.store.data


def test_a_session_of_one_org_keeps_taking_its_own_turns() -> None:
    b = Broker()
    for i, rid in enumerate(("r1", "r2")):
        assert not b.send(T0 + 130_000 + i, *_as("org-a", turn(rid, "s1", T0 + i, horizons=HZ))).dead
    b.tick(T0 + 400_000, T0 + 400_000)
    assert {k[1] for k in b.finals("s1")} == {"r1", "r2"}


# A turn held open for its whole span holds every window of its partition back, and with them the
# tombstones those windows still need: tombstone_ms 0 makes keep_done_ms the settle time plus a window.
HELD = JoinConfig(horizons_s=HZ, grace_ms=2_000, lateness_ms=500, window_sizes_s=(60,), max_clock_skew_ms=SKEW,
                  tick_key=KEY, max_turn_span_ms=300_000, tombstone_ms=0, max_session_turns=3, max_session_events=30)


def _holding(b: Broker, org: str, until: int) -> None:
    """Keep a turn of ``org`` open from T0 up to ``until``: an edit a minute, each within the turn span,
    the partition's time following them."""
    b.send(T0, *_as(org, [ev("InferenceServed", "held", "s-held", T0)]))
    for at in range(T0 + 60_000, until + 1, 60_000):
        assert not b.send(at, *_as(org, [ev("AgentEdit", "held", "s-held", at, edit_id=f"e{at}")])).dead
        b.tick(at, at)


def test_another_orgs_held_turn_leaves_a_sessions_turn_limit_as_it_was() -> None:
    """Finalised turns count against their session's limit until they expire by the session's own time,
    even while another org's turn holds the windows that keep them stored."""
    def run(held: bool) -> tuple[int, list[str]]:
        b = Broker(HELD)
        b.send(T0 + 1, *_as("org-a", [ev("InferenceServed", f"v{i}", "victim", T0 + 1) for i in range(3)]))
        if held:
            _holding(b, "org-b", T0 + 300_000)
        else:
            for t in range(T0 + 60_000, T0 + 300_001, 60_000):
                b.tick(t, t)
        at = T0 + 400_000  # the victim's turns finalised at T0 + 180 s at the latest: past keep_done_ms now
        b.tick(at, at)
        return len(b.store.get("s:org-a\tvictim")[4]), codes(b.send(at, *_as("org-a", [ev("InferenceServed", "v3", "victim", at)])))

    (kept, held), (_, free) = run(True), run(False)
    assert kept == 3  # the held windows keep the victim's tombstones...
    assert held == free == []  # ...but its limit counts them as if nothing held them


def test_a_correction_arriving_past_its_window_and_grace_is_late_even_while_its_tombstone_is_kept() -> None:
    """A tombstone kept only because a window holding it is open takes no more events: the session limits,
    which count by the session's own time, bound its state."""
    cfg = dataclasses.replace(HELD, correction_ms=60_000)
    b = Broker(cfg)
    b.send(T0 + 1, ev("InferenceServed", "r1", "s1", T0 + 1))
    _holding(b, "org-b", T0 + 300_000)
    finalised = next(r["finalised_wm"] for r in b.total.rewards if r["session_id"] == "s1" and not r["provisional"])
    assert b.proc.wm > finalised + correction_keep_ms(cfg) and b.store.get("s:org\ts1")[4]
    within_window = finalised - cfg.settle_ms + cfg.correction_ms  # dated within the correction window
    out = b.send(b.proc.wm, ev("FollowUp", "r1", "s1", within_window, dissatisfied=True))
    assert not out.rewards and [x["reason"] for x in out.late] == ["late"]


def test_a_served_event_dated_more_than_the_span_before_its_turns_edits_is_refused() -> None:
    """The span holds whatever order a turn's events come in: an edit sent first, then an InferenceServed
    dated far behind it, would hold the partition's windows back as long as an edit past the span."""
    cfg = dataclasses.replace(HELD, max_turn_span_ms=60_000)
    b = Broker(cfg)
    b.tick(T0, T0)
    assert len(b.send(T0, ev("AgentEdit", "r1", "s1", T0 + SKEW, edit_id="e1")).valid) == 1
    out = b.send(T0, ev("InferenceServed", "r1", "s1", T0 - 100_000))
    assert codes(out) == ["turn_span_limit"] and "before its turn's latest edit" in out.dead[0]["reason"]
    assert len(b.send(T0, ev("InferenceServed", "r1", "s1", T0 - 50_000)).valid) == 1  # within the span: taken
    earlier = b.send(T0, ev("InferenceServed", "r1", "s1", T0 - 70_000))  # would become the turn's served
    assert codes(earlier) == ["turn_span_limit"]


def test_a_turn_without_a_served_event_takes_no_edit_dated_past_the_span_after_its_first_event() -> None:
    """Without the bound, an edit every settle time kept such a turn open for ever, and with it every
    event id its session saw since."""
    cfg = dataclasses.replace(HELD, max_turn_span_ms=300_000, max_session_events=1_000)
    b = Broker(cfg)
    fate = []
    for k in range(6):
        at = T0 + k * 100_000
        out = b.send(at, ev("AgentEdit", "orphan", "s1", at, edit_id=f"e{k}"))
        fate.append("applied" if out.valid else "late" if out.late else codes(out)[0])
        b.tick(at, at)
    assert fate[:4] == ["applied"] * 4 and fate[4] == "turn_span_limit"


@pytest.mark.parametrize("correction_ms", [0, 60_000])
def test_a_session_whose_windows_are_held_stores_at_most_its_limits_times_the_stored_factor(correction_ms: int) -> None:
    """A session opening turns as fast as its limit lets it, and padding each finalised turn with
    corrections for as long as they are taken, while another org's turns hold every window back."""
    cfg = dataclasses.replace(HELD, correction_ms=correction_ms, max_session_turns=4, max_session_events=12)
    factor = stored_factor(cfg)
    b = Broker(cfg)
    most = (0, 0)
    for k in range(120):
        at = T0 + k * 10_000
        if k % 10 == 0:  # a turn served every 100 s, edited after 100, 200 and 300 s (its span)
            other = [ev("InferenceServed", "held", f"s-held{k}", at)]
            other += [ev("AgentEdit", "held", f"s-held{k - j}", at, edit_id=f"e{j}") for j in (10, 20, 30) if k >= j]
            assert not any(b.send(at, *_as("org-b", [e])).dead for e in other)
        batch = [ev("InferenceServed", f"v{k}-{i}", "victim", at) for i in range(cfg.max_session_turns)]
        if correction_ms:
            # each dated as late as its turn's correction window allows (T0 + j * 10 s was its served event)
            batch += [ev("ToolCall", f"v{j}-{i}", "victim", min(at - 1, T0 + j * 10_000 + cfg.settle_ms + correction_ms),
                         call_id=f"c{k}", status="broken") for j in range(max(0, k - 40), k) for i in range(cfg.max_session_turns)]
        b.send(at, *batch)
        b.tick(at, at)
        obj = b.store.get("s:org\tvictim")
        turns, events = SessionState.from_obj(obj, "org").load()
        assert turns <= factor * cfg.max_session_turns and events <= factor * cfg.max_session_events, (k, turns, events)
        most = max(most, (turns, events))
    assert most[0] > cfg.max_session_turns  # the held windows did keep more than the limit
    assert b.total.rewards and not any(d["reason_code"] not in ("session_turn_limit", "session_event_limit")
                                       for d in b.total.dead)


def _backlog(cfg: JoinConfig) -> list[tuple[bytes, Any, int, int]]:
    """A session's turn every 30 s for 100 minutes, with the operator's ticks: a backlog one batch takes."""
    records: list[tuple[bytes, Any, int, int]] = []
    for k in range(200):
        at = T0 + k * 30_000
        records.append((encode_json([ev("InferenceServed", f"t{k}", "s1", at)]), JSON_H, 2 * k, at))
        records.append((signed_tick(KEY, TOPIC, at), TICK_HEADERS, 2 * k + 1, at))
    return records


def _stored(store: Any) -> tuple[int, int]:
    """(turns, held tombstones) of session s1's stored state: open, remembered and held turns; held alone."""
    st = SessionState.from_obj(store.get("s:org\ts1"), "org")
    return len(st.turns) + len(st.done) + len(st.held), len(st.held)


def test_a_batch_stops_for_a_commit_before_a_sessions_held_tombstones_pass_its_limits() -> None:
    """One batch spanning many tombstone lifetimes (a worker catching up on a backlog) moves each turn the
    session finalises aside until the commit passes it. Fed as the worker feeds it, the batch stops once the
    session holds its limits' worth, and goes on from the commit: the stored state stays within the
    stored factor, and the outputs are those of the records fed one at a time."""
    cfg = dataclasses.replace(CFG, max_turn_span_ms=60_000, tombstone_ms=60_000, dedup_ms=60_000)
    records, limit = _backlog(cfg), stored_factor(cfg) * cfg.max_session_turns

    whole = EncodedStore(check=False)  # without stops: every turn finalised in the batch is held
    PartitionProcessor(cfg, list(SPECS), whole, TOPIC, 0).process_batch(records, 0, committed=0)
    assert _stored(whole)[1] > limit

    store = EncodedStore(check=False)
    proc, total, committed, rest, stops = PartitionProcessor(cfg, list(SPECS), store, TOPIC, 0), Outputs(), 0, records, 0
    while rest:
        total.extend(proc.process_batch(rest, 0, committed=committed, until_commit=True))
        stored, held = _stored(store)
        assert stored <= limit and held <= cfg.max_session_turns, (rest[0][2], stored, held)
        committed, rest = rest[proc.consumed - 1][2] + 1, rest[proc.consumed:]
        stops += bool(rest)
    assert stops >= 5

    one = Broker(cfg)
    for value, headers, _, at in records:
        one.record(value, headers, at)
    assert total.counts() == one.total.counts()
    assert [r["reward_id"] for r in total.rewards] == [r["reward_id"] for r in one.total.rewards]
    assert [w["window_id"] for w in total.windows] == [w["window_id"] for w in one.total.windows]


def test_two_sessions_turns_sharing_a_request_id_both_reach_their_windows() -> None:
    """Request ids should be unique, but a partition does not rely on it: one session's turn settling
    leaves the windows another session's turn of the same request id still needs open."""
    b = Broker()
    b.send(T0 + 130_000, *turn("r1", "s1", T0, horizons=HZ))  # settles first
    late_edit = T0 + 300_000
    b.send(T0 + 130_000, ev("InferenceServed", "r1", "s2", T0 + 1))
    b.send(late_edit, ev("AgentEdit", "r1", "s2", late_edit, edit_id="ed2"))
    for h in HZ:
        at = late_edit + h * 1000
        b.send(at, ev("PersistenceCheck", "r1", "s2", at, edit_id="ed2", horizon_s=h, survival_score=0.9))
    b.tick(T0 + 900_000, T0 + 900_000)
    finals = [r for r in b.total.rewards if not r["provisional"]]
    assert {r["session_id"] for r in finals} == {"s1", "s2"}
    assert len({r["reward_id"] for r in finals}) == len(finals)  # so the rewards table keeps both
    for spec in {r["spec_version"] for r in finals}:
        windows = [w for w in b.total.windows if w["spec_version"] == spec]
        assert sum(w["samples"] for w in windows) == 2, spec  # both turns, neither lost to a closed window


# ---------------------------------------------------------------------------- processing failures
def _raising_on(monkeypatch: pytest.MonkeyPatch, request_id: str) -> None:
    real = PartitionProcessor._apply

    def apply(self: PartitionProcessor, st: Any, ev_: Any, *args: Any) -> None:
        if ev_.request_id == request_id:
            raise RuntimeError("boom")
        real(self, st, ev_, *args)

    monkeypatch.setattr(PartitionProcessor, "_apply", apply)


def test_a_record_that_makes_the_core_raise_is_dead_lettered_and_leaves_state_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    honest = turn("r1", "s1", T0, horizons=HZ)
    poison = [ev("InferenceServed", "ok-part", "s1", T0 + 5), ev("ToolCall", "poison", "s1", T0 + 6)]

    def run(with_poison: bool) -> Broker:
        b = Broker()
        records: list[tuple[bytes | None, Any, int, int | None]] = [
            (encode_json(honest[:2]), JSON_H, 0, T0),
            *([(encode_json(poison), JSON_H, 1, T0)] if with_poison else []),
            (encode_json(honest[2:]), JSON_H, 2, T0 + 200_000),
            (signed_tick(KEY, TOPIC, 2**62), TICK_HEADERS, 3, T0 + 10**7),
        ]
        b.total.extend(b.proc.process_batch(records, 0))  # one batch: the failure rolls the whole batch back
        return b

    clean = run(False)
    _raising_on(monkeypatch, "poison")
    hit = run(True)
    assert [(d["source_offset"], d["reason_code"]) for d in hit.total.dead] == [(1, "processing_error")]
    assert "RuntimeError: boom" in hit.total.dead[0]["reason"]
    assert hit.finals() == clean.finals() and len(hit.finals()) == len(SPECS)
    assert not [r for r in hit.total.valid if r["request_id"] == "ok-part"]  # nothing of the failed record stays
    assert hit.store.data == clean.store.data  # (the failed record's events left no trace in any session)


def test_over_a_store_that_cannot_roll_back_the_exception_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    _raising_on(monkeypatch, "poison")
    b = Broker(store=DictStore())
    with pytest.raises(RuntimeError):
        b.send(T0, ev("ToolCall", "poison", "s1", T0))


def test_a_turn_whose_scoring_raises_is_excluded_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import rewardflow.core.settle as settle

    real = settle.score

    def score(o: Any, spec: Any, h: str) -> Any:
        if o.request_id == "bad":
            raise ZeroDivisionError("weights")
        return real(o, spec, h)

    monkeypatch.setattr(settle, "score", score)
    b = Broker()
    b.send(T0, *turn("bad", "s1", T0, horizons=HZ))
    b.send(T0, *turn("good", "s2", T0, horizons=HZ))
    b.tick(2**62, T0 + 10**7)
    assert {k[1] for k in b.finals()} == {"good"}
    (x,) = [x for x in b.total.excluded if x["request_id"] == "bad"]
    assert x["reason"] == "scoring_error" and "ZeroDivisionError" in orjson.loads(x["payload"])["error"]


# ---------------------------------------------------------------------------- the property
def honest_stream(rng: random.Random, sessions: int) -> list[tuple[int, list[dict[str, Any]]]]:
    """(broker time, events) records of honest sessions: each turn's events in time order, one
    session's events per record, each record sent at (or after) its events' time."""
    events = []
    for s in range(sessions):
        for t in range(rng.randint(1, 2)):
            events += turn(f"h{s}-{t}", f"hs{s}", T0 + rng.randrange(0, 60_000) + t * 5_000, horizons=HZ,
                           survival=rng.choice([0.2, 0.9]))
    events.sort(key=lambda e: e["ts"])
    records: list[tuple[int, list[dict[str, Any]]]] = []
    for e in events:
        if records and records[-1][1][-1]["session_id"] == e["session_id"] and rng.random() < 0.5:
            records[-1][1].append(e)
        else:
            records.append((e["ts"], [e]))
    return [(max(x["ts"] for x in evs), evs) for _, evs in records]


def hostile_record(rng: random.Random, at: int, i: int, victim: str) -> tuple[bytes | None, Any]:
    """One record of a hostile or broken producer, sent at broker time ``at``."""
    kind = rng.choice(["future", "within_skew", "forged_tick", "forged_max", "mixed", "empty", "flood", "poison",
                       "stale", "wrong_key_tick"])
    if kind == "future":
        return encode_json([ev("InferenceServed", f"x{i}", "evil", at + SKEW + rng.randint(1, 10**12))]), JSON_H
    if kind == "within_skew":  # allowed: it may move the watermark by up to the skew, never more
        return encode_json([ev("FollowUp", f"x{i}", "evil", at + rng.randint(0, SKEW))]), JSON_H
    if kind == "forged_tick":
        return orjson.dumps({"wm": at + rng.randint(1, 10**12)}), TICK_HEADERS
    if kind == "forged_max":
        return orjson.dumps({"wm": 18_446_744_073_709_551_615}), TICK_HEADERS
    if kind == "wrong_key_tick":
        return signed_tick(b"stolen-or-guessed", TOPIC, at + 10**9), TICK_HEADERS
    if kind == "mixed":  # an event aimed at an honest session, smuggled beside one of the attacker's
        victim_session = "hs" + victim[1:].split("-")[0]
        return encode_json([ev("FollowUp", f"x{i}", "evil", at),
                            ev("UserAction", victim, victim_session, at, action="revert")]), JSON_H
    if kind == "empty":
        return rng.choice([b"[]", b'{"events": []}']), JSON_H
    if kind == "flood":
        return encode_json([ev("InferenceServed", f"x{i}-{k}", "flood", at) for k in range(8)]), JSON_H
    if kind == "stale":
        return encode_json([ev("InferenceServed", f"x{i}", "evil", T0 - 10**9)]), JSON_H
    return encode_json([ev("ToolCall", "poison", "evil", at)]), JSON_H


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), hostile=st.integers(1, 12), batch=st.integers(1, 5))
def test_hostile_records_never_change_an_honest_sessions_rewards(
        monkeypatch: pytest.MonkeyPatch, seed: int, hostile: int, batch: int) -> None:
    rng = random.Random(seed)
    honest = honest_stream(rng, rng.randint(2, 5))
    victims = sorted({e["request_id"] for _, evs in honest for e in evs})
    mixed: list[tuple[int, bytes | None, Any]] = [(at, encode_json(evs), JSON_H) for at, evs in honest]
    for i in range(hostile):
        pos = rng.randrange(len(mixed) + 1)
        at = mixed[pos - 1][0] if pos else T0
        mixed.insert(pos, (at, *hostile_record(rng, at, i, rng.choice(victims))))
    _raising_on(monkeypatch, "poison")

    def finals(records: list[tuple[int, bytes | None, Any]]) -> dict[Any, Any]:
        b = Broker()
        end = max(at for at, _, _ in records) + 10**7
        recs = [(v, h, o, at) for o, (at, v, h) in enumerate(records)]
        recs.append((signed_tick(KEY, TOPIC, 2**62), TICK_HEADERS, len(recs), end))
        for k in range(0, len(recs), batch):
            b.total.extend(b.proc.process_batch(recs[k:k + batch], 0))
        return {k: v for k, v in b.finals().items() if v["session_id"].startswith("hs")}

    want = finals([(at, encode_json(evs), JSON_H) for at, evs in honest])
    got = finals(mixed)
    assert got == want and len(want) == len(victims) * len(SPECS)


@pytest.mark.parametrize("field", ["event_id", "session_id", "request_id", "org_id", "edit_id"])
@pytest.mark.parametrize("char", ["\x01", '"', "\\", "\u00e9", "\U0001f600"])
def test_an_id_that_json_or_utf8_writes_wider_than_a_byte_a_character_is_dead_lettered_naming_it(
        field: str, char: str) -> None:
    """Ids reach the session state; one that JSON escapes (up to six bytes a character) or UTF-8 widens
    (up to four) would let a session outgrow the changelog record its limits are sized for, and the
    worker could not store it. Such an event is refused alone, and nothing of it is kept."""
    b = Broker()
    assert b.send(T0, ev("InferenceServed", "r1", "s1", T0)).valid
    hostile = {**ev("AgentEdit", "r1", "s1", T0 + 1), field: "x" * 60 + char}
    out = b.send(T0 + 1, hostile)
    assert codes(out) == ["invalid_event"] and not out.valid
    assert out.dead[0]["reason"].startswith(f"event[0].{field}: String should match pattern")
    assert all("x" * 60 not in key and b"x" * 60 not in value for key, value in b.store.data.items())


def test_a_session_whose_turns_are_corrected_many_times_still_fits_the_bound() -> None:
    """The worst case for corrections: every turn corrected again and again before any commit, so each
    tombstone keeps its earlier revisions' outcomes (at most KEEP_REVISIONS - 1) for a restart."""
    from rewardflow.core.corrections import KEEP_REVISIONS

    long_id, short, free = "x" * 128, "y" * 64, WIDEST_FREE * 128
    cfg = JoinConfig(horizons_s=HZ, grace_ms=2_000, lateness_ms=500, window_sizes_s=(60,),
                     max_session_turns=40, max_session_events=400, correction_ms=3_600_000)

    ids = iter(range(10**6))

    def event(kind: str, rid: int, ts: int, **f: Any) -> dict[str, Any]:
        return ev(kind, f"{rid:04d}" + long_id[4:], long_id, ts, event_id=f"{next(ids):06d}" + short[6:], org_id=long_id,
                  producer={"name": free[:64], "version": free[:64]}, **f)

    store = EncodedStore(check=False)
    proc = PartitionProcessor(cfg, list(SPECS), store, TOPIC, 0)
    served = [event("InferenceServed", rid, T0 + rid, checkpoint_id=long_id, experiment_arm=short, ttft_ms=2**31 - 1,
                    latency_ms=2**31 - 1, prompt_tokens=2**31 - 1, completion_tokens=2**31 - 1)
              for rid in range(cfg.max_session_turns)]
    proc.process(encode_json(served), JSON_H, 0, 0)
    proc.process(orjson.dumps({"wm": T0 + 200_000}), TICK_HEADERS, 1, 0)  # every turn final
    per_turn = (cfg.max_session_events - cfg.max_session_turns) // cfg.max_session_turns
    at = T0 + 200_000
    records = []
    for k in range(per_turn):  # round after round of corrections, each turn's a tool call more
        batch = [event("ToolCall", rid, at := at + 1, call_id=long_id, tool=free, status="broken", duration_ms=2**31 - 1,
                       error_kind=free) for rid in range(cfg.max_session_turns)]
        records.append((encode_json(batch), JSON_H, 2 + k))
    out = proc.process_batch(records, 0)  # no commit known: earlier revisions are kept for a restart
    assert not out.dead and {r["revision"] for r in out.rewards} == set(range(1, per_turn + 1))
    tombs = orjson.loads(store.data["s:" + session_key(long_id, long_id)])[4]
    assert all(len(t[9]) == min(per_turn, KEEP_REVISIONS) for t in tombs.values())
    bound = cfg.max_session_turns * TURN_BYTES + cfg.max_session_events * EVENT_BYTES
    largest = len(store.data["s:" + session_key(long_id, long_id)])
    assert largest <= bound, f"{largest:,} bytes over the {bound:,} the limits promise"
