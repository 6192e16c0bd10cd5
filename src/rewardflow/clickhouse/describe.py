"""Documentation of every table and view, generated from the definitions. Pure.

``docs/tables.md`` is the output of :func:`markdown` (``rewardflow db describe
--markdown > docs/tables.md``); a test fails when the file and the
definitions disagree.
"""

from __future__ import annotations

from rewardflow.clickhouse.catalog import ALL_TABLES
from rewardflow.clickhouse.columns import DEDUP_WINDOW, TableDef
from rewardflow.clickhouse.ddl import ttl_clause
from rewardflow.clickhouse.views import ALL_VIEWS
from rewardflow.kafka.topics import TABLE_OF_TOPIC

INTRO = f"""# ClickHouse tables

Generated from `src/rewardflow/clickhouse/tables*.py` by `rewardflow db describe --markdown`;
do not edit by hand. Create or upgrade a database with `rewardflow db migrate`.

## Conventions

- **Record columns** are the fields of the record TypedDicts in `rewardflow.core.rows` (generated from these definitions), same
  names, same order. A row read back is the record that was produced.
- **Time** travels as epoch milliseconds (`Int64`) under the record's own name (`ts`,
  `served_ts`, ...). Each has a `DateTime64(3, 'UTC')` *alias* column (`ts_at`, `served_at`, ...)
  for SQL convenience; aliases are computed on read and are not part of `SELECT *`.
- **Sink columns** (`_seq`, `_inserted_at`, `_keep`) are filled by ClickHouse at insert; a
  producer cannot set them (incoming fields of those names are ignored).
- **Deduplication**: every sink-fed table is a `ReplacingMergeTree` keyed by the record's
  deterministic id. Inserts carry `insert_deduplication_token` = (topic, partition, first offset,
  last offset), and tables keep the last {DEDUP_WINDOW:,} tokens
  (`non_replicated_deduplication_window`), so a replayed batch is dropped at insert. Anything that
  still gets in twice collapses at merge time; read with `FINAL` (the views do) or `argMax`.
- **Keep-first**: `_keep = bitNot(_seq)` is the replacing version, so of two copies of a key the
  *first* inserted survives (`reward_windows` keeps the last instead: a re-emitted partial
  replaces the older one).

## Cursors

`_seq` is `generateSnowflakeID()` evaluated per row at insert: unique and increasing on one
server or chDB engine, and its high bits are the insert time in ms. A trainer reads
`rewards FINAL WHERE cursor < _seq <= horizon`, where `horizon` is the Snowflake id of
*now - settle* (10 s by default), and commits the last `_seq` it handed out to
`trainer_cursors`. Each sample goes to a trainer exactly once across restarts because:
a later duplicate collapses under `FINAL` into its first copy, whose `_seq` the cursor already
passed; rows from inserts still running when the read starts are newer than the horizon, so no row
can become visible behind the cursor; uncommitted rows are handed out again.

The read: `FINAL` over the key, version and filter columns only yields the `_seq` of the surviving
rows of the window, and the wide rows are read with `_seq IN` those, from the projection `by_seq`
(the rows sorted by `_seq`, written with each insert), already in the order the trainer gets them.
Merges merge `by_seq` as they merge the table, without sorting it again, so it keeps the copies a
merge removed from the table; the `_seq IN` step is what leaves them out, which is why it is never
skipped. A read without `FINAL` that ClickHouse answers from `by_seq` (a filter on `_seq`) sees every
copy ever inserted, as it would in a table that was never merged.

## Corrections

A signal for a finalised turn dated within `REWARDFLOW_CORRECTION_WINDOW_MS` (1 h by default) of
the turn's final deadline, and arriving no later than the window plus the grace period after the
turn was finalised, re-scores the turn under every active spec. The worker emits a new
*revision* of its reward rows: the same `sample_id`, `revision` one higher, its own `reward_id`,
`finalised_by = 'correction'`. Earlier revisions stay stored; `rewards_latest` and
`rewards_daily` read each sample's highest revision. A trainer's cursor hands a revision out like
any new row (it is one), so the trainer sees `revision > 0` and may apply it (replace the sample's
reward) or skip it. For the windows, the worker adds one delta partial per window size and spec
(`samples` 0; the latest revision minus the first scoring, so counts may be negative) under its own
`window_id`; the next correction of the turn replaces it, so `windows_merged` counts each turn as
its latest revision. Signals past the window go to `late_events`.
"""


def table_markdown(t: TableDef, events_ttl_days: int = 90) -> str:
    """One table's section."""
    topics = [topic for topic, name in TABLE_OF_TOPIC.items() if name == t.name]
    lines = [f"### `{t.name}`", "", t.doc, ""]
    if t.record:
        lines.append(f"- Record: `rewardflow.core.rows.{t.record}`; fed from topic `{topics[0]}`" if topics else f"- Record: `{t.record}`")
    lines.append(f"- Engine: `{t.engine}`, order by `{t.order_by}`")
    if t.partition_by:
        lines.append(f"- Partition by `{t.partition_by}`")
    if t.ttl:
        lines.append(f"- TTL `{ttl_clause(t, events_ttl_days)}`" + (" (days: `events_ttl_days`)" if "{" in t.ttl else ""))
    settings = t.table_settings()
    if settings:
        lines.append("- Settings: " + ", ".join(f"`{k} = {v}`" for k, v in settings.items()))
    for p in t.projections:
        lines.append(f"- Projection `{p.name}`: `{p.select}`. {p.doc}")
    lines += ["", "| column | type | filled by | description |", "|---|---|---|---|"]
    for c in t.columns:
        filled = {"record": "producer", "sink": f"`DEFAULT {c.expr}`", "materialized": f"`MATERIALIZED {c.expr}`", "alias": "alias"}[c.kind]
        lines.append(f"| `{c.name}` | `{c.type}` | {filled} | {c.doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def markdown(events_ttl_days: int = 90) -> str:
    """The whole of ``docs/tables.md``."""
    parts = [INTRO, "## Tables\n"]
    parts += [table_markdown(t, events_ttl_days) for t in ALL_TABLES]
    parts.append("## Views\n")
    for v in ALL_VIEWS:
        parts.append(f"### `{v.name}`\n\n{v.doc}\n\n```sql\n{v.select.strip()}\n```\n")
    return "\n".join(parts)
