"""The local schema catalogue: Avro schemas in ``schemas/`` and their wire ids.

A schema's id is derived, not registered: the low 31 bits of the CRC-64-AVRO
fingerprint of its parsing canonical form. Every node computes the same ids
from the same files, so no registry service is needed. Older versions kept in
``schemas/history/`` stay decodable because their ids are catalogued too.

Contract: :func:`default_catalogue` reads the files once per process (cached)
and raises ``FileNotFoundError`` if the schema directory is missing.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form

from rewardflow.events import codegen

NAMESPACE = codegen.NAMESPACE
BATCH = "EventBatch"
EVENT_TYPES = codegen.EVENT_TYPES


def schema_dir() -> Path:
    """``$REWARDFLOW_SCHEMA_DIR`` or the repository's ``schemas/`` next to ``src/``."""
    env = os.environ.get("REWARDFLOW_SCHEMA_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "schemas" / f"{NAMESPACE}.{BATCH}.avsc").is_file():
            return parent / "schemas"
    raise FileNotFoundError("schemas/ not found: set REWARDFLOW_SCHEMA_DIR")


def schema_id(parsed: Any) -> int:
    """Stable 31-bit id of a parsed schema."""
    fp = fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    return int(fp, 16) & 0x7FFFFFFF


@dataclass(frozen=True)
class CatalogueEntry:
    name: str  # short record name, e.g. "AgentEdit" or "EventBatch"
    schema_id: int
    parsed: Any  # fastavro-parsed schema
    path: Path


@dataclass
class Catalogue:
    """Current writer schema per name, and every known schema by id."""

    current: dict[str, CatalogueEntry] = field(default_factory=dict)
    by_id: dict[int, CatalogueEntry] = field(default_factory=dict)

    def writer(self, name: str) -> CatalogueEntry:
        return self.current[name]


def _load(path: Path) -> Any:
    return fastavro.parse_schema(load_schema(str(path)))


class ModelsStale(RuntimeError):
    """``rewardflow.events.models`` was generated from other schemas than the ones being loaded."""


def check_models(directory: Path) -> None:
    """Raise :class:`ModelsStale` unless the event models were generated from ``directory``'s schemas."""
    from rewardflow.events import models  # here, so that `rewardflow codegen` runs even when models.py is broken

    if codegen.schema_digest(codegen.load_sources(directory)) != models.SCHEMA_DIGEST:
        raise ModelsStale(f"the schemas in {directory} differ from those rewardflow/events/models.py was "
                          "generated from: run `rewardflow codegen`")


def load_catalogue(directory: Path) -> Catalogue:
    """Parse every event schema and the batch schema in ``directory``; raises :class:`ModelsStale`
    when the event models were generated from other schemas (so they cannot disagree)."""
    check_models(directory)
    cat = Catalogue()
    for name in (*EVENT_TYPES, BATCH):
        path = directory / f"{NAMESPACE}.{name}.avsc"
        parsed = _load(path)
        entry = CatalogueEntry(name, schema_id(parsed), parsed, path)
        cat.current[name] = entry
        cat.by_id[entry.schema_id] = entry
    history = directory / "history"
    if history.is_dir():
        for path in sorted(history.glob("*.avsc")):
            # history files are named <Name>.v<N>.avsc and self-contained
            parsed = fastavro.parse_schema(load_schema(str(path)))
            name = path.name.split(".")[0]
            cat.by_id.setdefault(schema_id(parsed), CatalogueEntry(name, schema_id(parsed), parsed, path))
    return cat


@functools.lru_cache(maxsize=1)
def default_catalogue() -> Catalogue:
    return load_catalogue(schema_dir())
