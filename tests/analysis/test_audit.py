"""Audit counts reconcile with a synthetic stream of planted exclusions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from rewardflow.analysis.audit import AuditReport, TurnKey, audit_counts, spec_flags, turn_of
from rewardflow.rewards.spec import RewardSpec, RewardWeights, bundled_specs_dir, load_spec
from tests.core.feed import CFG, Feed
from tests.factories import T0, ev, turn

V1 = load_spec(bundled_specs_dir() / "v1.toml")
LEAKY = RewardSpec(version="leaky", weights=RewardWeights(tool_broken=-0.01))
HZ = CFG.horizons_s

N_TURNS, BROKEN, FAILING, DODGES, ORPHANS, DUPLICATES = 20, 3, 3, 2, 2, 3
LATE: dict[str, tuple[str, dict[str, Any], float]] = {"r10": ("UserAction", {"action": "accept"}, 0.5), "r11": ("UserAction", {"action": "accept"}, 0.5),
        "r12": ("FollowUp", {"dissatisfied": True}, -1.0)}
DEAD = [b"not json", b'{"event_type": "ToolCall"}', b"\x00\x00\x00\x00\x63zz", b"[1, 2]"]


def _turn(i: int) -> list[dict[str, Any]]:
    rid, sid, ts = f"r{i}", f"s{i // 2}", T0 + i * 5_000
    ckpt = "ck-b" if i >= 15 else "ck-a"
    if i < BROKEN:  # a broken call inside an otherwise good turn
        return turn(rid, sid, ts, ckpt, horizons=HZ) + [ev("ToolCall", rid, sid, ts + 700, call_id="bx", status="broken")]
    if i < BROKEN + FAILING:  # clean failure: rejected, barely persisted
        out = turn(rid, sid, ts, ckpt, survival=0.1, horizons=HZ)
        return [e | {"action": "reject"} if e["event_type"] == "UserAction" else e for e in out]
    return turn(rid, sid, ts, ckpt, horizons=HZ)


def _dodge(i: int) -> list[dict[str, Any]]:
    rid, sid, ts = f"dodge{i}", f"sd{i}", T0 + 2_000 + i * 7_000
    return [ev("InferenceServed", rid, sid, ts), ev("ToolCall", rid, sid, ts + 300, call_id="d", status="broken")]


def _orphan(i: int) -> list[dict[str, Any]]:
    rid, sid, ts = f"orph{i}", f"so{i}", T0 + 3_000 + i * 9_000
    return [ev("ToolCall", rid, sid, ts), ev("FollowUp", rid, sid, ts + 100)]


def _stream() -> Iterator[list[dict[str, Any]] | bytes]:
    for i in range(DODGES):
        yield _dodge(i)
    for i in range(ORPHANS):
        yield _orphan(i)
    for i in range(N_TURNS):
        events = _turn(i)
        yield events
        if 6 <= i < 6 + DUPLICATES:  # a client resends its accept
            yield [next(e for e in events if e["event_type"] == "UserAction")]
    yield from DEAD


@pytest.fixture(scope="module")
def feed() -> Feed:
    f = Feed(CFG, [V1, LEAKY])
    for item in _stream():
        if isinstance(item, bytes):
            f.record(item, [])
        else:
            f.send(*item)
    f.tick(f.proc.maxts + CFG.settle_ms)  # every turn final
    for rid, (etype, fields, _) in LATE.items():
        i = int(rid[1:])
        f.send(ev(etype, rid, f"s{i // 2}", T0 + i * 5_000 + 3_000, **fields))
    return f


def _audit(f: Feed, spec: RewardSpec) -> AuditReport:
    events: dict[TurnKey, list[dict[str, Any]]] = {}
    for row in f.total.valid:
        events.setdefault(turn_of(row), []).append(orjson.loads(row["payload"]))
    return audit_counts(spec, f.final(spec.version), dead=f.total.dead, late=f.total.late, excluded=f.total.excluded,
                        valid_events=len(f.total.valid), turn_events=events, cfg=CFG)


def test_counts_reconcile_with_planted_numbers(feed: Feed) -> None:
    rep = _audit(feed, V1)
    lines = {ln.reason: ln for ln in rep.lines}
    samples = N_TURNS + DODGES + ORPHANS
    assert rep.samples == samples and rep.events == len(feed.total.valid) + len(DEAD)
    assert (lines["dead_letter"].rows, lines["dead_letter"].samples) == (len(DEAD), None)
    assert lines["dead_letter"].share == pytest.approx(len(DEAD) / rep.events) and lines["dead_letter"].share_of == "events"
    assert sum(rep.dead_by_code.values()) == len(DEAD)
    assert (lines["duplicate"].rows, lines["duplicate"].samples) == (DUPLICATES, DUPLICATES)
    assert (lines["late"].rows, lines["late"].samples) == (len(LATE), len(LATE))
    assert lines["late"].share == pytest.approx(len(LATE) / samples)
    assert (lines["orphan"].rows, lines["orphan"].rescore) == (ORPHANS, None)
    assert lines["orphan"].share == pytest.approx(ORPHANS / samples)
    assert (lines["spec"].rows, lines["spec"].share) == (0, 0.0) and "cannot exclude" in lines["spec"].note


def test_turns_known_only_from_late_events_count_among_the_samples(feed: Feed) -> None:
    """A session sent wholly after its partition's clock passed it has no scored turn: its turns are
    samples all the same, so the late share stays a share (it read 80,300 % of the samples)."""
    whole = [{**e, "org_id": "org", "reason": "late", "payload": orjson.dumps(e).decode()}
             for rid in ("late-r1", "late-r2") for e in turn(rid, "late-s1", T0 - 10**9)]
    rep = audit_counts(V1, feed.final("v1")[:1], late=whole)
    lines = {ln.reason: ln for ln in rep.lines}
    assert rep.samples == 3 and lines["late"].samples == 2
    assert all(0.0 <= ln.share <= 1.0 for ln in rep.lines)


def test_late_events_rescored_as_if_on_time(feed: Feed) -> None:
    late = next(ln for ln in _audit(feed, V1).lines if ln.reason == "late").rescore
    assert late is not None and late.paired == len(LATE) and late.changed == len(LATE)
    assert {c.sample_id: round(c.delta, 9) for c in late.top} == {rid: d for rid, (_, _, d) in LATE.items()}
    assert late.mean_delta == pytest.approx(sum(d for *_, d in LATE.values()) / len(LATE))


def test_duplicates_rescored_by_counting_the_copy(feed: Feed) -> None:
    dup = next(ln for ln in _audit(feed, V1).lines if ln.reason == "duplicate").rescore
    assert dup is not None and dup.changed == DUPLICATES
    assert all(c.delta == pytest.approx(V1.weights.accept) for c in dup.top)


def test_broken_call_hole_is_visible_per_checkpoint(feed: Feed) -> None:
    v1 = {c.checkpoint_id: c for c in _audit(feed, V1).checkpoints}
    a = v1["ck-a"]
    assert (a.broken_samples, a.dodges, a.clean_failing) == (BROKEN + DODGES, DODGES, FAILING)
    assert a.samples == 15 + DODGES and a.broken_share == pytest.approx((BROKEN + DODGES) / a.samples)
    assert a.broken_contribution == pytest.approx(V1.weights.tool_broken * (BROKEN + DODGES))
    assert not a.hole and v1["ck-b"].broken_samples == 0 and v1["ck-b"].mean_dodge is None
    leaky = {c.checkpoint_id: c for c in _audit(feed, LEAKY).checkpoints}["ck-a"]
    assert leaky.hole and leaky.mean_dodge is not None and leaky.mean_clean_failing is not None
    assert leaky.mean_dodge > leaky.mean_clean_failing


def test_two_sessions_turns_sharing_a_request_id_are_two_samples() -> None:
    """A late signal of one session's turn is rescored with that turn's events, not the other session's."""
    f = Feed(CFG, [V1])
    f.send(*turn("rq", "s-x", T0, horizons=HZ))
    f.send(*turn("rq", "s-y", T0 + 1_000, horizons=HZ))
    f.tick(f.proc.maxts + CFG.settle_ms)
    f.send(ev("FollowUp", "rq", "s-y", T0 + 4_000, dissatisfied=True))
    rep = _audit(f, V1)
    late = next(ln for ln in rep.lines if ln.reason == "late")
    assert rep.samples == 2 and (late.rows, late.samples) == (1, 1)
    assert late.rescore is not None and late.rescore.changed == 1
    assert late.rescore.top[0].delta == pytest.approx(V1.weights.dissatisfied)


def test_spec_flags() -> None:
    assert spec_flags(V1) == []
    flags = spec_flags(LEAKY)
    assert len(flags) == 2 and "tool_error" in flags[0] and "reject" in flags[1]
    assert spec_flags(load_spec(bundled_specs_dir() / "v2.toml")) == []


def test_empty_stream() -> None:
    rep = audit_counts(V1, [])
    assert rep.samples == 0 and all(ln.share == 0.0 for ln in rep.lines) and rep.checkpoints == []


def _cli_over(ch_db: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, tables: dict[str, Any]) -> Any:
    """An app holding ``rewardflow audit`` over a database holding ``tables`` (name -> rows), the feed's settings."""
    import typer

    from rewardflow.cli import audit
    from rewardflow.cli.rewards import Store

    for k, v in {"REWARDFLOW_CLICKHOUSE_DSN": ch_db.dsn.secret, "REWARDFLOW_HOME": str(tmp_path),
                 "REWARDFLOW_HORIZONS_S": "[30, 120]", "REWARDFLOW_GRACE_MS": "1000",
                 "REWARDFLOW_MAX_CLOCK_SKEW_MS": "500", "REWARDFLOW_ALLOWED_LATENESS_MS": "500"}.items():
        monkeypatch.setenv(k, v)
    store = Store(None, ch_db.client)
    for table, rows in tables.items():
        store.insert(table, rows, f"t-{table}")
    app = typer.Typer()
    app.command("audit")(audit.command)
    app.command("other")(lambda: None)
    return app


@pytest.mark.clickhouse
def test_cli_audit_reads_the_tables(feed: Feed, ch_db: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from typer.testing import CliRunner

    t = feed.total
    app = _cli_over(ch_db, monkeypatch, tmp_path, {"events": t.valid, "rewards": t.rewards, "dead_letters": t.dead,
                                                   "late_events": t.late, "exclusions": t.excluded})
    res = CliRunner().invoke(app, ["audit", "--spec", "v1", "--json"])
    assert res.exit_code == 0, res.output
    doc = orjson.loads(res.stdout)
    pure = _audit(feed, V1)
    assert [(ln["reason"], ln["rows"], ln["samples"]) for ln in doc["lines"]] == [(ln.reason, ln.rows, ln.samples) for ln in pure.lines]
    late = next(ln for ln in doc["lines"] if ln["reason"] == "late")["rescore"]
    assert late["changed"] == len(LATE)
    assert doc["without_events"] == 0 and "warning" not in res.stderr
    res = CliRunner().invoke(app, ["audit", "--checkpoint", "ck-b", "--strict"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.stdout.splitlines()) <= 80, res.stdout
    ch_db.client.command("TRUNCATE TABLE events")
    res = CliRunner().invoke(app, ["audit", "--spec", "v1", "--json"])
    samples = len({r["sample_id"] for r in t.rewards if r["spec_version"] == "v1" and not r["provisional"]})
    assert f"warning: {samples:,} scored samples have no stored events" in res.stderr
    assert orjson.loads(res.stdout)["without_events"] == samples


def test_corrections_are_counted_beside_the_exclusions() -> None:
    """With a correction window, the same late signals correct their turns: not late, counted as corrected."""
    from rewardflow.core.config import JoinConfig

    cfg = JoinConfig(horizons_s=CFG.horizons_s, grace_ms=CFG.grace_ms, lateness_ms=CFG.lateness_ms,
                     window_sizes_s=CFG.window_sizes_s, correction_ms=3_600_000)
    f = Feed(cfg, [V1])
    for item in _stream():
        if not isinstance(item, bytes):
            f.send(*item)
    f.tick(f.proc.maxts + cfg.settle_ms)
    for rid, (etype, fields, _) in LATE.items():
        i = int(rid[1:])
        f.send(ev(etype, rid, f"s{i // 2}", T0 + i * 5_000 + 3_000, **fields))
    rep = audit_counts(V1, f.final("v1"), late=f.total.late, excluded=f.total.excluded, cfg=cfg)
    lines = {ln.reason: ln for ln in rep.lines}
    assert (lines["late"].rows, lines["corrected"].rows, lines["corrected"].samples) == (0, len(LATE), len(LATE))
    assert rep.samples == N_TURNS + DODGES + ORPHANS  # a corrected turn is one sample, counted with its latest revision
    latest = {r["sample_id"]: r for r in f.final("v1") if r["revision"]}
    assert latest["r12"]["n_dissatisfied"] == 1 and latest["r10"]["n_accept"] == 2


@pytest.mark.clickhouse
def test_cli_audit_keeps_two_orgs_turns_whose_event_ids_coincide(ch_db: Any, monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Any) -> None:
    from typer.testing import CliRunner

    f = Feed(CFG, [V1])
    for org, action in (("org-a", "accept"), ("org-b", "reject")):  # event ids e0, e1, ... in both
        events = [{**e, "org_id": org, "event_id": f"e{i}"} for i, e in enumerate(turn("rq", "s1", T0, horizons=HZ))]
        f.send(*[e | {"action": action} if e["event_type"] == "UserAction" else e for e in events])
    f.tick(f.proc.maxts + CFG.settle_ms)
    f.send({**ev("FollowUp", "rq", "s1", T0 + 3_000, dissatisfied=True), "org_id": "org-b"})  # late: org-b's turn
    assert len(f.total.late) == 1
    app = _cli_over(ch_db, monkeypatch, tmp_path,
                    {"events": f.total.valid, "rewards": f.total.rewards, "late_events": f.total.late})
    res = CliRunner().invoke(app, ["audit", "--spec", "v1", "--json"])
    assert res.exit_code == 0, res.output
    doc = orjson.loads(res.stdout)
    late = next(ln for ln in doc["lines"] if ln["reason"] == "late")["rescore"]
    pure = next(ln for ln in _audit(f, V1).lines if ln.reason == "late").rescore
    assert pure is not None and (late["paired"], late["changed"]) == (pure.paired, pure.changed) == (1, 1)
    assert doc["events"] == len(f.total.valid) + len(f.total.dead)
