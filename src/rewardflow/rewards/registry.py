"""The reward spec registry: which specs exist, which are active, and the ledger.

A spec directory (``settings.reward_specs_dir``, default the bundled
``rewards/specs/``) holds one TOML file per version. The *ledger* maps each
version ever registered to its content hash, so a version names one reward
function forever: rewards stored under ``v1`` always mean the same weights.

Contracts:

* :func:`load_dir` raises :class:`SpecError` for an unreadable or invalid file,
  an empty directory, or two files declaring the same version (naming both).
* :func:`active_specs` returns the specs named by
  ``settings.active_spec_versions`` in that order (all, sorted by version, when
  empty); an unknown version is a :class:`SpecError` listing the known ones.
* :func:`check_against_ledger` is pure: it raises :class:`SpecError` naming the
  file and both hashes when a spec's content differs from the hash registered
  under its version. Versions missing from the ledger are new, not errors.
* :func:`check_and_register` reads the ClickHouse ledger (:data:`REWARD_SPECS_TABLE`,
  created if missing), checks, then inserts the new versions. Inserting is
  idempotent: the table keeps the first row per ``(version, content_hash)``
  and the insert carries a deduplication token.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from rewardflow.clickhouse.ddl import create_table
from rewardflow.clickhouse.tables_state import REWARD_SPECS
from rewardflow.core.records import stable_id
from rewardflow.rewards.spec import RewardSpec, SpecError, bundled_specs_dir, load_spec

# The ledger table is defined in the ClickHouse table catalogue and created by `rewardflow db
# migrate` (migration 4); check_and_register still creates it (IF NOT EXISTS) for an unmigrated database.
REWARD_SPECS_TABLE = REWARD_SPECS


@dataclass(frozen=True, slots=True)
class SpecFile:
    """A validated spec and the file it came from (``None`` when built in code)."""

    spec: RewardSpec
    path: Path | None = None

    @property
    def origin(self) -> str:
        return str(self.path) if self.path is not None else f"<spec {self.spec.version}>"


class LedgerClient(Protocol):
    """The slice of a ClickHouse client the ledger needs (clickhouse-connect shaped)."""

    def query(self, query: str, parameters: Mapping[str, Any] | None = None) -> Any: ...

    def command(self, cmd: str) -> Any: ...

    def insert(self, table: str, data: Sequence[Sequence[Any]], column_names: Sequence[str],
               settings: Mapping[str, Any] | None = None) -> Any: ...


def specs_dir(settings: Any | None = None) -> Path:
    """The configured spec directory, else the bundled one."""
    configured = getattr(settings, "reward_specs_dir", None)
    return Path(configured) if configured is not None else bundled_specs_dir()


def load_dir(directory: Path) -> list[SpecFile]:
    """Every ``*.toml`` spec of ``directory``, sorted by version."""
    if not directory.is_dir():
        raise SpecError(f"{directory}: not a directory of reward specs")
    files = [SpecFile(load_spec(p), p) for p in sorted(directory.glob("*.toml"))]
    if not files:
        raise SpecError(f"{directory}: no reward spec files (*.toml)")
    seen: dict[str, SpecFile] = {}
    for f in files:
        other = seen.setdefault(f.spec.version, f)
        if other is not f:
            raise SpecError(f"version {f.spec.version!r} is declared twice: {other.origin} and {f.origin}")
    return sorted(files, key=lambda f: f.spec.version)


def select_active(files: Sequence[SpecFile], versions: Sequence[str]) -> list[SpecFile]:
    """The files of ``versions`` in that order; all of them when ``versions`` is empty."""
    if not versions:
        return list(files)
    by_version = {f.spec.version: f for f in files}
    unknown = [v for v in versions if v not in by_version]
    if unknown:
        raise SpecError(f"active spec version(s) {unknown} not found; known versions: {sorted(by_version)} "
                        "(fix REWARDFLOW_ACTIVE_SPEC_VERSIONS or add the spec file)")
    return [by_version[v] for v in versions]


def active_specs(settings: Any) -> list[RewardSpec]:
    """The specs the stream scores live, honouring ``settings.active_spec_versions``."""
    files = load_dir(specs_dir(settings))
    return [f.spec for f in select_active(files, list(getattr(settings, "active_spec_versions", [])))]


def _as_files(specs: Iterable[SpecFile | RewardSpec]) -> list[SpecFile]:
    return [s if isinstance(s, SpecFile) else SpecFile(s) for s in specs]


def check_against_ledger(specs: Iterable[SpecFile | RewardSpec], ledger: Mapping[str, str]) -> None:
    """Refuse any spec whose content changed under an already registered version."""
    for f in _as_files(specs):
        registered = ledger.get(f.spec.version)
        if registered is not None and registered != f.spec.content_hash:
            raise SpecError(
                f"{f.origin}: spec version {f.spec.version!r} was registered with content hash {registered}, "
                f"but this file hashes to {f.spec.content_hash}; a version can never change — "
                "give the changed spec a new version"
            )


def ledger_from_rows(rows: Iterable[Sequence[Any]]) -> dict[str, str]:
    """version → content hash from ``(version, content_hash)`` rows; SpecError on a conflict."""
    ledger: dict[str, str] = {}
    for version, content_hash in sorted((str(r[0]), str(r[1])) for r in rows):
        prev = ledger.setdefault(version, content_hash)
        if prev != content_hash:
            raise SpecError(f"ledger conflict: version {version!r} is registered with hashes {prev} and {content_hash}")
    return ledger


LEDGER_QUERY = f"SELECT DISTINCT version, content_hash FROM {REWARD_SPECS_TABLE.name}"


def read_ledger(client: LedgerClient) -> dict[str, str]:
    """The registered ledger. Blocks on one query; SpecError if the table holds a conflict."""
    return ledger_from_rows(client.query(LEDGER_QUERY).result_rows)


def check_and_register(client: LedgerClient, specs: Iterable[SpecFile | RewardSpec], now_ms: int | None = None) -> list[str]:
    """Check ``specs`` against the ledger, register the new ones; return the new versions.

    Blocks on two queries and at most one insert. Two processes registering
    *different* content under one new version at the same instant both
    succeed; the next read of the ledger then reports the conflict.
    """
    files = _as_files(specs)
    client.command(create_table(REWARD_SPECS_TABLE))
    ledger = read_ledger(client)
    check_against_ledger(files, ledger)
    new = {f.spec.version: f.spec for f in files if f.spec.version not in ledger}
    if new:
        at = int(time.time() * 1000) if now_ms is None else now_ms
        rows = [[s.version, s.content_hash, s.description, s.weights.model_dump_json(), at] for s in new.values()]
        token = stable_id("reward_specs", *(f"{v}={s.content_hash}" for v, s in sorted(new.items())))
        client.insert(REWARD_SPECS_TABLE.name, rows, column_names=list(REWARD_SPECS_TABLE.record_columns),
                      settings={"insert_deduplication_token": token})
    return sorted(new)


def prepare_database(settings: Any) -> None:
    """Make the configured database ready for a run: create it, apply the migrations, and register the
    active reward specs. Raises :class:`SpecError` when a spec's content changed under a registered
    version (refused at start)."""
    from rewardflow.clickhouse.connect import as_dsn, get_client
    from rewardflow.clickhouse.migrate import ensure_database, migrate

    dsn = as_dsn(settings.dsn)
    ensure_database(dsn)
    client = get_client(dsn=dsn)
    migrate(client, events_ttl_days=settings.events_ttl_days)
    check_and_register(cast(Any, client), select_active(load_dir(specs_dir(settings)), settings.active_spec_versions))
