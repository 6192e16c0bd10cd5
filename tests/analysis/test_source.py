"""The analysts' queries read the tables a turn at a time: (org, session, request)."""

from __future__ import annotations

from typing import Any

import pytest

from rewardflow.core.config import JoinConfig
from rewardflow.rewards.spec import bundled_specs_dir, load_spec
from rewardflow.settings import load_settings
from tests.core.feed import CFG, Feed
from tests.factories import T0, ev, turn

V1 = load_spec(bundled_specs_dir() / "v1.toml")


@pytest.mark.clickhouse
def test_corrections_are_listed_per_turn(ch_db: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from rewardflow.analysis.source import fetch_corrections
    from rewardflow.cli.rewards import Store

    cfg = JoinConfig(horizons_s=CFG.horizons_s, grace_ms=CFG.grace_ms, lateness_ms=CFG.lateness_ms,
                     window_sizes_s=CFG.window_sizes_s, correction_ms=3_600_000)
    f = Feed(cfg, [V1])
    f.send(*turn("rq", "s-x", T0, horizons=CFG.horizons_s))
    f.send(*turn("rq", "s-y", T0 + 1_000, horizons=CFG.horizons_s))
    f.tick(f.proc.maxts + cfg.settle_ms)
    f.send(ev("FollowUp", "rq", "s-y", T0 + 4_000, dissatisfied=True))  # corrects s-y's turn only
    Store(None, ch_db.client).insert("rewards", f.total.rewards, "t-rewards")
    monkeypatch.setenv("REWARDFLOW_CLICKHOUSE_DSN", ch_db.dsn.secret)
    monkeypatch.setenv("REWARDFLOW_HOME", str(tmp_path))
    rows = fetch_corrections(load_settings(), "v1")
    assert [(r["session_id"], r["revision"]) for r in rows] == [("s-y", 1)]
    assert rows[0]["latest_reward"] == pytest.approx(rows[0]["first_reward"] + V1.weights.dissatisfied)


@pytest.mark.clickhouse
def test_an_exclusion_takes_the_checkpoint_of_its_own_orgs_session(ch_db: Any, monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Any) -> None:
    from rewardflow.analysis.source import fetch_balance
    from rewardflow.cli.rewards import Store

    f = Feed(CFG, [V1])
    # org-a's session s1 has more scored turns: by session id alone, s1 would be ck-a's
    for org, ck, rid in (("org-a", "ck-a", "r1"), ("org-a", "ck-a", "r2"), ("org-b", "ck-b", "r1")):
        f.send(*[{**e, "org_id": org} for e in turn(rid, "s1", T0, ck, horizons=CFG.horizons_s)])
    f.send({**ev("ToolCall", "lost", "s1", T0 + 10, call_id="c"), "org_id": "org-b"})  # no served event: orphan
    f.tick(f.proc.maxts + CFG.settle_ms)
    assert [x["org_id"] for x in f.total.excluded] == ["org-b"]
    store = Store(None, ch_db.client)
    store.insert("rewards", f.total.rewards, "t-rewards")
    store.insert("exclusions", f.total.excluded, "t-exclusions")
    monkeypatch.setenv("REWARDFLOW_CLICKHOUSE_DSN", ch_db.dsn.secret)
    monkeypatch.setenv("REWARDFLOW_HOME", str(tmp_path))
    overall = fetch_balance(load_settings()).overall
    assert set(overall) == {"ck-b"} and overall["ck-b"].units["orphan"] == {"org-b\ts1\tlost"}


@pytest.mark.clickhouse
def test_exclusions_are_read_by_event_time_when_a_range_is_given(ch_db: Any, monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Any) -> None:
    from rewardflow.analysis.source import fetch_exclusions
    from rewardflow.cli.rewards import Store

    f = Feed(CFG, [V1])
    for i in range(3):  # orphans a minute apart, and a dead letter dated in the middle
        f.send(ev("ToolCall", f"lost{i}", f"s{i}", T0 + i * 60_000, call_id="c"))
    f.send({**ev("FollowUp", "r9", "s9", T0 + 60_000), "dissatisfied": "very"})  # invalid: dead-lettered
    f.record(b"not json", [])  # no event time: outside any range
    f.tick(f.proc.maxts + CFG.settle_ms)
    store = Store(None, ch_db.client)
    store.insert("exclusions", f.total.excluded, "t-exclusions")
    store.insert("dead_letters", f.total.dead, "t-dead")
    monkeypatch.setenv("REWARDFLOW_CLICKHOUSE_DSN", ch_db.dsn.secret)
    monkeypatch.setenv("REWARDFLOW_HOME", str(tmp_path))
    assert len(fetch_exclusions(load_settings())) == 5
    got = fetch_exclusions(load_settings(), (T0 + 30_000, T0 + 90_000))
    assert sorted((x.reason, x.ts) for x in got) == [("dead_letter", T0 + 60_000), ("orphan", T0 + 60_000)]


@pytest.mark.clickhouse
def test_changed_windows_are_those_with_rows_stored_since(ch_db: Any, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Any) -> None:
    import time

    from rewardflow.analysis.source import fetch_changed_windows
    from rewardflow.cli.rewards import Store

    cfg = JoinConfig(horizons_s=CFG.horizons_s, grace_ms=CFG.grace_ms, lateness_ms=CFG.lateness_ms,
                     window_sizes_s=(300,))
    f = Feed(cfg, [V1])
    f.send(*turn("r1", "s1", T0, horizons=CFG.horizons_s))
    f.send(ev("ToolCall", "lost", "s2", T0 + 900_000, call_id="c"))  # an orphan, three windows later
    f.send({**ev("FollowUp", "r9", "s9", T0 + 1_800_000), "dissatisfied": "very"})  # a dead letter, six later
    f.tick(f.proc.maxts + cfg.settle_ms + 300_000)
    before = time.time() - 1
    store = Store(None, ch_db.client)
    for table, rows in (("reward_windows", f.total.windows), ("exclusions", f.total.excluded),
                        ("dead_letters", f.total.dead)):
        store.insert(table, rows, f"t-{table}")
    monkeypatch.setenv("REWARDFLOW_CLICKHOUSE_DSN", ch_db.dsn.secret)
    monkeypatch.setenv("REWARDFLOW_HOME", str(tmp_path))
    windows = {int(r["window_start"]) for r in f.total.windows if r["window_size_s"] == 300}
    orphan, dead = T0 + 900_000, T0 + 1_800_000
    assert fetch_changed_windows(load_settings(), 300, before) == windows
    assert fetch_changed_windows(load_settings(), 300, before, exclusions=True) == windows | {
        orphan - orphan % 300_000, dead - dead % 300_000}
    assert fetch_changed_windows(load_settings(), 300, time.time() + 60, exclusions=True) == set()
