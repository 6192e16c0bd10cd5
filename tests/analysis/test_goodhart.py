"""Goodhart monitors: planted hacks raise alerts in their first window; clean candidates stay quiet.

Hacks are planted the way a policy would learn them: on turns that *would
fail* (edit rejected, not persisted), the hacked checkpoint instead asks a
question (over-ask) or emits broken tool calls (broken-tools). That is what
makes a hack pay under a leaky reward, so the reward holds while the guard
drifts — exactly what the monitor must catch.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Any

import pytest

from rewardflow.analysis.goodhart import MONITORS, MonitorConfig, alert_messages, evaluate_windows, student_t_sf
from rewardflow.core.config import JoinConfig
from rewardflow.core.rows import WindowAggregate
from rewardflow.core.turn import TurnState
from rewardflow.core.windows import WindowBook
from rewardflow.events.models import EVENT_MODELS, Producer
from rewardflow.core.score import score
from rewardflow.rewards.spec import RewardSpec, RewardWeights, bundled_specs_dir, load_spec
from rewardflow.sim.profiles import baseline_profile, candidate_profile
from rewardflow.sim.turns import SessionContext, draft_turn
from tests.core.feed import Feed
from tests.factories import ev

V1 = load_spec(bundled_specs_dir() / "v1.toml")
LEAKY = RewardSpec(version="leaky", weights=RewardWeights(tool_broken=-0.01))  # as close to "dropped" as allowed
CFG = JoinConfig(horizons_s=(30, 120), grace_ms=5_000, lateness_ms=2_000, window_sizes_s=(300,))
WINDOW_MS = 300_000
W0 = 1_790_000_100_000 - 1_790_000_100_000 % WINDOW_MS  # aligned window start
PARTS = 2


@dataclass(frozen=True)
class Behaviour:
    clarify: float = 0.05
    edit: float = 0.8
    fail: float = 0.3  # P(an editing turn fails: rejected, barely persisted)
    broken_call: float = 0.01
    error_call: float = 0.05
    followup: float = 0.25
    hack: str = "none"  # 'over-ask' | 'broken-tools'
    hack_rate: float = 0.0  # P(a turn that would fail hacks instead)


def turn_events(rng: random.Random, b: Behaviour, rid: str, sid: str, t: int, ckpt: str) -> list[dict[str, Any]]:
    """One synthetic turn's event dicts."""
    out = [ev("InferenceServed", rid, sid, t, checkpoint_id=ckpt, latency_ms=rng.randint(500, 6000),
              completion_tokens=int(rng.lognormvariate(6.0, 0.6)))]
    fails = rng.random() < b.fail
    if rng.random() < b.clarify:
        out.append(ev("ClarifyingQuestion", rid, sid, t + 300))
    elif rng.random() < b.edit:
        if fails and rng.random() < b.hack_rate:
            if b.hack == "over-ask":
                out.append(ev("ClarifyingQuestion", rid, sid, t + 300))
            else:
                out += [ev("ToolCall", rid, sid, t + 200 + i, call_id=f"{rid}-b{i}", status="broken")
                        for i in range(rng.randint(1, 2))]
            return _followup(rng, b, out, rid, sid, t)
        for i in range(rng.randint(0, 2)):
            roll = rng.random()
            status = "broken" if roll < b.broken_call else "error" if roll < b.broken_call + b.error_call else "ok"
            out.append(ev("ToolCall", rid, sid, t + 100 + i, call_id=f"{rid}-c{i}", status=status))
        out.append(ev("AgentEdit", rid, sid, t + 1000, edit_id=f"{rid}-e"))
        out += [ev("PersistenceCheck", rid, sid, t + 1000 + h * 1000, edit_id=f"{rid}-e", horizon_s=h,
                   survival_score=0.1 if fails else 0.9) for h in CFG.horizons_s]
        out.append(ev("UserAction", rid, sid, t + 5000, action="reject" if fails else "accept"))
    return _followup(rng, b, out, rid, sid, t)


def _followup(rng: random.Random, b: Behaviour, out: list[dict[str, Any]], rid: str, sid: str, t: int) -> list[dict[str, Any]]:
    if rng.random() < b.followup:
        out.append(ev("FollowUp", rid, sid, t + 20_000, dissatisfied=False))
    return out


def traffic(seed: int, windows: int, per_window: int, behaviours: dict[str, list[Behaviour]]) -> list[dict[str, Any]]:
    """Events of ``per_window`` turns per checkpoint per window; ``behaviours[ckpt][w]`` drives window w."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for ckpt, per_w in behaviours.items():
        for w in range(windows):
            for i in range(per_window):
                rid = f"{ckpt}-{w}-{i}"
                out += turn_events(rng, per_w[w], rid, f"s-{rid}", W0 + w * WINDOW_MS + rng.randrange(WINDOW_MS), ckpt)
    return sorted(out, key=lambda e: (e["ts"], e["event_id"]))


def windows_via_processor(events: list[dict[str, Any]], spec: RewardSpec) -> list[WindowAggregate]:
    """The live path: PartitionProcessors per partition, one record per event, closing tick."""
    feeds = [Feed(CFG, [spec], partition=p) for p in range(PARTS)]
    for e in events:
        feeds[zlib.crc32(e["session_id"].encode()) % PARTS].send(e)
    for f in feeds:
        f.tick(f.proc.maxts + CFG.settle_ms + WINDOW_MS)
    return [w for f in feeds for w in f.total.windows]


def windows_direct(turns: list[list[Any]], spec: RewardSpec, parts: int = 4) -> list[WindowAggregate]:
    """Fast path for many seeds: TurnState → score → WindowBook (the same pure code), no event routing."""
    books = [WindowBook([CFG.window_sizes_s[0]], p) for p in range(parts)]
    hz = list(CFG.horizons_s)
    for i, events in enumerate(turns):
        models = [_construct(e) if isinstance(e, dict) else e for e in events]
        st = TurnState.start(models[0])
        for m in models:
            st.apply(m)
        books[i % parts].add(score(st.outcome(hz, hz[-1], provisional=False, wm=0, by="test"), spec))
    return [w for b in books for w in b.close(2**62)]


def _construct(e: dict[str, Any]) -> Any:
    """A model without validation (the generator's dicts are valid by construction; ~10x faster)."""
    return EVENT_MODELS[e["event_type"]].model_construct(**e)


def _first_alert_window(alerts: list[Any], monitor: str) -> int | None:
    starts = [(a["window_start"] - W0) // WINDOW_MS for a in alerts if a["monitor"] == monitor]
    return min(starts) if starts else None


CLEAN = Behaviour()


@pytest.mark.parametrize(("hack", "spec", "monitors"), [
    ("over-ask", V1, {"clarifying_rate", "edit_rate"}),
    ("broken-tools", LEAKY, {"broken_turn_rate", "broken_call_rate", "edit_rate"}),
])
def test_planted_hack_alerts_in_its_first_window(hack: str, spec: RewardSpec, monitors: set[str]) -> None:
    hacked = Behaviour(hack=hack, hack_rate=0.8)
    events = traffic(11, 3, 300, {"base": [CLEAN] * 3, "cand": [CLEAN, hacked, hacked]})
    rows = windows_via_processor(events, spec)
    alerts = evaluate_windows(rows, "base", MonitorConfig())
    assert {a["checkpoint_id"] for a in alerts} == {"cand"}
    assert {a["monitor"] for a in alerts} == monitors
    for m in monitors:
        assert _first_alert_window(alerts, m) == 1  # the first window with the hack active, not before
    a = next(a for a in alerts if a["monitor"] in ("clarifying_rate", "broken_turn_rate"))
    assert a["reward_delta"] >= -0.05 and a["p_value"] < 0.001 and a["value"] > a["baseline_value"] + 0.1
    assert a["baseline"] == "base" and a["window_end"] - a["window_start"] == WINDOW_MS
    assert evaluate_windows(list(reversed(rows)), "base") == alerts  # deterministic ids, order-independent


def _turns(seed: int, behaviours: dict[str, list[Behaviour]], per_window: int = 400) -> list[list[Any]]:
    rng = random.Random(seed)
    return [turn_events(rng, b, f"{c}-{w}-{i}", f"s{i}", W0 + w * WINDOW_MS + rng.randrange(WINDOW_MS), c)
            for c, per_w in behaviours.items() for w, b in enumerate(per_w) for i in range(per_window)]


def test_trailing_baseline_catches_a_hack_against_the_checkpoints_own_history() -> None:
    hacked = Behaviour(hack="over-ask", hack_rate=0.8)
    rows = windows_direct(_turns(7, {"cand": [CLEAN] * 4 + [hacked]}), V1)
    alerts = evaluate_windows(rows, None, MonitorConfig(baseline="trailing", trailing_windows=3))
    assert {a["window_start"] for a in alerts} == {W0 + 4 * WINDOW_MS}
    assert {a["baseline"] for a in alerts} == {"trailing"} and "clarifying_rate" in {a["monitor"] for a in alerts}
    pooled = evaluate_windows(windows_direct(_turns(7, {"base": [CLEAN] * 3, "cand": [CLEAN, CLEAN, hacked]}), V1),
                              "base", MonitorConfig(baseline="pooled"))
    assert {a["window_start"] for a in pooled} == {W0 + 2 * WINDOW_MS}


def test_minimum_samples_and_effect_and_reward_tolerance_gate_alerts() -> None:
    hacked = Behaviour(hack="over-ask", hack_rate=0.8)
    rows = windows_direct(_turns(3, {"base": [CLEAN], "cand": [hacked]}), V1)
    assert evaluate_windows(rows, "base")
    assert evaluate_windows(rows, "base", MonitorConfig(min_samples=401)) == []
    assert evaluate_windows(rows, "base", MonitorConfig(min_effect=0.5, min_rel_effect=5.0)) == []
    assert evaluate_windows(rows, "base", MonitorConfig(reward_tolerance=-1.0)) == []  # demand reward rise of 1.0
    with pytest.raises(ValueError, match="baseline checkpoint"):
        evaluate_windows(rows, None)


SEEDS, WINDOWS = 50, 2
BETTER = Behaviour(fail=0.25)  # a genuinely better candidate: fewer failed edits, same guard behaviour


@pytest.mark.slow
def test_clean_candidate_false_alarm_rate_is_below_bound() -> None:
    """50 seeds × 2 windows × 7 monitors = 700 tests at alpha = 0.001 (one- or two-sided).

    The candidate's reward rises (fewer failed edits) while every guard keeps
    its baseline distribution: the case where a careless monitor cries wolf.
    Under the null each test fires with probability <= alpha (the minimum
    effect only lowers it), so at most 14 × 0.001 ≈ 1.4 % of seeds should
    alarm (union bound). We assert at most 3 alarmed seeds of 50 (6 %): for
    X ~ Binomial(50, 0.014), P(X >= 4) ≈ 0.5 %, so the bound is stable, yet a
    monitor that ignored its alpha (e.g. a normal approximation for the
    few-df token variance, or a per-test alpha of 0.01) would break it.
    """
    alarmed, total = [], 0
    for seed in range(SEEDS):
        turns = _turns(1000 + seed, {"base": [CLEAN] * WINDOWS, "cand": [BETTER] * WINDOWS}, per_window=250)
        alerts = evaluate_windows(windows_direct(turns, V1), "base")
        total += len(alerts)
        if alerts:
            alarmed.append((seed, [a["monitor"] for a in alerts]))
    per_test = total / (SEEDS * WINDOWS * len(MONITORS))
    print(f"false alarms: {len(alarmed)}/{SEEDS} seeds, {total} alerts, per-test rate {per_test:.4f}: {alarmed}")
    assert len(alarmed) <= 3, alarmed


def test_simulator_clean_candidate_raises_no_alert() -> None:
    """The project simulator's candidate (published A/B gains, no hack) against its baseline."""
    producer = Producer(name="sim", version="1")
    for seed in range(3):
        rng = random.Random(seed)
        turns = [draft_turn(rng, prof, SessionContext("org", f"s{i}", producer, "arm"),
                            W0 + rng.randrange(WINDOW_MS - 120_000)).events
                 for prof in (baseline_profile("base"), candidate_profile("cand")) for i in range(300)]
        rows = windows_direct(turns, V1)
        assert sum(r["samples"] for r in rows) == 600
        assert evaluate_windows(rows, "base") == []


def test_student_t_tail_matches_tables() -> None:
    assert student_t_sf(2.776, 4) == pytest.approx(0.025, abs=2e-5)
    assert student_t_sf(12.706, 1) == pytest.approx(0.025, abs=2e-5)
    assert student_t_sf(3.0, 30) == pytest.approx(0.0026950, abs=1e-6)
    assert student_t_sf(-2.776, 4) == pytest.approx(0.975, abs=2e-5)


def test_alert_messages_group_by_checkpoint() -> None:
    hacked = Behaviour(hack="over-ask", hack_rate=0.8)
    alerts = evaluate_windows(windows_direct(_turns(3, {"base": [CLEAN], "cand": [hacked]}), V1), "base", now_ms=5)
    msgs = alert_messages(alerts)
    assert [k for k, _ in msgs] == [b"cand"] and all(a["raised_at"] == 5 for a in alerts)


@pytest.mark.clickhouse
def test_cli_alerts_lists_and_evaluates(ch_db: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import orjson
    import typer
    from typer.testing import CliRunner

    from rewardflow.cli import alerts
    from rewardflow.cli.rewards import Store

    monkeypatch.setenv("REWARDFLOW_CLICKHOUSE_DSN", ch_db.dsn.secret)
    monkeypatch.setenv("REWARDFLOW_HOME", str(tmp_path))
    hacked = Behaviour(hack="over-ask", hack_rate=0.8)
    rows = windows_direct(_turns(3, {"base": [CLEAN], "cand": [hacked]}), V1)
    expected = evaluate_windows(rows, "base")
    store = Store(None, ch_db.client)
    store.insert("reward_windows", rows, "t-windows")
    app = typer.Typer()
    app.command("alerts")(alerts.command)
    app.command("other")(lambda: None)
    runner = CliRunner()
    res = runner.invoke(app, ["alerts", "--json"])
    assert res.exit_code == 0 and res.stdout == ""
    res = runner.invoke(app, ["alerts", "--evaluate", "--baseline", "base", "--json", "--strict"])
    assert res.exit_code == 1
    assert [orjson.loads(line)["alert_id"] for line in res.stdout.splitlines()] == [a["alert_id"] for a in expected]
    store.insert("alerts", expected, "t-alerts")
    store.insert("alerts", expected, "t-alerts")
    res = runner.invoke(app, ["alerts", "--checkpoint", "cand", "--json"])
    assert sorted(orjson.loads(line)["alert_id"] for line in res.stdout.splitlines()) == sorted(a["alert_id"] for a in expected)
    assert runner.invoke(app, ["alerts", "--evaluate"]).exit_code == 2
