"""settle_turns: a session's due turns become final rewards or orphans, the others provisional rewards."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rewardflow.core.config import JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.session import SessionState
from rewardflow.core.settle import settle_turns
from rewardflow.core.turn import TurnState
from rewardflow.events.validate import validate_event
from rewardflow.rewards.spec import RewardSpec
from tests.factories import T0, ev, turn

CFG = JoinConfig(horizons_s=(30, 120), grace_ms=1_000)
SPECS = [RewardSpec(version="a"), RewardSpec(version="b")]
SCORED = [(s, s.content_hash) for s in SPECS]


def session(*turns: list[dict[str, Any]]) -> SessionState:
    st = SessionState("s1", 0, org_id="org")
    for raws in turns:
        for raw in raws:
            e = validate_event(raw)
            t = st.turns.get(e.request_id)
            if t is None:
                t = st.turns[e.request_id] = TurnState.start(e)
            t.apply(e)
    return st


def settle(st: SessionState, wm: int, cfg: JoinConfig = CFG, by: str = "watermark") -> tuple[Outputs, list[Any], list[str]]:
    out = Outputs()
    finals, finalised = settle_turns(st, cfg, wm, 7, by, SCORED, 0, out)
    return out, finals, finalised


def test_a_due_served_turn_becomes_one_final_reward_a_spec_and_a_tombstone() -> None:
    st = session(turn("r1", horizons=(30, 120)))
    due = st.turns["r1"].anchor() + CFG.settle_ms
    out, finals, finalised = settle(st, due, by="idle")
    assert finalised == ["r1"] and "r1" not in st.turns
    assert [(r["spec_version"], r["provisional"], r["horizon_s"]) for r in out.rewards] == [("a", 0, 120), ("b", 0, 120)]
    assert {(r["finalised_wm"], r["finalised_by"]) for r in out.rewards} == {(due, "idle")}
    assert finals == out.rewards and not out.excluded
    tomb = st.done["r1"]
    assert (tomb.wm, tomb.offset, tomb.served_ts, tomb.orphan) == (due, 7, T0, None) and tomb.outcome is not None


def test_a_turn_is_not_due_a_millisecond_before_its_deadline() -> None:
    st = session(turn("r1", horizons=(30, 120)))
    out, finals, finalised = settle(st, st.turns["r1"].anchor() + CFG.settle_ms - 1)
    assert finalised == [] and finals == [] and "r1" in st.turns and not st.done
    assert [(r["provisional"], r["horizon_s"]) for r in out.rewards] == [(1, 30), (1, 30)]


def test_a_due_turn_never_served_is_an_orphan_with_a_tombstone_without_outcome() -> None:
    st = session([ev("AgentEdit", "r2", ts=T0), ev("FollowUp", "r2", ts=T0 + 10)])
    out, finals, finalised = settle(st, st.turns["r2"].anchor() + CFG.settle_ms)
    assert finalised == ["r2"] and finals == [] and out.rewards == []
    (x,) = out.excluded
    assert x["request_id"] == "r2" and x["reason"] == "orphan"
    assert st.done["r2"].outcome is None and st.done["r2"].served_ts == -1


def test_provisional_rewards_come_once_a_horizon_with_its_grace() -> None:
    st = session(turn("r1", horizons=(30, 120)))
    at_30 = st.turns["r1"].anchor() + 30_000 + CFG.grace_ms
    assert settle(st, at_30 - 1)[0].rewards == []
    out = settle(st, at_30)[0]
    assert [(r["provisional"], r["horizon_s"]) for r in out.rewards] == [(1, 30), (1, 30)]
    assert settle(st, at_30 + 5)[0].rewards == []  # the same horizon again: nothing new
    off = JoinConfig(horizons_s=(30, 120), grace_ms=1_000, provisional=False)
    assert settle(session(turn("r1", horizons=(30, 120))), at_30, off)[0].rewards == []


def test_only_the_due_turns_of_a_session_settle_in_its_order() -> None:
    st = session(turn("late", ts=T0 + 600_000, horizons=(30, 120)), turn("early", horizons=(30, 120)),
                 turn("mid", ts=T0 + 1_000, horizons=(30, 120)))
    out, _, finalised = settle(st, st.turns["mid"].anchor() + CFG.settle_ms)
    assert finalised == ["early", "mid"] and list(st.turns) == ["late"]
    assert [r["sample_id"] for r in out.rewards if not r["provisional"]] == ["early", "early", "mid", "mid"]


def test_a_turn_whose_scoring_raises_is_an_orphan_naming_the_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    import rewardflow.core.settle as settle_module

    def broken(*_: Any) -> Any:
        raise ZeroDivisionError("weights")

    monkeypatch.setattr(settle_module, "score", broken)
    st = session(turn("r1", horizons=(30, 120)))
    out, finals, finalised = settle(st, st.turns["r1"].anchor() + CFG.settle_ms)
    assert finalised == ["r1"] and finals == [] and out.rewards == []
    (x,) = out.excluded
    assert x["reason"] == "scoring_error" and "ZeroDivisionError: weights" in orjson.loads(x["payload"])["error"]
