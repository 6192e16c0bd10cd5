"""The lineage columns of reward rows, appended to Arrow record batches.

For each row, from the registry snapshot given to :class:`LineageColumns`:

* ``policy_generation`` (uint32): the generation of the row's ``checkpoint_id``;
* ``policy_age_s`` (float64): ``served_ts`` minus that checkpoint's ``deployed_at_ms``, in
  seconds (negative for a row served before the registered deployment time);
* ``policy_lag`` (uint32): the highest registered generation minus ``policy_generation``.

All three are null for a checkpoint that is not registered. Same names, types and values as the
view ``rewards_lineage``.

Contract: pure; vectorised with ``pyarrow.compute`` (a hash lookup of each row's checkpoint, no
Python loop over rows); rows and their order are unchanged, the columns are added at the end.
Needs the columns ``checkpoint_id`` and ``served_ts``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from rewardflow.lineage.registry import Registry

LINEAGE_FIELDS: tuple[pa.Field, ...] = (
    pa.field("policy_generation", pa.uint32()),
    pa.field("policy_age_s", pa.float64()),
    pa.field("policy_lag", pa.uint32()),
)
LINEAGE_COLUMNS: tuple[str, ...] = tuple(f.name for f in LINEAGE_FIELDS)


def lineage_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the lineage fields appended (the schema of :meth:`LineageColumns.append`'s result)."""
    for f in LINEAGE_FIELDS:
        schema = schema.append(f)
    return schema


class LineageColumns:
    """Appends the lineage columns computed from one registry snapshot (build it once per read)."""

    def __init__(self, registry: Registry) -> None:
        ordered = registry.ordered()
        self._ids = pa.array([c.checkpoint_id for c in ordered], pa.string())
        self._generation = pa.array([c.generation for c in ordered], pa.uint32())
        self._deployed = pa.array([c.deployed_at_ms for c in ordered], pa.int64())
        newest = registry.newest_generation
        self._newest = None if newest is None else pa.scalar(newest, pa.uint32())

    def arrays(self, checkpoint_id: pa.Array, served_ts: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
        """``(policy_generation, policy_age_s, policy_lag)`` for rows with these checkpoints and served times."""
        if pa.types.is_dictionary(checkpoint_id.type):
            checkpoint_id = checkpoint_id.dictionary_decode()
        index = pc.index_in(checkpoint_id, value_set=self._ids.cast(checkpoint_id.type))
        generation = pc.take(self._generation, index)
        deployed = pc.take(self._deployed, index)
        age = pc.divide(pc.subtract(served_ts.cast(pa.int64()), deployed).cast(pa.float64()), 1000.0)
        if self._newest is None:
            lag = pa.nulls(len(checkpoint_id), pa.uint32())
        else:
            lag = pc.subtract_checked(self._newest, generation)
        return generation, age, lag

    def append(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` with the lineage columns after its own."""
        extra = self.arrays(batch.column("checkpoint_id"), batch.column("served_ts"))
        return pa.RecordBatch.from_arrays([*batch.columns, *extra], schema=lineage_schema(batch.schema))
