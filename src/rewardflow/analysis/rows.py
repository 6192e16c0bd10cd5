"""Reward rows in, per-arm samples out: the input side of the A/B analysis.

Rows are :class:`~rewardflow.core.rows.RewardRecord` columns, given as a
``pyarrow.Table`` or any iterable of mappings (Kafka payloads, ClickHouse
rows). Only **final** rows count (``provisional == 0``), each ``reward_id``
once (the first seen wins; ids are deterministic, so duplicates are equal),
under ONE reward spec version: the spec changes the reward, not the
behaviour features, and every turn has one final row per active spec.

Map columns (``persisted``, ``checked``) may arrive as dicts with int or str
keys, or as Arrow map values (lists of ``(key, value)`` pairs).

Contract: pure; :func:`final_rows` raises :class:`AnalysisError` when the
rows lack a required column or hold no final rows.
"""

from __future__ import annotations

import re
from datetime import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

REQUIRED = ("reward_id", "checkpoint_id", "spec_version", "provisional", "horizon_s", "reward", "latency_ms",
            "n_edits", "n_dissatisfied", "n_clarifying", "n_tool_broken", "persisted", "checked")


class AnalysisError(ValueError):
    """The rows cannot answer the question asked (missing column, checkpoint or spec)."""


def int_map(value: Any) -> dict[int, int]:
    """A map column as ``{int: int}`` (dict, list of pairs or None)."""
    if not value:
        return {}
    items = value.items() if isinstance(value, Mapping) else value
    return {int(k): int(v) for k, v in items}


def epoch_ms(value: Any) -> int:
    """An event-time column as epoch ms (int, or a datetime from a DateTime64 column)."""
    if isinstance(value, datetime):
        return round(value.timestamp() * 1000)
    return int(value)


def to_dicts(rows: Any) -> list[dict[str, Any]]:
    """Rows of a ``pyarrow.Table`` (anything with ``to_pylist``) or an iterable of mappings."""
    if hasattr(rows, "to_pylist"):
        return list(rows.to_pylist())
    return [dict(r) for r in rows]


def require_columns(data: list[dict[str, Any]]) -> None:
    """Raise :class:`AnalysisError` naming the required columns the rows lack."""
    if data:
        missing = [c for c in REQUIRED if c not in data[0]]
        if missing:
            raise AnalysisError(f"reward rows lack column(s) {', '.join(missing)}")


def _natural(version: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", version))


def final_rows(rows: Any, spec_version: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """Final, deduplicated rows of one spec, and that spec's version: one row per sample, its latest
    revision (the highest ``revision``; rows without the column are revision 0).

    ``spec_version=None`` picks the highest version present (natural order:
    ``v10`` > ``v9``).
    """
    data = to_dicts(rows)
    require_columns(data)
    final = [r for r in data if int(r["provisional"]) == 0]
    versions = sorted({str(r["spec_version"]) for r in final}, key=_natural)
    if not versions:
        raise AnalysisError("no final reward rows (provisional = 0) to analyse")
    spec = spec_version or versions[-1]
    if spec not in versions:
        raise AnalysisError(f"no final reward rows under spec {spec!r}; present: {', '.join(versions)}")
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in final:
        if r["spec_version"] != spec:
            continue
        # a turn is (org, session, request): rows without those columns (a file of rewards) go by sample_id
        key = (str(r.get("org_id") or ""), str(r.get("session_id") or ""), str(r.get("sample_id") or r["reward_id"]))
        cur = latest.get(key)
        if cur is None or int(r.get("revision") or 0) > int(cur.get("revision") or 0):
            latest[key] = r
    return list(latest.values()), spec


@dataclass(slots=True)
class ArmSample:
    """Per-turn features of one checkpoint's final rows (one list entry per turn)."""

    checkpoint_id: str
    reward: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    persisted: list[int] = field(default_factory=list)  # edits persisted at the final horizon
    checked: list[int] = field(default_factory=list)  # edits checked at the final horizon
    dissatisfied: list[int] = field(default_factory=list)  # 1 when n_dissatisfied > 0
    clarifying: list[int] = field(default_factory=list)  # 1 when n_clarifying > 0
    broken: list[int] = field(default_factory=list)  # 1 when n_tool_broken > 0
    edited: list[int] = field(default_factory=list)  # 1 when n_edits > 0

    @property
    def turns(self) -> int:
        return len(self.reward)

    def add(self, r: Mapping[str, Any]) -> None:
        h = int(r["horizon_s"])
        self.reward.append(float(r["reward"]))
        self.latency_ms.append(float(r["latency_ms"]))
        self.persisted.append(int_map(r["persisted"]).get(h, 0))
        self.checked.append(int_map(r["checked"]).get(h, 0))
        self.dissatisfied.append(int(int(r["n_dissatisfied"]) > 0))
        self.clarifying.append(int(int(r["n_clarifying"]) > 0))
        self.broken.append(int(int(r["n_tool_broken"]) > 0))
        self.edited.append(int(int(r["n_edits"]) > 0))


def arm_samples(rows: Iterable[Mapping[str, Any]], checkpoints: Iterable[str]) -> dict[str, ArmSample]:
    """One :class:`ArmSample` per requested checkpoint (empty when it has no rows)."""
    out = {c: ArmSample(c) for c in checkpoints}
    for r in rows:
        arm = out.get(str(r["checkpoint_id"]))
        if arm is not None:
            arm.add(r)
    return out
