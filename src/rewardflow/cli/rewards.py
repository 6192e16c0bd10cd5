"""``rewardflow rewards list | check | replay``: reward specs, their ledger, and rescoring.

* ``list``: the specs of the spec directory, their hashes and which are active.
* ``check [DIR]``: validate a directory (duplicates, active versions, the
  broken-call weight checks) and compare it with the ClickHouse ledger
  (``--offline`` skips that; ``--register`` records new versions).
* ``replay --spec FILE``: recompute final rewards from the ``events`` table with
  the stream's own code (:func:`rewardflow.rewards.replay.replay_partition`),
  diff them against ``--against``; with ``--store``, also write them under the spec's version
  (idempotent: same reward ids and insert tokens). By default nothing is written.

Exit codes: 0 done; 2 a fixable error (invalid spec, changed spec under an
existing version, database unavailable), always one line on stderr.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rewardflow.analysis.audit import spec_flags
from rewardflow.core.config import JoinConfig
from rewardflow.core.rows import RewardRecord
from rewardflow.rewards.diff import diff_rewards, render_diff
from rewardflow.rewards.registry import (
    LEDGER_QUERY,
    SpecFile,
    check_against_ledger,
    check_and_register,
    ledger_from_rows,
    load_dir,
    select_active,
    specs_dir,
)
from rewardflow.rewards.replay import ReplayRange, in_range, records_by_partition, replay_partition, replay_token
from rewardflow.rewards.spec import RewardSpec, SpecError, load_spec
from rewardflow.settings import load_settings

app = typer.Typer(help="Reward specs: list, check and replay.", no_args_is_help=True, add_completion=False)
INSERT_ROWS = 50_000
MAP_COLUMNS = frozenset({"components", "persistence", "persisted", "checked", "latency_hist"})


# ---------------------------------------------------------------- storage helpers (also used by audit, alerts)
def fail(message: str) -> typer.Exit:
    """Print one ``error:`` line on stderr; the caller raises the returned exit (code 2)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def parse_time(text: str | None) -> int | None:
    """Epoch milliseconds from ``1790000000000`` or ISO 8601 (naive = UTC)."""
    if text is None or text.lstrip("-").isdigit():
        return None if text is None else int(text)
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise fail(f"bad time {text!r}: give epoch milliseconds or ISO 8601 such as 2026-03-26T12:00") from None
    return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp() * 1000)


class Store:
    """Reads through a read-only :class:`~rewardflow.clickhouse.readers.Reader`, or — opened for writing — a client."""

    def __init__(self, reader: Any, client: Any | None) -> None:
        self.reader, self.client = reader, client

    def rows(self, sql: str, params: dict[str, Any], missing_ok: bool = False) -> list[dict[str, Any]]:
        """Rows as dicts (Map columns as dicts). Raises the exit of :func:`fail` on any error."""
        try:
            # a writing store reads through its own client: chDB keeps `readonly` set by a read-only query
            table = self.client.query_arrow(sql, parameters=params) if self.client is not None else self.reader.query_arrow(sql, params)
        except Exception as exc:
            msg = (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
            if missing_ok and any(k in msg for k in ("UNKNOWN_TABLE", "Unknown table", "does not exist", "doesn't exist")):
                return []
            raise fail(f"query failed: {msg}") from None
        return [{k: dict(v) if k in MAP_COLUMNS and v is not None else v for k, v in r.items()} for r in table.to_pylist()]

    def insert(self, table: str, rows: Sequence[Any], token: str) -> int:
        """One JSONEachRow insert under ``token`` (a replayed token is dropped by ClickHouse)."""
        from rewardflow.clickhouse.catalog import table as table_def
        from rewardflow.sink.writer import STRICT_INPUT

        assert self.client is not None, "store opened read-only"
        body = b"\n".join(orjson.dumps(r, option=orjson.OPT_NON_STR_KEYS) for r in rows)
        if body:
            self.client.raw_insert(table, list(table_def(table).record_columns), body, fmt="JSONEachRow",
                                   settings={**STRICT_INPUT, "insert_deduplication_token": token})
        return len(rows)


@contextmanager
def open_store(settings: Any, write: bool = False) -> Iterator[Store]:
    """A read-only store (any DSN; a busy chDB via its owner's endpoint), or a writing one in this process."""
    from rewardflow.clickhouse.connect import get_client, open_reader
    from rewardflow.clickhouse.readers import LocalReader

    try:
        client = get_client(dsn=settings.dsn) if write else None
        reader = LocalReader(client, "rewardflow") if client is not None else open_reader(settings)
    except Exception as exc:
        msg = (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
        hint = (" (writing needs this process to own the chDB directory: stop the pipeline that owns it, or leave out "
                "--store / --register)") if write else ""
        raise fail(f"cannot open ClickHouse: {msg}{hint}") from None
    try:
        yield Store(reader, client)
    finally:
        reader.close()


# ---------------------------------------------------------------- commands


def _specs(directory: Path | None) -> tuple[Path, list[SpecFile], set[str]]:
    settings = load_settings()
    d = directory or specs_dir(settings)
    try:
        files = load_dir(d)
        active = {f.spec.version for f in select_active(files, settings.active_spec_versions)} if directory is None else set()
    except SpecError as exc:
        raise fail(str(exc)) from None
    return d, files, active


@app.command("list")
def list_specs(directory: Annotated[Path | None, typer.Option("--dir", help="Spec directory (default: configured).")] = None) -> None:
    """List the reward specs, their content hashes and which are active."""
    d, files, active = _specs(directory)
    t = Table("version", "hash", "active", "file", "description", title=f"reward specs in {d}")
    for f in files:
        t.add_row(f.spec.version, f.spec.content_hash, "yes" if f.spec.version in active else "", f.origin, f.spec.description)
    Console().print(t)


@app.command()
def check(
    directory: Annotated[Path | None, typer.Argument(help="Spec directory (default: configured).")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Do not compare with the ClickHouse ledger.")] = False,
    register: Annotated[bool, typer.Option("--register", help="Record new versions in the ledger.")] = False,
) -> None:
    """Validate specs; refuse any whose content changed under a registered version."""
    d, files, _ = _specs(directory)
    err = Console(stderr=True)
    for f in files:
        for flag in spec_flags(f.spec):
            err.print(f"[yellow]warning[/]: {f.origin}: {flag}")
    if not offline:
        settings = load_settings()
        with open_store(settings, write=register) as store:
            try:
                if store.client is not None:
                    new = check_and_register(store.client, files)
                    typer.echo(f"registered: {', '.join(new) or 'nothing new'}")
                else:
                    rows = store.rows(LEDGER_QUERY, {}, missing_ok=True)
                    check_against_ledger(files, ledger_from_rows([(r["version"], r["content_hash"]) for r in rows]))
            except SpecError as exc:
                raise fail(str(exc)) from None
    typer.echo(f"ok: {len(files)} spec(s) in {d}: {', '.join(f.spec.version for f in files)}")


def _range_conds(rng: ReplayRange, ts: str, checkpoint: str) -> tuple[list[str], dict[str, Any]]:
    """SQL conditions and their parameters selecting ``rng`` by the time column ``ts`` and the checkpoint expression."""
    conds: list[str] = []
    params: dict[str, Any] = {}
    if rng.start_ms is not None:
        conds.append(f"{ts} >= {{start:Int64}}")
        params["start"] = rng.start_ms
    if rng.end_ms is not None:
        conds.append(f"{ts} < {{end:Int64}}")
        params["end"] = rng.end_ms
    if rng.checkpoint_id:
        conds.append(f"{checkpoint} = {{ck:String}}")
        params["ck"] = rng.checkpoint_id
    return conds, params


def _event_filter(rng: ReplayRange) -> tuple[str, dict[str, Any]]:
    """SQL condition selecting the events of turns served in ``rng`` ('' = every event)."""
    conds, params = _range_conds(rng, "ts", "JSONExtractString(payload, 'checkpoint_id')")
    if not conds:
        return "", {}
    served = " AND ".join(["event_type = 'InferenceServed'", *conds])
    return (f" AND (org_id, session_id, request_id) IN (SELECT org_id, session_id, request_id FROM events "
            f"WHERE {served})", params)


_EVENT = "org_id, session_id, request_id, event_id"  # an event, as the events table keys it


def run_replay(store: Store, spec: RewardSpec, cfg: JoinConfig, rng: ReplayRange, tally: Counter[str]) -> list[RewardRecord]:
    """Replay every partition's stored events (one partition in memory at a time), with a progress bar."""
    cond, params = _event_filter(rng)
    parts = [int(r["p"]) for r in store.rows(f"SELECT DISTINCT source_partition AS p FROM events WHERE 1{cond} ORDER BY p", params)]
    total = int(store.rows(f"SELECT count() AS n FROM events WHERE 1{cond}", params)[0]["n"])
    out: list[RewardRecord] = []
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"replaying {spec.version}", total=total)
        for p in parts:
            rows = store.rows(
                f"SELECT {_EVENT}, source_partition, source_offset, payload FROM events "
                f"WHERE source_partition = {{p:UInt32}}{cond} ORDER BY source_offset LIMIT 1 BY {_EVENT}",
                {**params, "p": p})
            records = records_by_partition(rows).get(p, [])
            out.extend(replay_partition(records, spec, cfg, p, lambda n: bar.advance(task, n), tally))
    return in_range(out, rng)


def stored_rows(store: Store, version: str, rng: ReplayRange) -> list[dict[str, Any]]:
    conds, params = _range_conds(rng, "served_ts", "checkpoint_id")
    where = " AND ".join(["spec_version = {v:String}", "provisional = 0", *conds])
    turn = "org_id, session_id, sample_id"
    return store.rows(f"SELECT {turn}, spec_version, checkpoint_id, provisional, reward, components FROM rewards "
                      f"WHERE {where} ORDER BY {turn}, revision DESC LIMIT 1 BY {turn}", {"v": version, **params})


def _default_against(version: str) -> str | None:
    settings = load_settings()
    try:
        files = select_active(load_dir(specs_dir(settings)), settings.active_spec_versions)
    except SpecError:
        return None
    return next((f.spec.version for f in files if f.spec.version != version), None)


@app.command()
def replay(
    spec: Annotated[Path, typer.Option("--spec", help="Spec TOML file to score with.")],
    start: Annotated[str | None, typer.Option("--from", help="Served at or after (epoch ms or ISO 8601, UTC).")] = None,
    end: Annotated[str | None, typer.Option("--to", help="Served before (epoch ms or ISO 8601, UTC).")] = None,
    checkpoint: Annotated[str | None, typer.Option("--checkpoint", help="Only turns served by this checkpoint.")] = None,
    against: Annotated[str | None, typer.Option("--against", help="Stored spec version to diff with (default: first other active).")] = None,
    store_rows: Annotated[bool, typer.Option("--store/--dry-run", help="--store: also write the recomputed rewards under SPEC's version (registering it), where trainers and exports that ask for that version read them; by default it only computes and diffs, writing nothing.")] = False,
    top: Annotated[int, typer.Option("--top", min=0, help="Samples to list by |change|.")] = 10,
    json_out: Annotated[bool, typer.Option("--json", help="Print the diff as JSON.")] = False,
) -> None:
    """Recompute rewards from stored events under SPEC and diff them against a stored version (--store also writes them)."""
    try:
        spec_file = SpecFile(load_spec(spec), spec)
    except SpecError as exc:
        raise fail(str(exc)) from None
    settings = load_settings()
    rng = ReplayRange(parse_time(start), parse_time(end), checkpoint)
    against = against or _default_against(spec_file.spec.version)
    with open_store(settings, write=store_rows) as store:
        try:
            if store.client is not None:
                check_and_register(store.client, [spec_file])
            else:  # a what-if: still refused when its content differs from a registered version's
                rows = store.rows(LEDGER_QUERY, {}, missing_ok=True)
                check_against_ledger([spec_file], ledger_from_rows([(r["version"], r["content_hash"]) for r in rows]))
        except SpecError as exc:
            raise fail(str(exc)) from None
        tally: Counter[str] = Counter()
        records = run_replay(store, spec_file.spec, JoinConfig.from_settings(settings), rng, tally)
        old = stored_rows(store, against, rng) if against else []
        written = 0
        if store.client is not None:
            for i in range(0, len(records), INSERT_ROWS):
                written += store.insert("rewards", records[i:i + INSERT_ROWS], replay_token(spec_file.spec, rng, i // INSERT_ROWS))
    d = diff_rewards(old, records, top=top)
    replayed = {(r["org_id"], r["session_id"], r["sample_id"]) for r in records}
    orphaned = len({(str(r["org_id"]), str(r["session_id"]), str(r["sample_id"])) for r in old} - replayed)
    if orphaned:
        typer.echo(f"warning: {orphaned:,} stored {against} rewards have no stored events to replay (removed from "
                   "`events` by retention, or never stored); they show as only in the old version", err=True)
    note = f"{len(records)} final rewards under {spec_file.spec.version} ({rng.describe()}); " + (
        f"{written} rows sent (duplicates are dropped)" if store_rows else "nothing written (--store writes them)")
    if tally:
        note += f"; set aside as the stream sets them aside (orphan turns, duplicates): {dict(tally)}"
    if json_out:
        doc = {"note": note, "diff": asdict(d), "mean_delta": d.mean_delta, "flip_fraction": d.flip_fraction,
               "without_events": orphaned}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    out = Console()
    out.print(note)
    if against:
        for t in render_diff(d):
            out.print(t)
    else:
        out.print("no other active spec version to diff against (use --against)")
