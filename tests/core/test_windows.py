"""Window aggregates: exact sums over final reward records, mergeable per-partition partials, close rule."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import replace
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rewardflow.core.histogram import LogHistogram
from rewardflow.core.rows import RewardRecord
from rewardflow.core.windows import WindowBook, window_key, window_start
from tests.core.feed import CFG, Feed
from tests.core.test_histogram import exact_quantile
from tests.factories import T0, ev, turn

HZ = (30, 120)
WCFG = replace(CFG, window_sizes_s=(60, 300))
SUMS = ("samples", "turns_with_edit", "turns_dissatisfied", "turns_followup", "turns_clarifying", "turns_broken",
        "tool_calls", "tool_broken", "tool_error", "completion_tokens_sum")


def events_of(seed: int, n_turns: int = 40, sessions: int = 6) -> list[list[dict[str, Any]]]:
    """Records (lists of events) of random turns over ~10 minutes, delayed within the lateness."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    for i in range(n_turns):
        sid, t, rid = f"s{rng.randrange(sessions)}", T0 + rng.randrange(0, 600_000), f"r{i}"
        evs = turn(rid, session_id=sid, ts=t, horizons=rng.choice([HZ, (30,), ()]), survival=rng.random(),
                   checkpoint=rng.choice(["ck-a", "ck-b"]), experiment_arm=rng.choice(["control", "treat"]),
                   surface=rng.choice(["agent", "tab"]), latency_ms=rng.randrange(100, 60_000),
                   completion_tokens=rng.randrange(0, 900))
        if rng.random() < 0.3:
            evs = [evs[0]]  # served only: no edit, no check
        for k in range(rng.randrange(3)):
            evs.append(ev("ToolCall", rid, sid, t + 10 + k, status=rng.choice(["ok", "error", "broken"])))
        if rng.random() < 0.4:
            evs.append(ev("FollowUp", rid, sid, t + rng.randrange(60_000), dissatisfied=rng.random() < 0.5))
        if rng.random() < 0.2:
            evs.append(ev("ClarifyingQuestion", rid, sid, t + 5))
        events += evs
    arrival = sorted(events, key=lambda e: e["ts"] + rng.randrange(CFG.lateness_ms))
    records, i = [], 0
    while i < len(arrival):
        n = rng.randint(1, 4)
        records.append(arrival[i:i + n])
        i += n
    return records


def run(records: list[list[dict[str, Any]]], partition: int = 0) -> Feed:
    f = Feed(cfg=WCFG, partition=partition)
    for evs in records:
        f.send(*evs)
    f.tick(T0 + 10**7)
    return f


def exact_windows(rewards: list[RewardRecord], sizes: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """Independent computation of every window from the final reward records."""
    groups: dict[str, list[RewardRecord]] = defaultdict(list)
    for r in rewards:
        for size in sizes:
            start = r["served_ts"] - r["served_ts"] % (size * 1000)
            groups[window_key(size, start, r["checkpoint_id"], r["experiment_arm"], r["surface"], r["spec_version"])].append(r)
    out = {}
    for key, rs in groups.items():
        persisted: dict[int, int] = defaultdict(int)
        checked: dict[int, int] = defaultdict(int)
        for r in rs:
            for h, n in r["persisted"].items():
                persisted[h] += n
            for h, n in r["checked"].items():
                checked[h] += n
        out[key] = {
            "samples": len(rs),
            "reward_sum": float(sum(Fraction(r["reward"]) for r in rs)),
            "reward_sq_sum": float(sum(Fraction(r["reward"]) ** 2 for r in rs)),
            "turns_with_edit": sum(r["n_edits"] > 0 for r in rs),
            "turns_dissatisfied": sum(r["n_dissatisfied"] > 0 for r in rs),
            "turns_followup": sum(r["n_followups"] > 0 for r in rs),
            "turns_clarifying": sum(r["n_clarifying"] > 0 for r in rs),
            "turns_broken": sum(r["n_tool_broken"] > 0 for r in rs),
            "tool_calls": sum(r["n_tool_calls"] for r in rs),
            "tool_broken": sum(r["n_tool_broken"] for r in rs),
            "tool_error": sum(r["n_tool_error"] for r in rs),
            "completion_tokens_sum": sum(r["completion_tokens"] for r in rs),
            "persisted": dict(persisted),
            "checked": dict(checked),
            "latencies": [float(r["latency_ms"]) for r in rs],
        }
    return out


def merge_partials(windows: list[Any]) -> dict[str, dict[str, Any]]:
    """What the analysis side does: group partials by window_key and add them up."""
    merged: dict[str, dict[str, Any]] = {}
    for w in windows:
        m = merged.setdefault(w["window_key"], {k: 0 for k in SUMS} | {
            "reward_sum": 0.0, "reward_sq_sum": 0.0, "persisted": defaultdict(int), "checked": defaultdict(int),
            "hist": LogHistogram(), "partitions": []})
        for k in (*SUMS, "reward_sum", "reward_sq_sum"):
            m[k] += w[k]
        for k in ("persisted", "checked"):
            for h, n in w[k].items():
                m[k][h] += n
        m["hist"].merge(w["latency_hist"])
        m["partitions"].append(w["source_partition"])
    return merged


def test_window_aggregates_equal_an_exact_computation_over_the_reward_records() -> None:
    f = run(events_of(1))
    finals = [r for r in f.total.rewards if not r["provisional"]]
    assert len(finals) == 2 * 40  # every turn, under both specs
    exact = exact_windows(finals, WCFG.window_sizes_s)
    got: dict[str, Any] = {w["window_key"]: w for w in f.total.windows}
    assert len(got) == len(f.total.windows)  # each window emitted once
    assert set(got) == set(exact)
    for key, want in exact.items():
        w = got[key]
        assert w["window_end"] - w["window_start"] == w["window_size_s"] * 1000
        assert {k: w[k] for k in SUMS} == {k: want[k] for k in SUMS}
        assert math.isclose(w["reward_sum"], want["reward_sum"], rel_tol=1e-12, abs_tol=1e-12)
        assert math.isclose(w["reward_sq_sum"], want["reward_sq_sum"], rel_tol=1e-12, abs_tol=1e-12)
        assert w["persisted"] == want["persisted"] and w["checked"] == want["checked"]
        for rate in ("turns_dissatisfied", "turns_broken", "turns_with_edit"):
            assert w[rate] / w["samples"] == want[rate] / want["samples"]
        for h in want["checked"]:
            assert w["persisted"][h] / w["checked"][h] == want["persisted"][h] / want["checked"][h]
        for q, name in ((0.5, "latency_p50"), (0.95, "latency_p95"), (0.99, "latency_p99")):
            exact_q = exact_quantile(want["latencies"], q)
            assert abs(w[name] - exact_q) <= 0.01 * exact_q * (1 + 1e-9)
    # each final reward sits in exactly one window of each size
    for size in WCFG.window_sizes_s:
        assert sum(w["samples"] for w in f.total.windows if w["window_size_s"] == size) == len(finals)


def test_per_partition_partials_merged_equal_a_single_computation() -> None:
    records = events_of(2, n_turns=50)
    single = run(records)
    by_partition: dict[int, list[list[dict[str, Any]]]] = defaultdict(list)
    for evs in records:  # sessions are the partition key
        for e in evs:
            by_partition[int(e["session_id"][1:]) % 3].append([e])
    partials = [w for p, recs in by_partition.items() for w in run(recs, partition=p).total.windows]
    assert len({w["window_id"] for w in partials}) == len(partials)
    merged = merge_partials(partials)
    whole: dict[str, Any] = {w["window_key"]: w for w in single.total.windows}
    assert set(merged) == set(whole)
    assert any(len(m["partitions"]) > 1 for m in merged.values())
    for key, m in merged.items():
        w = whole[key]
        assert {k: m[k] for k in SUMS} == {k: w[k] for k in SUMS}
        assert dict(m["persisted"]) == w["persisted"] and dict(m["checked"]) == w["checked"]
        assert math.isclose(m["reward_sum"], w["reward_sum"], rel_tol=1e-12, abs_tol=1e-9)
        assert math.isclose(m["reward_sq_sum"], w["reward_sq_sum"], rel_tol=1e-12, abs_tol=1e-9)
        assert m["hist"].counts == w["latency_hist"]
        assert (m["hist"].quantile(0.5), m["hist"].quantile(0.95), m["hist"].quantile(0.99)) == (
            w["latency_p50"], w["latency_p95"], w["latency_p99"])


# ---------------------------------------------------------------- the close rule

def test_window_closes_only_after_its_end_plus_settle_and_no_older_open_turn() -> None:
    f = Feed()  # one-minute windows, settle 121 s
    start = window_start(T0, 60_000)
    end = start + 60_000
    f.send(ev("InferenceServed", "a", "s1", T0))
    f.send(ev("InferenceServed", "b", "s2", T0 + 1000), ev("AgentEdit", "b", "s2", end + 100_000, edit_id="x"))
    f.tick(end + CFG.settle_ms - 1)
    assert f.total.windows == []
    f.tick(end + CFG.settle_ms)  # a is final, but b (served in the same window) is still open
    assert {r["sample_id"] for r in f.final()} == {"a"} and f.total.windows == []
    f.tick(end + 100_000 + CFG.settle_ms)
    wins = [w for w in f.total.windows if w["spec_version"] == "v1"]
    assert [(w["window_start"], w["samples"]) for w in wins] == [(start, 2)]
    f.tick(end + 10**6)
    assert len([w for w in f.total.windows if w["spec_version"] == "v1"]) == 1


def test_window_book_close_and_bookkeeping() -> None:
    book = WindowBook([60], partition=3)
    f = run(events_of(3, n_turns=6, sessions=2))
    rewards = [r for r in f.total.rewards if not r["provisional"] and r["spec_version"] == "v1"]
    for r in rewards:
        book.add(r)
    first = min(window_start(r["served_ts"], 60_000) for r in rewards)
    assert book.close(first) == []  # windows ending at or before `first`: none
    closed = book.close(first + 60_000)
    assert [w["window_start"] for w in closed] == [first] and closed[0]["source_partition"] == 3
    assert book.min_closed_through() == first + 60_000
    assert book.close(first + 60_000) == []  # never twice
    late = [r for r in rewards if window_start(r["served_ts"], 60_000) == first][0]
    book.add(late)  # a record of a closed window is not added to a re-opened one
    assert all(k[1] != first for k in book.open)


def test_window_ids_are_deterministic_and_per_partition() -> None:
    key = window_key(60, 0, "ck", "arm", "agent", "v1")
    assert key == window_key(60, 0, "ck", "arm", "agent", "v1") != window_key(60, 0, "ck", "arm", "agent", "v2")
    a, b = WindowBook([60], 0), WindowBook([60], 1)
    f = run(events_of(4, n_turns=3, sessions=1))
    r = next(r for r in f.total.rewards if not r["provisional"])
    a.add(r)
    b.add(r)
    (wa,), (wb,) = a.close(T0 + 10**7), b.close(T0 + 10**7)
    assert wa["window_key"] == wb["window_key"] and wa["window_id"] != wb["window_id"]


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_accumulation_does_not_depend_on_the_order_of_rewards(data: st.DataObject) -> None:
    rewards = [r for r in FIXED_REWARDS if r["spec_version"] == "v1"]
    order = data.draw(st.permutations(rewards))
    a, b = WindowBook([60, 300], 0), WindowBook([60, 300], 0)
    for r in rewards:
        a.add(r)
    for r in order:
        b.add(r)
    def by_id(ws: list[Any]) -> list[Any]:
        return sorted(ws, key=lambda w: w["window_id"])

    assert by_id(a.close(T0 + 10**7)) == by_id(b.close(T0 + 10**7))


FIXED_REWARDS = [r for r in run(events_of(5, n_turns=30, sessions=2)).total.rewards if not r["provisional"]]


def test_a_served_event_too_old_for_its_window_is_late_not_missing_from_windows() -> None:
    """An open turn (edit seen, served not yet) must not let a served_ts into an already closed window."""
    f = Feed()
    start = window_start(T0, 60_000)
    end = start + 60_000
    f.send(ev("AgentEdit", "r", "s1", end + 1000, edit_id="x"))  # r stays open until end + 1 s + settle
    f.send(ev("FollowUp", "q", "s2", end + CFG.settle_ms + CFG.lateness_ms + 10))  # the window of T0 closes
    assert f.proc.book.closed_through[60] == end
    out = f.send(ev("InferenceServed", "r", "s1", end - 100))
    assert [x["reason"] for x in out.late] == ["late"] and out.valid == []
    f.tick(T0 + 10**7)
    finals = [r for r in f.total.rewards if not r["provisional"]]
    assert sum(w["samples"] for w in f.total.windows) == len(finals)
    assert sorted(x["request_id"] for x in f.total.excluded if x["reason"] == "orphan") == ["q", "r"]


def typed(x: Any) -> Any:
    """A value with its types, dict key order and float bits made explicit (== on it is an exact comparison)."""
    if isinstance(x, dict):
        return [(typed(k), typed(v)) for k, v in x.items()]
    if isinstance(x, (list, tuple)):
        return [typed(v) for v in x]
    if isinstance(x, float):
        return ("float", x.hex())
    return (type(x).__name__, x)


def reference_add(acc: Any, r: dict[str, Any]) -> None:
    """The plain definition of adding one reward record to a window's accumulator."""
    acc.samples += 1
    u = round(r["reward"] * 10**12)
    acc.reward_units += u
    acc.reward_sq_units += u * u
    acc.turns_with_edit += r["n_edits"] > 0
    acc.turns_dissatisfied += r["n_dissatisfied"] > 0
    acc.turns_followup += r["n_followups"] > 0
    acc.turns_clarifying += r["n_clarifying"] > 0
    acc.turns_broken += r["n_tool_broken"] > 0
    acc.tool_calls += r["n_tool_calls"]
    acc.tool_broken += r["n_tool_broken"]
    acc.tool_error += r["n_tool_error"]
    acc.completion_tokens_sum += r["completion_tokens"]
    for h, n in r["persisted"].items():
        acc.persisted[h] = acc.persisted.get(h, 0) + n
    for h, n in r["checked"].items():
        acc.checked[h] = acc.checked.get(h, 0) + n
    acc.latency.add(r["latency_ms"])


def reference_windows(sizes: list[int], records: list[dict[str, Any]], partition: int) -> list[Any]:
    """Every window, one reference_add per record and size, in opening order (per size, as close does)."""
    from rewardflow.core.windows import WindowAccumulator

    accs: dict[tuple[Any, ...], WindowAccumulator] = {}
    for r in records:
        for size in sizes:
            start = window_start(r["served_ts"], size * 1000)
            k = (size, start, r["checkpoint_id"], r["experiment_arm"], r["surface"], r["spec_version"])
            if k not in accs:
                accs[k] = WindowAccumulator(size, start, *k[2:])
            reference_add(accs[k], r)
    return [accs[k].to_record(partition) for size in dict.fromkeys(sizes) for k in accs if k[0] == size]


synthetic_record = st.fixed_dictionaries({
    "served_ts": st.integers(T0, T0 + 900_000),
    "checkpoint_id": st.sampled_from(["ck-a", "ck-b"]), "experiment_arm": st.sampled_from(["control", "treat"]),
    "surface": st.just("agent"), "spec_version": st.sampled_from(["v1", "v2"]),
    "reward": st.floats(-20, 20, allow_nan=False).map(lambda x: round(x, 12)),
    "n_edits": st.integers(0, 3), "n_dissatisfied": st.integers(0, 2), "n_followups": st.integers(0, 2),
    "n_clarifying": st.integers(0, 2), "n_tool_calls": st.integers(0, 5), "n_tool_broken": st.integers(0, 2),
    "n_tool_error": st.integers(0, 2), "completion_tokens": st.integers(0, 5000),
    "latency_ms": st.integers(0, 120_000),
    # horizons in any order and any subset: the aggregate's maps keep first-seen key order
    "persisted": st.dictionaries(st.sampled_from([900, 30, 300, 120]), st.integers(0, 4), max_size=4),
    "checked": st.dictionaries(st.sampled_from([120, 30, 900, 600]), st.integers(0, 4), max_size=4),
})


@settings(max_examples=60, deadline=None)
@given(records=st.lists(synthetic_record, max_size=40), sizes=st.sampled_from([[60, 300], [300], [300, 60], [60, 60]]))
def test_window_book_equals_one_accumulator_add_per_record_and_size(records: list[dict[str, Any]], sizes: list[int]) -> None:
    """WindowBook.add (all sizes at once, new windows started from the record) is exactly the plain definition."""
    book = WindowBook(list(sizes), 5)
    for r in records:
        book.add(r)  # type: ignore[arg-type]
    got = book.close(T0 + 10**8)
    assert typed(got) == typed(reference_windows(sizes, records, 5))
    assert not book.open


@settings(max_examples=50, deadline=None)
@given(size=st.integers(1, 10**5), start=st.integers(-(10**15), 10**15), parts=st.lists(st.text(), min_size=4, max_size=4),
       partition=st.integers(0, 10**4))
def test_window_ids_are_the_stable_ids_of_their_parts(size: int, start: int, parts: list[str], partition: int) -> None:
    from rewardflow.core.records import stable_id
    from rewardflow.core.windows import WindowAccumulator

    key = window_key(size, start, *parts)
    assert key == stable_id("w", size, start, *parts)
    rec = WindowAccumulator(size, start, *parts).to_record(partition)
    assert (rec["window_key"], rec["window_id"]) == (key, stable_id(key, partition))


def test_records_copy_the_maps_of_an_open_accumulator() -> None:
    book = WindowBook([60], 0)
    for r in FIXED_REWARDS:
        book.add(r)
    acc = next(iter(book.open.values()))
    before = typed(acc.to_record(0))
    rec = acc.to_record(0)
    rec["persisted"][99] = 1
    rec["checked"][99] = 1
    rec["latency_hist"][99] = 1
    assert typed(acc.to_record(0)) == before
    assert acc.reward_sum == rec["reward_sum"] and acc.reward_sq_sum == rec["reward_sq_sum"]


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.sampled_from([60, 300, 3600]), min_size=1, max_size=3, unique=True),
       closes=st.lists(st.integers(-10_000_000, 10_000_000), max_size=4),
       ct=st.dictionaries(st.sampled_from([60, 300, 3600]), st.integers(-10_000_000, 10_000_000), max_size=3),
       limits=st.lists(st.integers(-20_000_000, 20_000_000), min_size=1, max_size=8))
def test_due_says_whether_a_close_would_move_some_size(sizes: list[int], closes: list[int], ct: dict[int, int],
                                                        limits: list[int]) -> None:
    # the plain definition: some size's window start at the limit is past what is closed of it
    book = WindowBook(sizes, 0, {s: v for s, v in ct.items() if s in sizes})  # (unaligned, as any stored value)
    for at in [*closes, *limits]:
        expect = any(window_start(at, s * 1000) > book.closed_through.get(s, -2**62) for s in sizes)
        assert book.due(at) == expect, (at, book.closed_through)
        book.close(at)  # closes move the thresholds due() keeps between calls
