"""Windows closed by the worker agree with an exact computation over its final rewards."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any

import pytest

from rewardflow.kafka import topics as T
from rewardflow.core.histogram import LogHistogram
from rewardflow.core.records import stable_id
from rewardflow.core.windows import window_key, window_start
from tests.factories import T0
from tests.streams.kafka_io import avro_record, json_record
from tests.streams.scenario import SURFACES, varied_turn

pytestmark = pytest.mark.kafka

SUMS = ("samples", "reward_sum", "reward_sq_sum", "turns_with_edit", "turns_dissatisfied", "turns_followup",
        "turns_clarifying", "turns_broken", "tool_calls", "tool_broken", "tool_error", "completion_tokens_sum")


def exact(rewards: list[dict[str, Any]]) -> dict[str, Any]:
    """The window's aggregate, computed directly from its final reward rows."""
    persisted: dict[str, int] = defaultdict(int)
    checked: dict[str, int] = defaultdict(int)
    for r in rewards:
        for h, n in r["persisted"].items():
            persisted[h] += n
        for h, n in r["checked"].items():
            checked[h] += n
    return {
        "samples": len(rewards), "reward_sum": sum(r["reward"] for r in rewards),
        "reward_sq_sum": sum(r["reward"] ** 2 for r in rewards),
        "turns_with_edit": sum(r["n_edits"] > 0 for r in rewards),
        "turns_dissatisfied": sum(r["n_dissatisfied"] > 0 for r in rewards),
        "turns_followup": sum(r["n_followups"] > 0 for r in rewards),
        "turns_clarifying": sum(r["n_clarifying"] > 0 for r in rewards),
        "turns_broken": sum(r["n_tool_broken"] > 0 for r in rewards),
        "tool_calls": sum(r["n_tool_calls"] for r in rewards), "tool_broken": sum(r["n_tool_broken"] for r in rewards),
        "tool_error": sum(r["n_tool_error"] for r in rewards),
        "completion_tokens_sum": sum(r["completion_tokens"] for r in rewards),
        "persisted": dict(persisted), "checked": dict(checked),
    }


def merge(partials: list[dict[str, Any]]) -> dict[str, Any]:
    m: dict[str, Any] = {k: sum(p[k] for p in partials) for k in SUMS}
    for k in ("persisted", "checked"):
        acc: dict[str, int] = defaultdict(int)
        for p in partials:
            for h, n in p[k].items():
                acc[h] += n
        m[k] = dict(acc)
    hist = LogHistogram()
    for p in partials:
        hist.merge({int(i): c for i, c in p["latency_hist"].items()})
    m["hist"] = hist
    return m


def nearest_rank(values: list[int], q: float) -> int:
    return sorted(values)[max(1, math.ceil(q * len(values))) - 1]


def test_windows_close_with_exact_aggregates_merged_over_partitions(deploy: Any) -> None:
    d = deploy()
    hz, size = list(d.settings.horizons_s), d.settings.window_sizes_s[0]
    rng = random.Random(11)
    partition_of: dict[str, int] = {}
    records = []
    for i in range(48):  # served every 4 s: about four one-minute windows, both partitions
        sid = f"s{i % 6}"
        partition_of[sid] = i % 6 % 2
        events = varied_turn(rng, f"r{i}", sid, T0 + 4_000 * i, hz, checkpoint=f"ck-{rng.randrange(2)}",
                             arm=rng.choice(("control", "treat")), surface=rng.choice(SURFACES[:2]),
                             latency_ms=int(rng.lognormvariate(7.5, 1.0)) + 1)
        records.append((partition_of[sid], *(json_record if i % 2 else avro_record)(*events)))
    d.raw.send_many(records)

    out = d.out.until(lambda o: len(o.finals()) == 48 * 2, 30, "every final reward")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    partials_expected: set[str] = set()
    for r in out.finals():
        start = window_start(r["served_ts"], size * 1000)
        key = window_key(size, start, r["checkpoint_id"], r["experiment_arm"], r["surface"], r["spec_version"])
        groups[key].append(r)
        partials_expected.add(stable_id(key, partition_of[r["session_id"]]))
    out.until(lambda o: {w["window_id"] for w in o.rows[T.WINDOWS]} >= partials_expected, 30, "every window closed")
    out.settle(1.0)

    partials: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for w in out.rows[T.WINDOWS]:
        assert w not in partials[w["window_key"]], f"partial {w['window_id']} emitted twice"
        partials[w["window_key"]].append(w)
        assert w["window_id"] == stable_id(w["window_key"], w["source_partition"])
        own = LogHistogram(counts={int(i): c for i, c in w["latency_hist"].items()})
        assert (w["latency_p50"], w["latency_p99"]) == (own.quantile(0.5), own.quantile(0.99))
    assert set(partials) == set(groups) and len(groups) > 8

    for key, rewards in groups.items():
        got, want = merge(partials[key]), exact(rewards)
        first = partials[key][0]
        assert first["window_start"] == window_start(rewards[0]["served_ts"], size * 1000)
        assert first["window_end"] - first["window_start"] == size * 1000
        for k in SUMS:
            assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-9), (key, k)
        assert got["persisted"] == want["persisted"] and got["checked"] == want["checked"]
        for h, n in want["checked"].items():  # rates follow from the sums
            assert got["persisted"][h] / got["checked"][h] == want["persisted"].get(h, 0) / n
        latencies = [r["latency_ms"] for r in rewards]
        for q in (0.5, 0.95, 0.99):
            assert got["hist"].quantile(q) == pytest.approx(nearest_rank(latencies, q), rel=0.01), (key, q)
