"""What a fault test reads back from ClickHouse, and the checks it must pass after recovery.

:func:`collect` reads the tables (deduplicated with ``FINAL``, plus raw row
counts to report stored duplicates) as plain JSON-able data, so it can run in
the process that owns a chDB directory. :func:`check` asserts, against the
:class:`~tests.fault.workload.Workload` and what the
:class:`~tests.fault.sender.Sender` delivered:

* final rewards: exactly the expected (spec_version, sample_id) set, one final
  row each, equal to the pure core's rows (timing fields aside);
* windows: the merged partials of every window equal an exact recomputation
  from the final reward rows read back (sums, counts, maps, latency histogram);
* dead letters: one per planted record, at its (partition, offset), with its
  reason code; no others, and none written by the sink itself;
* events: every distinct valid event once; exclusions: one ``duplicate`` per
  repeated delivery, the orphans of the workload; nothing late.

Every invariant is checked, and a failure lists all that failed. It returns a
summary (row counts, stored duplicates) for the test report.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from clickhouse_connect.driver.client import Client

from rewardflow.kafka import topics as T
from rewardflow.clickhouse.catalog import SINK_TABLES, table
from rewardflow.core.histogram import LogHistogram
from rewardflow.core.windows import window_key, window_start
from tests.fault.sender import Sender
from tests.fault.workload import TIMING, Workload

WINDOW_SUMS = ("samples", "turns_with_edit", "turns_dissatisfied", "turns_followup", "turns_clarifying",
               "turns_broken", "tool_calls", "tool_broken", "tool_error", "completion_tokens_sum")
MAPS = ("persisted", "checked", "latency_hist", "persistence", "components")


def stop_merges(client: Client) -> None:
    """Stop background merges of the sink's tables (this engine, until restarted), so that
    ``count()`` without ``FINAL`` tells how many rows were stored more than once."""
    for t in SINK_TABLES:
        client.command(f"SYSTEM STOP MERGES `{client.database}`.`{t.name}`")


def _rows(client: Client, sql: str) -> list[dict[str, Any]]:
    out = []
    for row in client.query(sql).named_results():
        out.append({k: ({str(mk): mv for mk, mv in v.items()} if isinstance(v, dict) else v) for k, v in row.items()})
    return out


def collect(client: Client) -> dict[str, Any]:
    """Everything :func:`check` needs, as plain data."""
    cols = {t: ", ".join(table(t).record_columns) for t in ("rewards", "reward_windows", "dead_letters")}
    counts = {t.name: [int(client.command(f"SELECT count() FROM {t.name}")),
                       int(client.command(f"SELECT count() FROM {t.name} FINAL"))] for t in SINK_TABLES}
    return {
        "counts": counts,
        "final_rewards": _rows(client, f"SELECT {cols['rewards']} FROM rewards FINAL WHERE provisional = 0"),
        "windows": _rows(client, "SELECT * FROM windows_merged"),
        "window_partials": _rows(client, "SELECT window_id, window_key, source_partition FROM reward_windows FINAL"),
        "dead_letters": _rows(client, f"SELECT {cols['dead_letters']} FROM dead_letters FINAL"),
        "event_ids": [r[0] for r in client.query("SELECT event_id FROM events FINAL").result_rows],
        "exclusions": Counter(r[0] for r in client.query("SELECT reason FROM exclusions FINAL").result_rows),
        "sink_batches": int(client.command("SELECT count() FROM sink_batches")),
        "late_rows": client.query("SELECT request_id, event_type, event_id, ts, watermark, source_partition, "
                                  "checkpoint_id FROM late_events FINAL LIMIT 20").result_rows,
    }


def check(results: dict[str, Any], workload: Workload, sender: Sender, *, late_ok: bool = False) -> dict[str, Any]:
    """Assert the recovery invariants (module docstring); return a summary for the report.

    ``late_ok``: do not assert that nothing was routed late (the caller reports late rows itself);
    every other invariant is asserted all the same."""
    failures: list[str] = []  # every invariant is checked, so a failure report shows them all

    def attempt(name: str, check_one: Any, *args: Any) -> None:
        try:
            check_one(*args)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")

    attempt("rewards", _check_rewards, results["final_rewards"], workload)
    attempt("windows", _check_windows, results["windows"], results["window_partials"], results["final_rewards"], workload)
    attempt("dead letters", _check_dead_letters, results["dead_letters"], workload, sender)
    attempt("events and exclusions", _check_events, results, workload, late_ok)
    assert not failures, "\n".join(failures)
    counts = results["counts"]
    return {"final_rewards": len(results["final_rewards"]), "windows": len(results["windows"]),
            "dead_letters": len(results["dead_letters"]), "events": len(results["event_ids"]),
            "exclusions": dict(results["exclusions"]),
            "stored_duplicates": {t: c[0] - c[1] for t, c in counts.items() if c[0] != c[1]},
            "sink_batches": results["sink_batches"], "late_rows": counts["late_events"][1]}


def _check_events(results: dict[str, Any], workload: Workload, late_ok: bool) -> None:
    ids = results["event_ids"]
    assert len(ids) == len(set(ids)) and set(ids) == workload.valid_ids, \
        f"events: {len(set(ids) - workload.valid_ids)} unexpected, {len(workload.valid_ids - set(ids))} missing"
    excl = dict(results["exclusions"])
    assert excl.get("duplicate", 0) == workload.occurrences - len(workload.valid_ids) - workload.late_deliveries, excl
    assert excl.get("orphan", 0) == workload.orphans, excl
    assert set(excl) <= {"duplicate", "orphan"}, excl
    assert late_ok or results["counts"]["late_events"][1] == workload.late, (results["counts"]["late_events"],
                                                                               results["late_rows"])


def _check_rewards(rows: list[dict[str, Any]], workload: Workload) -> None:
    got: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:
        key = (r["spec_version"], r["sample_id"], r["revision"])
        assert key not in got, f"two final rows for {key} after FINAL"
        got[key] = {k: v for k, v in r.items() if k not in TIMING}
    missing, extra = set(workload.finals) - set(got), set(got) - set(workload.finals)
    assert not missing and not extra, f"final rewards: {len(missing)} missing {sorted(missing)[:5]}, " \
                                      f"{len(extra)} extra {sorted(extra)[:5]}"
    differ = [k for k, v in workload.finals.items() if got[k] != v]
    assert not differ, f"{len(differ)} final rewards differ from the pure core, e.g. {differ[0]}: " \
                       f"{ {f: (got[differ[0]].get(f), v) for f, v in workload.finals[differ[0]].items() if got[differ[0]].get(f) != v} }"
    assert all(r["provisional"] == 0 for r in rows)


def recompute_windows(rewards: list[dict[str, Any]], sizes_s: list[int]) -> dict[str, dict[str, Any]]:
    """window_key -> the whole window, summed from final reward rows (as the core's windows define it)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rewards:
        for size in sizes_s:
            start = window_start(r["served_ts"], size * 1000)
            key = window_key(size, start, r["checkpoint_id"], r["experiment_arm"], r["surface"], r["spec_version"])
            w = out.setdefault(key, {"window_start": start, "window_size_s": size, "reward_sum": 0.0,
                                     **{f: 0 for f in WINDOW_SUMS}, "persisted": Counter(), "checked": Counter(),
                                     "latency_hist": Counter()})
            w["samples"] += 1
            w["reward_sum"] += r["reward"]
            for f, cond in (("turns_with_edit", "n_edits"), ("turns_dissatisfied", "n_dissatisfied"),
                            ("turns_followup", "n_followups"), ("turns_clarifying", "n_clarifying"),
                            ("turns_broken", "n_tool_broken")):
                w[f] += r[cond] > 0
            w["tool_calls"] += r["n_tool_calls"]
            w["tool_broken"] += r["n_tool_broken"]
            w["tool_error"] += r["n_tool_error"]
            w["completion_tokens_sum"] += r["completion_tokens"]
            w["persisted"].update(r["persisted"])
            w["checked"].update(r["checked"])
            w["latency_hist"][str(LogHistogram().index(r["latency_ms"]))] += 1
    return out


def _check_windows(merged: list[dict[str, Any]], partials: list[dict[str, Any]], rewards: list[dict[str, Any]],
                   workload: Workload) -> None:
    latest: dict[tuple[str, str], dict[str, Any]] = {}  # a corrected turn counts as its latest revision
    for r in rewards:
        k = (r["spec_version"], r["sample_id"])
        if k not in latest or r["revision"] > latest[k]["revision"]:
            latest[k] = r
    want = recompute_windows(list(latest.values()), list(workload.settings.window_sizes_s))
    got = {w["window_key"]: w for w in merged}
    assert set(got) == set(want), f"windows: {len(set(want) - set(got))} missing, {len(set(got) - set(want))} extra"
    ids = [p["window_id"] for p in partials]  # one partial per (window, partition), and one delta per corrected turn
    assert len(ids) == len(set(ids))
    for key, w in want.items():
        g = got[key]
        assert (g["window_start"], g["window_size_s"]) == (w["window_start"], w["window_size_s"]), key
        assert {f: g[f] for f in WINDOW_SUMS} == {f: w[f] for f in WINDOW_SUMS}, key
        assert math.isclose(g["reward_sum"], w["reward_sum"], rel_tol=1e-9, abs_tol=1e-9), key
        for m in ("persisted", "checked", "latency_hist"):
            assert {k: v for k, v in g[m].items() if v} == {k: v for k, v in w[m].items() if v}, (key, m)


def _check_dead_letters(rows: list[dict[str, Any]], workload: Workload, sender: Sender) -> None:
    raw = workload.settings.topic(T.RAW)
    assert not [r for r in rows if r["reason_code"].startswith("sink_")], "the sink dead-lettered rows"
    got = {(r["source_partition"], r["source_offset"]): r for r in rows if r["source_topic"] == raw}
    assert len(got) == len(rows), "dead letters from an unexpected topic"
    assert len(sender.planted) == len(workload.planted)
    missing = set(sender.planted) - set(got)
    extra = set(got) - set(sender.planted)
    assert not missing and not extra, f"dead letters: missing {[sender.planted[k].kind for k in missing]}, extra {sorted(extra)}"
    wrong = {sender.planted[k].kind: (r["reason_code"], sender.planted[k].code) for k, r in got.items()
             if r["reason_code"] != sender.planted[k].code}
    assert not wrong, f"reason codes (got, expected): {wrong}"
