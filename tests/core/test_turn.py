"""TurnState: order-independent accumulation of a turn's events, and its TurnOutcome."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardflow.core.config import JSON_OPTS
from rewardflow.core.turn import _COUNTERS, TurnOutcome, TurnState, outcome_from_obj, outcome_to_obj
from rewardflow.events.validate import validate_event
from rewardflow.core.score import score
from rewardflow.rewards.spec import RewardSpec
from tests.factories import T0, ev, turn

HZ = [30, 120]
SPEC = RewardSpec(version="t1")


def fold(raws: list[dict[str, Any]]) -> TurnState:
    events = [validate_event(r) for r in raws]
    state = TurnState.start(events[0])
    for e in events:
        state.apply(e)
    return state


def final(state: TurnState, horizons: list[int] = HZ) -> Any:
    return state.outcome(horizons, horizons[-1], provisional=False, wm=T0 + 10**6, by="watermark")


def test_complete_turn_outcome() -> None:
    raws = turn("r1", horizons=(30, 120), survival=0.9) + [
        ev("ToolCall", "r1", ts=T0 + 10, status="broken", call_id="c2"),
        ev("ToolCall", "r1", ts=T0 + 11, status="error", call_id="c3"),
        ev("FollowUp", "r1", ts=T0 + 3000, dissatisfied=True),
        ev("FollowUp", "r1", ts=T0 + 3001, dissatisfied=None),
        ev("ClarifyingQuestion", "r1", ts=T0 + 20),
    ]
    o = final(fold(raws))
    assert (o.checkpoint_id, o.surface, o.served_ts, o.latency_ms, o.n_edits) == ("ck-a", "agent", T0, 1000, 1)
    assert o.counts == {"tool_calls": 3, "tool_broken": 1, "tool_error": 1, "clarifying": 1,
                        "followups": 2, "dissatisfied": 1, "accept": 1}
    assert o.persistence == {30: 0.9, 120: 0.9}
    assert o.persisted == {30: 1, 120: 1} and o.checked == {30: 1, 120: 1}
    assert o.final_persistence() == 0.9
    assert not o.provisional and o.horizon_s == 120


def test_anchor_is_latest_of_served_and_edit_times() -> None:
    state = fold([ev("InferenceServed", ts=T0), ev("AgentEdit", ts=T0 + 5000, edit_id="a"),
                  ev("AgentEdit", ts=T0 + 2000, edit_id="b"), ev("FollowUp", ts=T0 + 90_000)])
    assert state.anchor() == T0 + 5000  # follow-ups do not move it
    orphan = fold([ev("FollowUp", ts=T0 + 7)])
    assert orphan.anchor() == T0 + 7


def test_first_served_wins_and_resent_edit_keeps_its_earliest_time() -> None:
    state = fold([
        ev("InferenceServed", ts=T0 + 100, checkpoint_id="late-ck", event_id="b"),
        ev("InferenceServed", ts=T0, checkpoint_id="first-ck", event_id="z"),
        ev("AgentEdit", ts=T0 + 9000, edit_id="x"),
        ev("AgentEdit", ts=T0 + 1000, edit_id="x"),
    ])
    assert state.served is not None and state.served["checkpoint_id"] == "first-ck"
    assert state.edits == {"x": T0 + 1000} and state.anchor() == T0 + 1000


def test_latest_check_per_edit_and_horizon_wins_and_unknown_edits_are_ignored() -> None:
    o = final(fold([
        ev("InferenceServed"),
        ev("AgentEdit", ts=T0 + 1, edit_id="a"),
        ev("AgentEdit", ts=T0 + 1, edit_id="b"),
        ev("PersistenceCheck", ts=T0 + 30_000, edit_id="a", horizon_s=30, survival_score=1.0),
        ev("PersistenceCheck", ts=T0 + 31_000, edit_id="a", horizon_s=30, survival_score=0.2),  # newer: wins
        ev("PersistenceCheck", ts=T0 + 30_000, edit_id="b", horizon_s=30, survival_score=0.5),
        ev("PersistenceCheck", ts=T0 + 120_000, edit_id="b", horizon_s=120, survival_score=0.4),
        ev("PersistenceCheck", ts=T0 + 120_000, edit_id="ghost", horizon_s=120, survival_score=1.0),
        ev("PersistenceCheck", ts=T0 + 60_000, edit_id="a", horizon_s=60, survival_score=1.0),  # not configured
    ]))
    assert o.checked == {30: 2, 120: 1}
    assert o.persisted == {30: 1, 120: 0}  # 0.5 persists (>= threshold), 0.2 and 0.4 do not
    assert o.persistence[30] == pytest.approx(0.35) and o.persistence[120] == pytest.approx(0.4)
    assert o.final_persistence() == pytest.approx(0.4)


def test_no_check_at_the_final_horizon_means_no_persistence_not_zero() -> None:
    o = final(fold([ev("InferenceServed"), ev("AgentEdit", ts=T0 + 1, edit_id="a"),
                    ev("PersistenceCheck", ts=T0 + 30_000, edit_id="a", horizon_s=30, survival_score=0.0)]))
    assert o.checked == {30: 1} and o.final_persistence() is None


def test_provisional_outcome_covers_only_reached_horizons() -> None:
    state = fold(turn("r1", horizons=(30, 120)))
    o = state.outcome(HZ, 30, provisional=True, wm=T0, by="watermark")
    assert o.provisional and o.horizon_s == 30 and set(o.checked) == {30}


def test_orphan_turn_has_no_outcome() -> None:
    with pytest.raises(AssertionError):
        final(fold([ev("FollowUp")]))


def test_state_and_outcome_round_trip_through_json() -> None:
    state = fold(turn("r1", horizons=(30, 120)) + [ev("ToolCall", "r1", status="broken")])
    state.provisional_h = 30
    back = TurnState.from_obj(orjson.loads(orjson.dumps(state.to_obj(), option=JSON_OPTS)))
    assert back == state
    o = final(state)
    assert outcome_from_obj(orjson.loads(orjson.dumps(outcome_to_obj(o)))) == o


# ---------------------------------------------------------------- order independence

def test_mean_persistence_does_not_depend_on_check_arrival_order() -> None:
    """(0.1 + 0.2) + 0.3 != 0.1 + (0.2 + 0.3) in floats; a plain running sum would differ by arrival."""
    served = ev("InferenceServed")
    edits = [ev("AgentEdit", ts=T0 + 1, edit_id=e) for e in "abc"]
    checks = [ev("PersistenceCheck", ts=T0 + 30_000, edit_id=e, horizon_s=30, survival_score=x)
              for e, x in zip("abc", (0.1, 0.2, 0.3), strict=True)]
    forward = final(fold([served, *edits, *checks]), [30])
    backward = final(fold([served, *edits, *reversed(checks)]), [30])
    assert forward == backward
    assert forward.persistence[30] == 0.6 / 3



@st.composite
def turn_events(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A turn's events with awkward cases: two served, resent edits, repeated and stray checks."""
    t = T0 + draw(st.integers(0, 5000))
    out: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 2))):
        out.append(ev("InferenceServed", ts=t + draw(st.integers(0, 3)), event_id=f"srv{i}",
                      checkpoint_id=f"ck{i}", latency_ms=draw(st.integers(100, 5000))))
    edits = [f"ed{i}" for i in range(draw(st.integers(0, 3)))]
    for e in edits:
        for j in range(draw(st.integers(1, 2))):
            out.append(ev("AgentEdit", ts=t + draw(st.integers(0, 4000)), edit_id=e, event_id=f"{e}-{j}"))
    for k in range(draw(st.integers(0, 6))):
        out.append(ev("PersistenceCheck", ts=t + draw(st.integers(0, 130_000)), event_id=f"chk{k}",
                      edit_id=draw(st.sampled_from([*edits, "stray"])), horizon_s=draw(st.sampled_from(HZ)),
                      survival_score=draw(st.floats(0, 1))))
    for k in range(draw(st.integers(0, 4))):
        out.append(ev("ToolCall", ts=t + k, event_id=f"tool{k}", status=draw(st.sampled_from(["ok", "error", "broken"]))))
    for k in range(draw(st.integers(0, 3))):
        out.append(ev("UserAction", ts=t + k, event_id=f"ua{k}", action=draw(st.sampled_from(["accept", "reject", "undo", "revert"]))))
    for k in range(draw(st.integers(0, 3))):
        out.append(ev("FollowUp", ts=t + k, event_id=f"fu{k}", dissatisfied=draw(st.sampled_from([True, False, None]))))
    for k in range(draw(st.integers(0, 2))):
        out.append(ev("ClarifyingQuestion", ts=t + k, event_id=f"cq{k}"))
    return out


@settings(max_examples=80, deadline=None)
@given(data=st.data(), raws=turn_events())
def test_any_arrival_order_gives_the_same_outcome_and_reward(data: st.DataObject, raws: list[dict[str, Any]]) -> None:
    reference = fold(raws)
    shuffled = fold(data.draw(st.permutations(raws)))
    assert shuffled.anchor() == reference.anchor()
    assert final(shuffled) == final(reference)
    assert score(final(shuffled), SPEC) == score(final(reference), SPEC)
    assert shuffled.outcome(HZ, 30, provisional=True, wm=0, by="x") == reference.outcome(HZ, 30, provisional=True, wm=0, by="x")


# ---------------------------------------------------------------- the fast paths agree with the plain definition

def _reference_fold(raws: list[dict[str, Any]]) -> tuple[list[Any], Any]:
    """The plain definition of fold + outcome (isinstance dispatch, tuple comparisons), as JSON objects."""
    from rewardflow.events.models import (AgentEdit, ClarifyingQuestion, FollowUp, InferenceServed, PersistenceCheck,
                                          ToolCall, UserAction)

    events = [validate_event(r) for r in raws]
    first_ts, served, edits, checks, c = events[0].ts, None, {}, {}, {}  # type: ignore[var-annotated]
    for e in events:
        first_ts = min(first_ts, e.ts)
        if isinstance(e, InferenceServed):
            cand = {"ts": e.ts, "event_id": e.event_id, "checkpoint_id": e.checkpoint_id,
                    "experiment_arm": e.experiment_arm, "surface": e.surface, "latency_ms": e.latency_ms,
                    "ttft_ms": e.ttft_ms, "prompt_tokens": e.prompt_tokens, "completion_tokens": e.completion_tokens}
            if served is None or (e.ts, e.event_id) < (served["ts"], served["event_id"]):
                served = cand
        elif isinstance(e, AgentEdit):
            edits[e.edit_id] = min(edits.get(e.edit_id, e.ts), e.ts)
        elif isinstance(e, PersistenceCheck):
            by_h = checks.setdefault(e.edit_id, {})
            cur = by_h.get(e.horizon_s)
            if cur is None or (e.ts, e.event_id) > (cur[0], cur[1]):
                by_h[e.horizon_s] = [e.ts, e.event_id, e.survival_score]
        elif isinstance(e, ToolCall):
            c["tool_calls"] = c.get("tool_calls", 0) + 1
            if e.status != "ok":
                key = "tool_broken" if e.status == "broken" else "tool_error"
                c[key] = c.get(key, 0) + 1
        elif isinstance(e, UserAction):
            c[e.action] = c.get(e.action, 0) + 1
        elif isinstance(e, FollowUp):
            c["followups"] = c.get("followups", 0) + 1
            if e.dissatisfied:
                c["dissatisfied"] = c.get("dissatisfied", 0) + 1
        elif isinstance(e, ClarifyingQuestion):
            c["clarifying"] = c.get("clarifying", 0) + 1
    head = events[0]
    state = [head.request_id, head.session_id, head.org_id, first_ts, served, edits,
             {e: {str(h): v for h, v in hs.items()} for e, hs in checks.items()}, c, 0, len(events)]
    if served is None:
        return state, None
    maps: dict[str, dict[str, Any]] = {"persistence": {}, "persisted": {}, "checked": {}}
    for h in HZ:
        scores = [by_h[h][2] for e, by_h in checks.items() if e in edits and h in by_h]
        if scores:
            maps["checked"][str(h)] = len(scores)
            maps["persisted"][str(h)] = sum(1 for x in scores if x >= 0.5)
            maps["persistence"][str(h)] = math.fsum(scores) / len(scores)
    outcome = {
        "request_id": head.request_id, "session_id": head.session_id, "org_id": head.org_id,
        "checkpoint_id": served["checkpoint_id"], "experiment_arm": served["experiment_arm"],
        "surface": served["surface"], "served_ts": served["ts"], "latency_ms": served["latency_ms"],
        "ttft_ms": served["ttft_ms"], "prompt_tokens": served["prompt_tokens"],
        "completion_tokens": served["completion_tokens"], "n_edits": len(edits),
        "counts": {k: c[k] for k in _COUNTERS if c.get(k)}, **maps,
        "horizon_s": HZ[-1], "provisional": False, "finalised_wm": T0 + 10**6, "finalised_by": "watermark",
    }
    return state, outcome


@settings(max_examples=80, deadline=None)
@given(data=st.data(), raws=turn_events())
def test_state_and_outcome_objects_equal_the_plain_definition_byte_for_byte(
        data: st.DataObject, raws: list[dict[str, Any]]) -> None:
    """Stored state is hashed and compared as JSON (written with JSON_OPTS): key order and number types must match, not just values."""
    raws = data.draw(st.permutations(raws))
    state = fold(raws)
    ref_state, ref_outcome = _reference_fold(raws)
    assert orjson.dumps(state.to_obj(), option=JSON_OPTS) == orjson.dumps(ref_state, option=JSON_OPTS)
    if ref_outcome is not None:
        assert orjson.dumps(outcome_to_obj(final(state))) == orjson.dumps(ref_outcome)


def test_ties_on_event_time_are_broken_by_event_id_in_any_order() -> None:
    raws = [ev("InferenceServed", ts=T0, event_id="s-b", checkpoint_id="b"),
            ev("InferenceServed", ts=T0, event_id="s-a", checkpoint_id="a"),  # same ts, smaller id: the first served
            ev("AgentEdit", ts=T0 + 5, edit_id="x"),
            ev("PersistenceCheck", ts=T0 + 30_000, event_id="c-a", edit_id="x", horizon_s=30, survival_score=0.1),
            ev("PersistenceCheck", ts=T0 + 30_000, event_id="c-b", edit_id="x", horizon_s=30, survival_score=0.8)]
    for order in (raws, raws[::-1]):
        state = fold(order)
        assert state.served is not None and state.served["checkpoint_id"] == "a"
        assert state.checks == {"x": {30: [T0 + 30_000, "c-b", 0.8]}}  # same ts, larger id: the latest check


def test_a_subclassed_event_folds_like_its_base() -> None:
    from rewardflow.events.models import PersistenceCheck, ToolCall

    class AuditedCheck(PersistenceCheck):
        pass

    class AuditedTool(ToolCall):
        pass

    state = fold([ev("InferenceServed"), ev("AgentEdit", ts=T0 + 1, edit_id="a")])
    state.apply(AuditedCheck.model_validate(ev("PersistenceCheck", ts=T0 + 30_000, edit_id="a", survival_score=0.7)))
    state.apply(AuditedTool.model_validate(ev("ToolCall", status="broken")))
    assert state.checks["a"][30][2] == 0.7 and state.counts == {"tool_calls": 1, "tool_broken": 1}


def test_outcome_object_keeps_the_field_order_and_string_horizon_keys() -> None:
    o = final(fold(turn("r1", horizons=(30, 120))))
    obj = outcome_to_obj(o)
    assert list(obj) == [f.name for f in dataclasses.fields(TurnOutcome)]
    assert obj["checked"] == {"30": 1, "120": 1} and obj["counts"] is o.counts
    assert outcome_to_obj(final(fold([ev("InferenceServed")])))["persistence"] == {}
