"""The ``checkpoints`` table: register a checkpoint (a write), load the registry (a read).

Contract:

* :func:`load_registry` runs one read statement through any
  :class:`~rewardflow.clickhouse.readers.Reader` (in this process, or the chDB owner's endpoint)
  and raises what the reader raises (a ``QueryError`` naming the table when it is missing).
* :meth:`CheckpointStore.register` blocks on at most three round trips: it reads the registry,
  inserts the row when the registration is new, and reads the checkpoint back. Of two
  registrations of one id racing each other, the first inserted is the registration for every
  reader (reads keep the smallest ``_seq`` of an id, as the table's keep-first version does), and
  the other gets a :class:`~.registry.LineageError`. Driver errors propagate.
* :func:`manage` is the owner endpoint's ``/checkpoints`` operation on a writable client.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from rewardflow.clickhouse.readers import Reader
from rewardflow.clickhouse.tables_state import CHECKPOINTS
from rewardflow.lineage.registry import Checkpoint, LineageError, Registry

REGISTRY_SQL = (
    "SELECT checkpoint_id, parent_id, generation, deployed_at_ms, note, toString(registered_at) AS registered_at "
    f"FROM {CHECKPOINTS.name} ORDER BY _seq LIMIT 1 BY checkpoint_id"
)
_INSERT_COLUMNS = ["checkpoint_id", "parent_id", "generation", "deployed_at_ms", "note"]


def load_registry(reader: Reader) -> Registry:
    """The registry as stored now (one read statement)."""
    return Registry.from_rows(reader.query_arrow(REGISTRY_SQL).to_pylist())


class CheckpointStore:
    """Registration of checkpoints through a writable clickhouse-connect client."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def registry(self) -> Registry:
        """The registry as stored now."""
        return Registry.from_rows(self.client.query(REGISTRY_SQL).named_results())

    def register(self, checkpoint_id: str, parent_id: str = "", deployed_at_ms: int | None = None, note: str = "",
                 *, now_ms: int | None = None) -> tuple[Checkpoint, bool]:
        """Register a checkpoint (rules: :meth:`Registry.plan`); returns it as stored and whether this call
        wrote it (False: it was registered already, identically). Raises :class:`LineageError`."""
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        wanted, new = self.registry().plan(checkpoint_id, parent_id, deployed_at_ms, note, now_ms=now)
        if not new:
            return wanted, False
        row = [wanted.checkpoint_id, wanted.parent_id, wanted.generation, wanted.deployed_at_ms, wanted.note]
        self.client.insert(CHECKPOINTS.name, [row], column_names=_INSERT_COLUMNS)
        stored = self.registry().get(checkpoint_id)
        if stored is None or not stored.same_lineage(wanted):
            raise LineageError(f"checkpoint {checkpoint_id!r} was registered concurrently with another lineage "
                               f"(see `rewardflow checkpoints list`)")
        return stored, True


def manage(client: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """One ``/checkpoints`` request: ``{"action": "register", "checkpoint_id", "parent_id", "deployed_at_ms",
    "note"}`` -> ``{"checkpoint": {...}, "created": bool}``. Raises LineageError, or KeyError / ValueError
    for a malformed body."""
    if doc["action"] != "register":
        raise ValueError(f"unknown action {str(doc['action'])[:32]!r}")
    deployed = doc.get("deployed_at_ms")
    checkpoint, created = CheckpointStore(client).register(
        str(doc["checkpoint_id"]), str(doc.get("parent_id") or ""), None if deployed is None else int(deployed),
        str(doc.get("note") or ""))
    return {"checkpoint": asdict(checkpoint), "created": created}
