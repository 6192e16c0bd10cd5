"""Trainer pull: reward records newer than a trainer's cursor, as Arrow record batches.

Exactly once per trainer name, across restarts::

    reader = RewardReader(dsn, trainer="ppo-main", checkpoint="ck-7")
    for batch in reader:          # pyarrow.RecordBatch, ordered by _seq
        train_on(batch)
    reader.commit()               # now these rows are never handed to "ppo-main" again

How: every rewards row carries ``_seq``, a Snowflake id ClickHouse assigns at
insert (unique, increasing). An iteration reads ``rewards FINAL`` rows with
``cursor < _seq <= horizon``, where ``cursor`` is the trainer's committed
position (``trainer_cursors``) and ``horizon`` is the id of "now minus
``settle_s``", fixed when the iteration starts. Why each piece:

* ``FINAL`` with the table's keep-first version (``_keep = bitNot(_seq)``):
  a row inserted twice (a replay past the dedup window) collapses to its
  first copy, whose ``_seq`` the cursor has already passed - never re-sent;
* ``settle_s``: a row becomes visible when its insert commits, a little after
  its ``_seq`` was drawn; reading only ids older than the slowest insert
  means no row can appear later *behind* the cursor (inserts concurrent with
  the read are picked up next time);
* :meth:`commit` stores the ``_seq`` of the last row handed out, or the
  horizon once the iteration was exhausted. Rows handed out but not
  committed are handed out again by the next iteration (at-least-once until
  commit; exactly once with commit after use).

``trainer=None`` makes a snapshot reader: it starts from the beginning and
cannot commit. One reader per trainer name at a time. Filters (checkpoint, spec version,
surface, arm, only_final, max_policy_lag) narrow what this trainer receives; rows filtered out
are behind its cursor afterwards and are not offered to it later. A ``spec_version`` that is neither registered
nor the version of any stored row raises :class:`UnknownSpecVersion` before anything is read (a
``checkpoint`` neither registered nor on any stored reward, :class:`UnknownCheckpoint`)
(a typo would match nothing, and the commit would move the cursor past the rows it meant).

Lineage: every batch ends with ``policy_generation``, ``policy_age_s`` and ``policy_lag``
(:mod:`rewardflow.lineage.columns`), computed from the checkpoint registry as it is when the
iteration starts (read once per iteration), so a checkpoint registered after its rows were
stored still gives them lineage; null for a checkpoint that is not registered.
``max_policy_lag=N`` hands out only rows whose checkpoint is registered and at most N
generations behind the newest registered one (judged at the start of each iteration; the
ids travel as one ``Array(String)`` parameter). A row skipped that way is behind the cursor
afterwards, like any filtered row: registering its checkpoint later does not bring it back.

Speed: the rows come from the ``by_seq`` projection (rows sorted by ``_seq``),
so no sort of the wide rows; ``FINAL`` runs over the key columns only and keeps
the wide rows whose ``_seq`` survives (:mod:`.query`); on chDB the result is streamed
block by block. A reader cut short (closed mid-iteration) raises instead of
ending, so its position never jumps to the horizon. Blocking: iteration runs
three small queries (cursor, horizon, registry) and one streamed one;
:meth:`commit` one small insert.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from rewardflow.clickhouse.dsn import Dsn
from rewardflow.clickhouse.readers import Reader
from rewardflow.lineage.columns import LineageColumns, lineage_schema
from rewardflow.lineage.registry import Registry
from rewardflow.lineage.store import load_registry
from rewardflow.settings import Settings, load_settings
from rewardflow.rewards.registry import LEDGER_QUERY
from rewardflow.trainer.query import (checkpoint_known_sql, count_sql, cursor_of, horizon_sql, rewards_sql, spec_known_sql,
                                      spec_versions_sql)


class UnknownSpecVersion(ValueError):
    """The reader's ``spec_version`` is neither a registered reward spec nor the version of any stored row."""


class UnknownCheckpoint(ValueError):
    """The reader's ``checkpoint`` is neither registered nor the checkpoint of any stored reward."""


class RewardReader:
    """Iterate a trainer's new reward records; see the module doc for the guarantees."""

    def __init__(
        self,
        dsn: str | Dsn | None = None,
        *,
        trainer: str | None,
        checkpoint: str | None = None,
        spec_version: str | None = None,
        surface: str | None = None,
        arm: str | None = None,
        only_final: bool = True,
        max_policy_lag: int | None = None,
        batch_rows: int = 65_536,
        settle_s: float = 10.0,
        database: str | None = None,
        settings: Settings | None = None,
        reader: Reader | None = None,
    ) -> None:
        if trainer is not None and not trainer:
            raise ValueError("trainer name must not be empty (None = snapshot without a cursor)")
        if max_policy_lag is not None and max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be 0 or more, not {max_policy_lag}")
        from rewardflow.clickhouse.connect import open_reader

        self.trainer = trainer
        self.filters: dict[str, Any] = {
            "checkpoint_id": checkpoint, "spec_version": spec_version, "surface": surface,
            "experiment_arm": arm, "only_final": only_final, "max_policy_lag": max_policy_lag,
        }
        self.batch_rows = batch_rows
        self.settle_ms = int(settle_s * 1000)
        self._reader = reader or open_reader(settings or load_settings(), dsn=dsn, database=database)
        self._position: int | None = None  # _seq to commit
        self._handed = 0
        self._spec_checked = spec_version is None and checkpoint is None

    @property
    def cursor(self) -> int:
        """The trainer's committed cursor (0 if it never committed, or for a snapshot). One query."""
        return 0 if self.trainer is None else cursor_of(self._reader, self.trainer)

    def schema(self) -> pa.Schema:
        """The Arrow schema of the batches (record columns, ``_seq``, then the lineage columns)."""
        sql, params = rewards_sql(self._filters(Registry()), 0, 0)
        return lineage_schema(self._reader.query_arrow(sql, params).schema)

    def count_new(self) -> int:
        """Rows after the committed cursor that match the filters (ignores the settle window)."""
        self._check_spec()
        registry = load_registry(self._reader) if self.filters["max_policy_lag"] is not None else Registry()
        sql, params = count_sql(self._filters(registry), self.cursor)
        return int(self._reader.query_arrow(sql, params).column(0)[0].as_py())

    def spec_versions(self) -> list[str]:
        """The reward spec versions of the rows the filters match, new to the trainer or not. Without a
        ``spec_version`` filter, each sample comes once per version it was scored with."""
        self._check_spec()
        sql, params = spec_versions_sql({**self.filters, "checkpoint_ids": None})
        return [str(v) for v in self._reader.query_arrow(sql, params).column(0).to_pylist()]

    def _check_spec(self) -> None:
        """Raise :class:`UnknownSpecVersion` (:class:`UnknownCheckpoint`) when the ``spec_version``
        (``checkpoint``) filter names a version (a checkpoint) that is not registered and is on no stored
        row: a typo would otherwise match nothing, and a trainer's commit would move its cursor past every
        row it meant. Once a reader, a small query a filter (two when it fails)."""
        if self._spec_checked:
            return
        version, checkpoint = self.filters["spec_version"], self.filters["checkpoint_id"]
        if version is not None and self._reader.query_arrow(*spec_known_sql(str(version))).num_rows == 0:
            known = sorted({str(v) for v in self._reader.query_arrow(LEDGER_QUERY).column("version").to_pylist()})
            raise UnknownSpecVersion(
                f"spec_version {version!r} is not a registered reward spec and scored no stored row "
                f"(registered: {', '.join(known) or 'none'}); nothing was read and no cursor moved")
        if checkpoint is not None and self._reader.query_arrow(*checkpoint_known_sql(str(checkpoint))).num_rows == 0:
            raise UnknownCheckpoint(
                f"checkpoint {checkpoint!r} is not registered and served no stored reward (rewardflow checkpoints "
                "list, or SELECT DISTINCT checkpoint_id FROM rewards, lists them); nothing was read and no cursor moved")
        self._spec_checked = True

    def _filters(self, registry: Registry) -> dict[str, Any]:
        """The SQL filters: the reader's, and the checkpoints within ``max_policy_lag`` of ``registry``."""
        lag = self.filters["max_policy_lag"]
        return {**self.filters, "checkpoint_ids": None if lag is None else registry.within(lag)}

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """Yield the rows after the committed cursor in ``_seq`` order, batches of at most ``batch_rows``,
        each with the lineage columns of the registry read when the iteration starts."""
        self._check_spec()
        start = self.cursor
        horizon = int(self._reader.query_arrow(horizon_sql(), {"ms": self.settle_ms}).column(0)[0].as_py())
        self._position, self._handed = start, 0
        if horizon <= start:
            return
        registry = load_registry(self._reader)
        lineage = LineageColumns(registry)
        sql, params = rewards_sql(self._filters(registry), start, horizon)
        batches = (lineage.append(b) for b in self._reader.stream_arrow(sql, params))
        for batch in _rechunk(batches, self.batch_rows):
            self._position = int(batch.column("_seq")[-1].as_py())
            self._handed += batch.num_rows
            yield batch
        self._position = horizon  # exhausted: everything up to the horizon was seen

    def commit(self) -> int:
        """Persist the position reached by the last iteration; returns it. No-op before iterating."""
        if self.trainer is None:
            raise ValueError("a snapshot reader (trainer=None) has no cursor to commit")
        if self._position is None:
            return self.cursor
        filters = json.dumps({k: v for k, v in self.filters.items() if v is not None}, sort_keys=True)
        self._reader.advance_cursor(self.trainer, self._position, self._handed, filters)
        self._handed = 0
        return self._position

    def close(self) -> None:
        """Release the connection (uncommitted rows will be handed out again)."""
        self._reader.close()

    def __enter__(self) -> RewardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rechunk(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """Split record batches to at most ``size`` rows each; zero-copy (slices), order kept."""
    for batch in batches:
        for offset in range(0, batch.num_rows, size):
            yield batch.slice(offset, size)
