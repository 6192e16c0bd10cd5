"""Reads of the ClickHouse tables the analysis needs (``rewards``, ``reward_windows``, ``checkpoints``,
and the exclusions: ``late_events``, ``exclusions``, ``dead_letters``).

Kept in one small module so the analysis never touches a driver. Reads go
through :func:`rewardflow.clickhouse.connect.open_reader` (a server DSN, a
free chDB directory, or the read endpoint of the process owning it) and
return ``pyarrow.Table`` values. Rewards are
read final-only (``provisional = 0``) and once per sample, its latest revision
(``LIMIT 1 BY``, valid on any table engine); the analysis deduplicates again. Window partials are
read ``FINAL``: a corrected turn's delta partial is replaced by its next correction's.

Contract: raises :class:`SourceError` with a one-line, actionable message when
the database cannot be opened or a table is missing; never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rewardflow.lineage.registry import Registry
from rewardflow.settings import Settings

REWARD_COLUMNS = ("reward_id", "org_id", "session_id", "sample_id", "checkpoint_id", "experiment_arm", "surface",
                  "spec_version", "provisional", "horizon_s", "revision", "served_ts", "reward", "latency_ms", "n_edits",
                  "n_dissatisfied", "n_clarifying", "n_tool_broken", "persisted", "checked")
WINDOW_COLUMNS = ("window_id", "window_key", "window_start", "window_end", "window_size_s", "checkpoint_id",
                  "experiment_arm", "surface", "spec_version", "source_partition", "samples", "reward_sum",
                  "reward_sq_sum", "turns_with_edit", "turns_dissatisfied", "turns_followup", "turns_clarifying",
                  "turns_broken", "tool_calls", "tool_broken", "tool_error", "completion_tokens_sum",
                  "persisted", "checked", "latency_hist")


_BODY_TS = ("if(JSONType(tryBase64Decode(original_b64), 'ts') IN ('Int64', 'UInt64'), "
            "JSONExtract(tryBase64Decode(original_b64), 'ts', 'Nullable(Int64)'), NULL)")
"""A dead letter's event time: its JSON body's integer ``ts`` (as the balance reads it), else NULL."""


class SourceError(RuntimeError):
    """The reward tables cannot be read (database unavailable, table missing)."""


def _query(settings: Settings, sql: str, params: dict[str, Any]) -> Any:
    from rewardflow.clickhouse.connect import open_reader
    from rewardflow.clickhouse.errors import ClickHouseError

    try:
        reader = open_reader(settings)
    except ClickHouseError as exc:
        raise SourceError(f"cannot open ClickHouse: {_first_line(exc)}") from None
    except Exception as exc:  # driver errors vary by backend; report them in one line
        raise SourceError(f"cannot open ClickHouse at {_redact(settings.dsn)}: {_first_line(exc)}") from None
    try:
        return reader.query_arrow(sql, params)
    except Exception as exc:
        msg = _first_line(exc)
        if any(k in msg for k in ("UNKNOWN_TABLE", "Unknown table", "doesn't exist", "does not exist")):
            msg = msg[:160] + " (create the tables with `rewardflow db migrate`)"
        raise SourceError(f"query failed: {msg}") from None
    finally:
        reader.close()


def fetch_rewards(settings: Settings, checkpoints: Sequence[str], spec_version: str | None = None) -> Any:
    """Final reward rows of ``checkpoints`` (optionally one spec), each sample's latest revision, as a
    ``pyarrow.Table``."""
    where = "provisional = 0 AND checkpoint_id IN {ck:Array(String)}"
    params: dict[str, Any] = {"ck": list(checkpoints)}
    if spec_version:
        where += " AND spec_version = {spec:String}"
        params["spec"] = spec_version
    sql = (f"SELECT {', '.join(REWARD_COLUMNS)} FROM rewards WHERE {where} "
           "ORDER BY spec_version, org_id, session_id, sample_id, revision DESC "
           "LIMIT 1 BY spec_version, org_id, session_id, sample_id")
    return _query(settings, sql, params)


def fetch_windows(settings: Settings, checkpoints: Sequence[str], spec_version: str | None = None) -> Any:
    """Window partials of ``checkpoints`` (one row per ``window_id``) as a ``pyarrow.Table``."""
    where = "checkpoint_id IN {ck:Array(String)}"
    params: dict[str, Any] = {"ck": list(checkpoints)}
    if spec_version:
        where += " AND spec_version = {spec:String}"
        params["spec"] = spec_version
    sql = f"SELECT {', '.join(WINDOW_COLUMNS)} FROM reward_windows FINAL WHERE {where}"
    return _query(settings, sql, params)


def fetch_windows_all(settings: Settings) -> Any:
    """Every window partial (one row per ``window_id``), for the live monitors."""
    sql = f"SELECT {', '.join(WINDOW_COLUMNS)} FROM reward_windows FINAL"
    return _query(settings, sql, {})


def fetch_window_horizons(settings: Settings) -> dict[int, int]:
    """Per window size, the start before which every window is closed: the earliest of each partition's latest
    window start. A partition emits a window's partial only once it closed it, so once every partition that ever
    reported for a size has reported a later window, no partial of an earlier one can still be missing."""
    sql = ("SELECT window_size_s, min(latest) AS horizon FROM (SELECT window_size_s, source_partition, "
           "max(window_start) AS latest FROM reward_windows GROUP BY window_size_s, source_partition) "
           "GROUP BY window_size_s")
    return {int(r["window_size_s"]): int(r["horizon"]) for r in _query(settings, sql, {}).to_pylist()}


def fetch_changed_windows(settings: Settings, size_s: int, since_s: float, exclusions: bool = False) -> set[int]:
    """Starts of the windows of ``size_s`` with partials stored at or after ``since_s`` (epoch seconds), and
    with ``exclusions``, of those holding an exclusion or a dead letter (dated by its JSON body's ``ts``)
    stored since."""
    size_ms = size_s * 1000
    params: dict[str, Any] = {"size": size_s, "ms": size_ms, "since": since_s}
    after = "_inserted_at >= fromUnixTimestamp64Micro(toInt64({since:Float64} * 1000000))"
    sql = (f"SELECT DISTINCT window_start AS s FROM reward_windows WHERE window_size_s = {{size:UInt32}} AND {after}")
    if exclusions:
        sql += (f" UNION DISTINCT SELECT intDiv(ts, {{ms:Int64}}) * {{ms:Int64}} AS s FROM late_events WHERE {after}"
                f" UNION DISTINCT SELECT intDiv(ts, {{ms:Int64}}) * {{ms:Int64}} AS s FROM exclusions WHERE {after}"
                f" UNION DISTINCT SELECT intDiv(assumeNotNull({_BODY_TS}), {{ms:Int64}}) * {{ms:Int64}} AS s "
                f"FROM dead_letters WHERE {after} AND {_BODY_TS} IS NOT NULL")
    return {int(r["s"]) for r in _query(settings, sql, params).to_pylist()}


def fetch_windows_between(settings: Settings, size_s: int, start_ms: int, end_ms: int) -> Any:
    """Window partials of ``size_s`` starting in ``[start_ms, end_ms)`` (one row per ``window_id``)."""
    sql = (f"SELECT {', '.join(WINDOW_COLUMNS)} FROM reward_windows FINAL WHERE window_size_s = {{size:UInt32}} "
           "AND window_start >= {lo:Int64} AND window_start < {hi:Int64}")
    return _query(settings, sql, {"size": size_s, "lo": start_ms, "hi": end_ms})


def fetch_exclusions(settings: Settings, ts_range: tuple[int, int] | None = None) -> list[Any]:
    """Every turn-level exclusion and dead letter, reduced for the balance (:mod:`rewardflow.analysis.balance`);
    with ``ts_range``, those dated in ``[start, end)`` (a dead letter by the ``ts`` of its JSON body)."""
    from rewardflow.analysis.balance import REASONS, from_dead_letters, from_exclusions

    cols = "exclusion_id, reason, checkpoint_id, org_id, session_id, request_id, ts"
    params: dict[str, Any] = {"r": list(REASONS)}
    when, dead_when = "", ""
    if ts_range is not None:
        params.update(lo=ts_range[0], hi=ts_range[1])
        when = " AND ts >= {lo:Int64} AND ts < {hi:Int64}"
        dead_when = f" WHERE {_BODY_TS} >= {{lo:Int64}} AND {_BODY_TS} < {{hi:Int64}}"
    late = _query(settings, f"SELECT {cols} FROM (SELECT {cols} FROM late_events UNION ALL SELECT {cols} FROM exclusions) "
                            f"WHERE reason IN {{r:Array(String)}}{when} LIMIT 1 BY exclusion_id", params)
    dead = _query(settings, f"SELECT dead_letter_id, session_id, original_b64 FROM dead_letters{dead_when} "
                            "LIMIT 1 BY dead_letter_id", params)
    return [*from_exclusions(late.to_pylist()), *from_dead_letters(dead.to_pylist())]


def fetch_session_checkpoints(settings: Settings, sessions: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The checkpoint that served most of each session's final rewards, by (org, session) (sessions without one
    are absent)."""
    out: dict[tuple[str, str], str] = {}
    pairs = {s for s in sessions if s[1]}
    wanted = sorted({s[1] for s in pairs})
    for i in range(0, len(wanted), 5_000):
        rows = _query(settings, "SELECT org_id, session_id, topK(1)(checkpoint_id)[1] AS ck FROM rewards "
                                "WHERE provisional = 0 AND session_id IN {s:Array(String)} GROUP BY org_id, session_id",
                      {"s": wanted[i:i + 5_000]})
        for r in rows.to_pylist():
            if (key := (str(r["org_id"]), str(r["session_id"]))) in pairs:
                out[key] = str(r["ck"])
    return out


def fetch_balance(settings: Settings, window_rows: Any = (), *, window_s: int = 3600,
                  spec_version: str | None = None, ts_range: tuple[int, int] | None = None) -> Any:
    """The exclusion :class:`~rewardflow.analysis.balance.Balance`: scored turns from ``window_rows`` (partials of
    ``window_s`` under ``spec_version``), excluded turns from the tables (those dated in ``ts_range`` when given),
    attributed through their sessions."""
    from rewardflow.analysis.balance import balance

    items = fetch_exclusions(settings, ts_range)
    sessions = fetch_session_checkpoints(settings, [(x.org_id, x.session_id) for x in items if not x.checkpoint_id])
    return balance(window_rows, items, sessions, window_s=window_s, spec_version=spec_version)


def fetch_corrections(settings: Settings, spec_version: str) -> list[dict[str, Any]]:
    """Each corrected sample (turn) of ``spec_version``: its checkpoint, revisions, and first and latest reward."""
    turn = "org_id, session_id, sample_id"
    sql = (f"SELECT {turn}, any(checkpoint_id) AS checkpoint_id, max(revision) AS latest_revision, "
           "argMin(reward, revision) AS first_reward, argMax(reward, revision) AS latest_reward "
           "FROM rewards WHERE provisional = 0 AND spec_version = {spec:String} "
           f"GROUP BY {turn} HAVING latest_revision > 0 ORDER BY {turn}")
    rows = _query(settings, sql, {"spec": spec_version}).to_pylist()
    return [{**{k: v for k, v in r.items() if k != "latest_revision"}, "revision": r["latest_revision"]} for r in rows]


def fetch_registry(settings: Settings) -> Registry:
    """The checkpoint registry (policy lineage of the compared arms)."""
    from rewardflow.lineage.store import REGISTRY_SQL

    return Registry.from_rows(_query(settings, REGISTRY_SQL, {}).to_pylist())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or exc.__class__.__name__
    return text.splitlines()[0][:300]


def _redact(dsn: str) -> str:
    """The DSN without its password."""
    if "@" in dsn and "://" in dsn:
        scheme, rest = dsn.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return dsn
