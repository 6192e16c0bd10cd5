"""Replay from stored events: same code as the stream, deterministic, diffable."""

from __future__ import annotations

import random
import zlib
from collections import Counter
from typing import Any

import orjson
import pytest

from rewardflow.core.config import JoinConfig
from rewardflow.core.rows import EventRow, RewardRecord
from rewardflow.events.models import Producer
from rewardflow.events.validate import to_dict
from rewardflow.rewards.diff import diff_rewards, quantile
from rewardflow.rewards.replay import ReplayRange, in_range, records_by_partition, replay_events, replay_token
from rewardflow.rewards.spec import bundled_specs_dir, load_spec
from rewardflow.sim.profiles import baseline_profile
from rewardflow.sim.turns import SessionContext, draft_turn
from tests.core.feed import Feed
from tests.factories import T0, ev, turn

CFG = JoinConfig()
V1 = load_spec(bundled_specs_dir() / "v1.toml")
V2 = load_spec(bundled_specs_dir() / "v2.toml")
PARTITIONS = 2
FLIPPERS = 7  # planted turns that ask a question and barely score above zero under v1


def _flipper(i: int) -> list[dict[str, Any]]:
    """Served, one edit surviving at 0.15 everywhere, one question: v1 ≈ +0.13, v2 ≈ -0.12."""
    rid, sid, t = f"flip-{i}", f"sflip-{i}", T0 + 40_000 * i
    out = [ev("InferenceServed", rid, sid, t), ev("AgentEdit", rid, sid, t + 500, edit_id=f"{rid}-e"),
           ev("ClarifyingQuestion", rid, sid, t + 800)]
    out += [ev("PersistenceCheck", rid, sid, t + 500 + h * 1000, edit_id=f"{rid}-e", horizon_s=h, survival_score=0.15)
            for h in CFG.horizons_s]
    return out


def _stream_events(seed: int = 3, sessions: int = 40) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    profile = baseline_profile("ck-base").model_copy(update={"clarifying_rate": 0.2})
    events: list[dict[str, Any]] = []
    for s in range(sessions):
        ctx = SessionContext("org", f"sess-{s}", Producer(name="sim", version="1"), "control")
        t = T0 + rng.randint(0, 600_000)
        for _ in range(rng.randint(1, 4)):
            draft = draft_turn(rng, profile, ctx, t)
            events += [to_dict(e) for e in draft.events]
            t = draft.end_ms + rng.randint(5_000, 60_000)
    for i in range(FLIPPERS):
        events += _flipper(i)
    return sorted(events, key=lambda e: (e["ts"], e["event_id"]))


def _run_stream(events: list[dict[str, Any]]) -> tuple[list[EventRow], list[RewardRecord]]:
    """The live path: one record per event, partition by session, then a closing tick."""
    feeds = [Feed(CFG, [V1], partition=p) for p in range(PARTITIONS)]
    for e in events:
        feeds[zlib.crc32(e["session_id"].encode()) % PARTITIONS].send(e)
    for f in feeds:
        f.tick(f.proc.maxts + CFG.settle_ms)
    return [r for f in feeds for r in f.total.valid], [r for f in feeds for r in f.final("v1")]


@pytest.fixture(scope="module")
def stream() -> tuple[list[EventRow], list[RewardRecord]]:
    return _run_stream(_stream_events())


def _key(r: RewardRecord) -> tuple[Any, ...]:
    return r["reward_id"], r["sample_id"], r["reward"], tuple(sorted(r["components"].items())), r["n_clarifying"]


def test_replay_under_the_stream_spec_reproduces_the_stream(stream: tuple[list[EventRow], list[RewardRecord]]) -> None:
    rows, live = stream
    assert len(live) > 100
    tally: Counter[str] = Counter()
    replayed = replay_events(rows, V1, CFG, tally=tally)
    assert sorted(map(_key, replayed)) == sorted(map(_key, live))
    assert not tally  # nothing late, duplicate or dead the second time round
    assert {r["provisional"] for r in replayed} == {0}


def test_replay_is_deterministic_and_ignores_row_order_and_redelivered_rows(
        stream: tuple[list[EventRow], list[RewardRecord]]) -> None:
    rows, _ = stream
    first = replay_events(rows, V2, CFG)
    shuffled = list(rows) + list(rows[:50])
    random.Random(1).shuffle(shuffled)
    assert replay_events(shuffled, V2, CFG) == first
    assert replay_events(rows, V2, CFG) == first


def test_new_spec_changes_exactly_the_samples_with_clarifying_questions(
        stream: tuple[list[EventRow], list[RewardRecord]]) -> None:
    rows, _ = stream
    old, new = replay_events(rows, V1, CFG), replay_events(rows, V2, CFG)
    asked = {r["sample_id"] for r in old if r["n_clarifying"] > 0}
    d = diff_rewards(old, new, top=1000)
    assert d.paired == len(old) == len(new) and d.only_old == d.only_new == 0
    assert {c.sample_id for c in d.top} == asked and d.changed == len(asked) > FLIPPERS
    for c in d.top:
        assert c.delta == pytest.approx(-0.25 * next(r["n_clarifying"] for r in old if r["sample_id"] == c.sample_id))
    by_name = {c.name: c for c in d.components}
    assert [n for n, c in by_name.items() if c.changed] == ["clarifying"]
    assert by_name["clarifying"].changed == len(asked)
    assert by_name["clarifying"].delta == pytest.approx(-0.25 * sum(r["n_clarifying"] for r in old) / len(old))
    assert d.mean_delta == pytest.approx(by_name["clarifying"].delta)
    # sign flips: exactly the planted positive-but-small turns (the simulator's questions score < 0 already)
    assert d.sign_flips == FLIPPERS
    assert d.flip_fraction == pytest.approx(FLIPPERS / len(old))
    assert (d.old_version, d.new_version) == ("v1", "v2")
    assert all(new_q <= old_q for _, old_q, new_q in d.quantiles)


def test_replay_range_and_token() -> None:
    a, b = ReplayRange(0, 10), ReplayRange(0, 11)
    assert replay_token(V2, a) == replay_token(V2, ReplayRange(0, 10))
    assert len({replay_token(V2, a), replay_token(V2, b), replay_token(V1, a), replay_token(V2, a, part=1)}) == 4
    recs = replay_events(_run_stream(_stream_events(sessions=4))[0], V1, CFG)
    cut = sorted(r["served_ts"] for r in recs)[len(recs) // 2]
    early = in_range(recs, ReplayRange(None, cut))
    assert early and all(r["served_ts"] < cut for r in early)
    assert len(early) + len(in_range(recs, ReplayRange(cut, None))) == len(recs)
    assert in_range(recs, ReplayRange(checkpoint_id="nope")) == []


def test_records_are_regrouped_by_partition_and_offset() -> None:
    def row(p: int, off: int, eid: str, ts: int, org: str = "o") -> dict[str, Any]:
        return {"source_partition": p, "source_offset": off, "org_id": org, "session_id": "s", "request_id": "r",
                "event_id": eid, "payload": orjson.dumps({"event_id": eid, "ts": ts, "org_id": org}).decode()}

    rows = [row(1, 5, "b", 2), row(0, 9, "c", 1), row(1, 5, "a", 3), row(1, 2, "d", 9), row(1, 5, "b", 4, "o2")]
    grouped = records_by_partition(rows + rows[:1])
    assert [(o, [e["event_id"] for e in evs]) for o, evs in grouped[1]] == [(2, ["d"]), (5, ["b", "a", "b"])]
    assert list(grouped) == [0, 1]  # the row sent twice is one event; another org's event of the same id is not


def test_diff_quantiles_and_empty_inputs() -> None:
    assert quantile([], 0.5) == 0.0 and quantile([1.0, 3.0], 0.5) == 2.0
    d = diff_rewards([], [])
    assert d.paired == 0 and d.flip_fraction == 0.0 and d.top == []


def test_diff_pairs_rewards_by_turn_so_sessions_sharing_a_request_id_are_two_samples() -> None:
    def row(session: str, reward: float) -> dict[str, Any]:
        return {"org_id": "o", "session_id": session, "sample_id": "rq", "spec_version": "v", "checkpoint_id": "c",
                "provisional": 0, "reward": reward, "components": {"x": reward}}

    d = diff_rewards([row("s1", 1.0), row("s2", -1.0)], [row("s1", 1.0), row("s2", 0.5)])
    assert (d.paired, d.changed, d.only_old, d.only_new) == (2, 1, 0, 0)
    assert [(c.session_id, c.delta) for c in d.top] == [("s2", 1.5)]


# ---------------------------------------------------------------- CLI against a real engine
def _cli() -> Any:
    import typer

    from rewardflow.cli import rewards

    app = typer.Typer()
    app.add_typer(rewards.app, name="rewards")
    return app


@pytest.mark.clickhouse
def test_cli_replay_is_idempotent_and_refuses_a_changed_spec(ch_db: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from rewardflow.cli.rewards import Store

    monkeypatch.setenv("REWARDFLOW_CLICKHOUSE_DSN", ch_db.dsn.secret)
    monkeypatch.setenv("REWARDFLOW_HOME", str(tmp_path))
    rows, live = _run_stream(_stream_events(sessions=12))
    store = Store(None, ch_db.client)
    store.insert("events", rows, "t-events")
    store.insert("rewards", live, "t-rewards")
    spec_path = str(bundled_specs_dir() / "v2.toml")
    runner = CliRunner()
    res = runner.invoke(_cli(), ["rewards", "replay", "--spec", spec_path, "--against", "v1", "--json"])
    assert res.exit_code == 0, res.output
    assert "nothing written" in orjson.loads(res.stdout)["note"]  # a what-if by default: no row, no ledger entry
    assert ch_db.client.command("SELECT count() FROM rewards WHERE spec_version = 'v2'") == 0
    for _ in range(2):
        res = runner.invoke(_cli(), ["rewards", "replay", "--spec", spec_path, "--against", "v1", "--json", "--store"])
        assert res.exit_code == 0, res.output
    doc = orjson.loads(res.stdout)
    asked = sum(r["n_clarifying"] > 0 for r in live)
    assert doc["diff"]["paired"] == len(live) and doc["diff"]["changed"] == asked
    count = ch_db.client.query("SELECT count(), uniqExact(reward_id) FROM rewards WHERE spec_version = 'v2'").result_rows
    assert count == [(len(live), len(live))]  # the second run changed nothing
    assert ch_db.client.query("SELECT version FROM reward_specs").result_rows == [("v2",)]
    changed = tmp_path / "v2.toml"
    changed.write_text((bundled_specs_dir() / "v2.toml").read_text().replace("clarifying = -0.25", "clarifying = -0.3"))
    res = runner.invoke(_cli(), ["rewards", "replay", "--spec", str(changed)])
    assert res.exit_code == 2 and "can never change" in res.output
    res = runner.invoke(_cli(), ["rewards", "check"])
    assert res.exit_code == 0 and "ok: " in res.output


@pytest.mark.clickhouse
def test_replay_keeps_two_orgs_events_that_share_a_session_and_event_ids(ch_db: Any) -> None:
    from rewardflow.cli.rewards import Store, run_replay

    f = Feed(CFG, [V1])
    for org, at in (("org-a", T0), ("org-b", T0 + 10)):
        f.send(*[{**e, "org_id": org, "event_id": f"e{i}"} for i, e in enumerate(turn("r1", "s1", at))])
    f.tick(f.proc.maxts + CFG.settle_ms)
    stream = {(r["org_id"], r["sample_id"]): r["reward"] for r in f.final("v1")}
    Store(None, ch_db.client).insert("events", f.total.valid, "t-events")
    tally: Counter[str] = Counter()
    replayed = run_replay(Store(None, ch_db.client), V1, CFG, ReplayRange(), tally)
    assert len(stream) == 2 and {(r["org_id"], r["sample_id"]): r["reward"] for r in replayed} == stream
    assert not tally


@pytest.mark.clickhouse
def test_cli_replay_warns_when_stored_rewards_have_no_events(ch_db: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from rewardflow.cli.rewards import Store

    monkeypatch.setenv("REWARDFLOW_CLICKHOUSE_DSN", ch_db.dsn.secret)
    monkeypatch.setenv("REWARDFLOW_HOME", str(tmp_path))
    rows, live = _run_stream(_stream_events(sessions=12))
    gone = {r["sample_id"] for r in live[:5]}
    store = Store(None, ch_db.client)
    store.insert("events", [r for r in rows if r["request_id"] not in gone], "t-events")
    store.insert("rewards", live, "t-rewards")
    res = CliRunner().invoke(_cli(), ["rewards", "replay", "--spec", str(bundled_specs_dir() / "v1.toml"),
                                      "--against", "v1", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    assert "warning: 5 stored v1 rewards have no stored events to replay" in res.stderr
    assert orjson.loads(res.stdout)["without_events"] == 5
