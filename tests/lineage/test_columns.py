"""The lineage columns of Arrow batches equal a row-by-row reference computation."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from rewardflow.lineage.columns import LINEAGE_COLUMNS, LineageColumns, lineage_schema
from rewardflow.lineage.registry import Checkpoint, Registry

T = 1_748_764_800_000
REGISTRY = Registry({
    "g0": Checkpoint("g0", "", 0, T),
    "g1": Checkpoint("g1", "g0", 1, T + 3_600_000),
    "g2": Checkpoint("g2", "g1", 2, T + 7_200_000),
})


def reference(registry: Registry, checkpoint: str, served_ts: int) -> dict[str, object]:
    c = registry.get(checkpoint)
    if c is None:
        return {"policy_generation": None, "policy_age_s": None, "policy_lag": None}
    return {"policy_generation": c.generation, "policy_age_s": (served_ts - c.deployed_at_ms) / 1000,
            "policy_lag": registry.lag(checkpoint)}


def batch(checkpoints: list[str], served: list[int], string_type: pa.DataType = pa.string()) -> pa.RecordBatch:
    return pa.record_batch({"sample_id": [f"s{i}" for i in range(len(served))],
                            "checkpoint_id": pa.array(checkpoints, string_type),
                            "served_ts": pa.array(served, pa.int64())})


@pytest.mark.parametrize("encode", [None, "dictionary", "large"])
def test_columns_match_the_reference_row_by_row(encode: str | None) -> None:
    rng = random.Random(3)
    cks = [rng.choice(["g0", "g1", "g2", "unregistered", ""]) for _ in range(5_000)]
    served = [T + rng.randrange(-60_000, 10 * 3_600_000) for _ in cks]
    b = batch(cks, served, pa.large_string() if encode == "large" else pa.string())
    if encode == "dictionary":
        b = pa.record_batch([b.column(0), b.column(1).dictionary_encode(), b.column(2)], names=b.schema.names)
    out = LineageColumns(REGISTRY).append(b)
    assert out.schema == lineage_schema(b.schema) and out.schema.names[-3:] == list(LINEAGE_COLUMNS)
    assert out.select(b.schema.names).equals(b)  # rows, order and own columns unchanged
    got = out.select(list(LINEAGE_COLUMNS)).to_pylist()
    assert got == [reference(REGISTRY, c, s) for c, s in zip(cks, served, strict=True)]
    assert any(r["policy_age_s"] is not None and r["policy_age_s"] < 0 for r in got)  # served before deployment


def test_an_empty_registry_gives_nulls_and_an_empty_batch_keeps_the_schema() -> None:
    out = LineageColumns(Registry()).append(batch(["g0", "x"], [T, T]))
    assert out.column("policy_generation").null_count == 2 and out.column("policy_lag").null_count == 2
    empty = LineageColumns(REGISTRY).append(batch([], []))
    assert empty.num_rows == 0 and empty.schema.field("policy_lag").type == pa.uint32()


def test_lag_follows_the_snapshot_given() -> None:
    b = batch(["g1"], [T])
    assert LineageColumns(REGISTRY).append(b).column("policy_lag").to_pylist() == [1]
    newer = Registry({**REGISTRY.checkpoints, "g3": Checkpoint("g3", "g2", 3, T)})
    assert LineageColumns(newer).append(b).column("policy_lag").to_pylist() == [2]
