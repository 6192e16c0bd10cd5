"""Sink throughput (Kafka -> RewardSink -> chDB) beside raw ``insert_arrow`` of the same rows, and
trainer export (RewardReader -> Arrow) throughput. Not a test.

For each run and each table (``rewards``; ``events`` too with ``--tables rewards,events``):

1. untimed: N realistic rows are packed ``--per-record`` to a Kafka value (an
   orjson list, as the stream worker emits them) and produced to a fresh topic
   of ``--partitions`` partitions;
2. sink: a :class:`RewardSink` on a fresh, migrated database reads the topic
   and writes the table with the default batching (``sink_batch_rows`` /
   ``sink_batch_seconds``); timed from the first records it receives (after
   the consumer-group join) until every row is written and committed; once the
   last record is read the tail is flushed at once (a finite input would
   otherwise add a ``sink_batch_seconds`` wait that a live stream never sees);
3. raw: the same rows, pre-built as one Arrow table with the table's types
   (untimed), are inserted with ``client.insert_arrow`` in slices of
   ``sink_batch_rows`` into a fresh database of the same engine; timed;
4. raw JSON (reference): the sink's own insert path without Kafka - the same
   JSONEachRow bodies inserted in ``sink_batch_rows`` slices; timed. The sink
   forwards the topic's JSON to ClickHouse, so this is its ceiling;
5. export (rewards only): a snapshot :class:`RewardReader` iterates every row of
   the sink's table as Arrow record batches (``FINAL``, ordered by ``_seq``);
   timed (the table as the sink left it: parts not necessarily merged). For
   reference, the same read (same plan: ``FINAL`` over the key columns, then the
   ``by_seq`` projection in ``_seq`` order) without the four Map columns.

6. export at scale (rewards, ``--export-rows``, default 1M; 0 skips it): the rows are
   inserted with ``insert_arrow`` in ``sink_batch_rows`` slices (the parts the sink
   writes, not merged) and, once the engine has no merge running (the earlier
   steps' databases merge in the background), a snapshot :class:`RewardReader` reads them all,
   ``--runs`` times, beside its floor: the engine's own ``ArrowStream`` output of
   the same statement (chunks counted, not parsed) on a chDB handle of this process.

Reports medians of the runs, the ratio sink / raw insert_arrow (target >= 0.5),
sink / raw JSON, and export rows/s (target >= 1M), prints a table and writes
``bench/results/sink.json`` (with the machine's load average: the numbers
move with it).

    python bench/bench_sink.py [--bootstrap HOST:PORT] [--rows 200000] [--runs 3] [--tables rewards,events]

Without ``--bootstrap`` a local Kafka broker is started (and stopped) in a temp dir.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
from confluent_kafka import Producer
from pydantic import SecretStr

from rewardflow.clickhouse.catalog import table as table_def
from rewardflow.clickhouse.connect import get_client
from rewardflow.clickhouse.ddl import create_database
from rewardflow.clickhouse.dsn import parse_dsn
from rewardflow.clickhouse.migrate import migrate
from rewardflow.sink.route import RewardSink
from rewardflow.sink.writer import STRICT_INPUT
from rewardflow.kafka_local.admin import create_topics, delete_topics
from rewardflow.settings import Settings
from rewardflow.trainer.reader import RewardReader

RESULTS = Path(__file__).resolve().parent / "results" / "sink.json"
T0 = 1_790_000_000_000
TOPIC_OF = {"rewards": "rewards", "events": "events.valid"}


def reward_row(i: int) -> dict[str, Any]:
    spec, sample = "v1", f"req-{i:09d}"
    return {
        "reward_id": f"{i:032x}", "sample_id": sample, "spec_version": spec, "spec_hash": "9f2c" * 8, "org_id": f"org-{i % 13}",
        "session_id": f"sess-{i // 8:08d}", "checkpoint_id": f"ck-{i % 3}", "experiment_arm": ("control", "treatment")[i % 2],
        "surface": ("agent", "tab", "chat")[i % 3], "served_ts": T0 + i * 37, "finalised_wm": T0 + i * 37 + 960_000,
        "finalised_by": "watermark", "provisional": 0, "horizon_s": 900, "revision": 0, "reward": round((i % 200) / 100 - 1, 3),
        "components": {"persist": 0.4, "accept": 0.75, "broken": -0.1}, "latency_ms": 800 + i % 900, "ttft_ms": 90 + i % 50,
        "completion_tokens": 150 + i % 400, "n_edits": i % 4, "n_tool_calls": i % 6, "n_tool_broken": int(i % 17 == 0),
        "n_tool_error": int(i % 11 == 0), "n_clarifying": int(i % 9 == 0), "n_followups": i % 2, "n_dissatisfied": int(i % 7 == 0),
        "n_accept": 1, "n_reject": 0, "n_undo": 0, "n_revert": 0,
        "persistence": {30: 1.0, 120: 0.95, 300: 0.9, 600: 0.85, 900: 0.8}, "persisted": {30: 2, 120: 2, 300: 2, 600: 1, 900: 1},
        "checked": {30: 2, 120: 2, 300: 2, 600: 2, 900: 2},
    }


def event_row(i: int) -> dict[str, Any]:
    payload = {"event_id": f"ev-{i:012d}", "event_type": "ToolCall", "ts": T0 + i, "call_id": f"c{i}", "tool": "run_tests",
               "status": "ok", "duration_ms": 40 + i % 300, "args_hash": "ab" * 16}
    return {"event_id": f"ev-{i:012d}", "event_type": "ToolCall", "schema_version": 1, "ts": T0 + i, "org_id": f"org-{i % 13}",
            "session_id": f"sess-{i // 40:08d}", "request_id": f"req-{i // 8:09d}", "producer_name": "rewardflow-sdk",
            "producer_version": "0.1.0", "payload": orjson.dumps(payload).decode(), "source_partition": i % 4, "source_offset": i}


MAKERS = {"rewards": reward_row, "events": event_row}


def arrow_type(ch: str) -> pa.DataType:
    if ch.startswith("Map("):
        key, value = (p.strip() for p in ch[4:-1].split(",", 1))
        return pa.map_(arrow_type(key), arrow_type(value))
    return {"String": pa.string(), "LowCardinality(String)": pa.string(), "Int64": pa.int64(), "Int32": pa.int32(),
            "UInt8": pa.uint8(), "UInt16": pa.uint16(), "UInt32": pa.uint32(), "UInt64": pa.uint64(), "Float64": pa.float64()}[ch]


def arrow_table(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    t = table_def(table)
    schema = pa.schema([(c, arrow_type(t.column(c).type)) for c in t.record_columns])
    maps = [c for c in t.record_columns if t.column(c).type.startswith("Map(")]
    fixed = [{**r, **{m: list(r[m].items()) for m in maps}} for r in rows]
    return pa.Table.from_pylist(fixed, schema=schema)


def fresh_db(dsn_raw: str, name: str) -> Any:
    admin = get_client(dsn=parse_dsn(dsn_raw))
    admin.command(create_database(name))
    admin.close()
    client = get_client(dsn=parse_dsn(dsn_raw).with_database(name))
    migrate(client)
    return client


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4", "batch.size": 1_000_000})
    for n, v in enumerate(values):
        producer.produce(topic, v, key=str(n).encode())
        producer.poll(0)
    if producer.flush(120) != 0:
        raise SystemExit("produce did not finish")


def run_sink(settings: Settings, db: str, topic: str, logical: str, table: str, rows: int, records: int, in_flight: int = 2) -> float:
    sink = RewardSink(settings, topics={topic: logical}, database=db, group_id=f"bench-{uuid.uuid4().hex}",
                      in_flight=in_flight)
    deadline = time.monotonic() + 600
    while sink.poll_once(timeout=0.05) == 0:  # the group join is not part of the throughput
        if time.monotonic() > deadline:
            raise SystemExit("sink got no records")
    start = time.perf_counter()
    while sink.metrics.rows_written[table] < rows:
        if time.monotonic() > deadline:
            raise SystemExit(f"sink stalled: {sink.metrics.snapshot()}")
        sink.poll_once(timeout=0.05)
        if sink.metrics.records_read >= records:
            sink.flush()  # the input ends here; a live stream would not wait sink_batch_seconds for the tail
    elapsed = time.perf_counter() - start
    sink.close()
    return elapsed


def run_raw(client: Any, table: str, arrow: pa.Table, batch_rows: int) -> float:
    start = time.perf_counter()
    for offset in range(0, arrow.num_rows, batch_rows):
        client.insert_arrow(table, arrow.slice(offset, batch_rows))
    return time.perf_counter() - start


def run_raw_json(client: Any, table: str, values: list[bytes], per_record: int, batch_rows: int) -> float:
    """The sink's own insert path without Kafka: the same JSONEachRow bodies, same settings."""
    cols = list(table_def(table).record_columns)
    step = max(1, batch_rows // per_record)
    start = time.perf_counter()
    for k in range(0, len(values), step):
        body = b"\n".join(v.strip()[1:-1] for v in values[k:k + step])
        client.raw_insert(table, cols, body, fmt="JSONEachRow", settings={**STRICT_INPUT, "insert_deduplication_token": f"raw-{k}"})
    return time.perf_counter() - start


def run_export_scalars(settings: Settings, db: str) -> float:
    """Reference: the reader's read of the rewards table (same plan) without its four Map columns."""
    from rewardflow.clickhouse.connect import local_reader
    from rewardflow.trainer.query import rewards_sql

    reader = local_reader(parse_dsn(settings.dsn).with_database(db), settings)
    maps = [f"`{c}`" for c in table_def("rewards").record_columns if table_def("rewards").column(c).type.startswith("Map(")]
    start = time.perf_counter()
    sql, params = rewards_sql({"only_final": True}, 0, 2**64 - 1)
    for m in maps:
        sql = sql.replace(f", {m}", "", 1)
    sum(b.num_rows for b in reader.stream_arrow(sql, params))
    elapsed = time.perf_counter() - start
    reader.close()
    return elapsed


def run_export(settings: Settings, db: str) -> tuple[float, int]:
    reader = RewardReader(trainer=None, settle_s=0, database=db, settings=settings)
    start = time.perf_counter()
    n = sum(batch.num_rows for batch in reader)
    elapsed = time.perf_counter() - start
    reader.close()
    return elapsed, n


def run_export_scale(settings: Settings, dsn: str, rows: int, runs: int) -> dict[str, Any]:
    """Export of ``rows`` as-written rows vs the engine's own Arrow output of the same statement."""
    from rewardflow.clickhouse.chdbarrow import bind, open_handle
    from rewardflow.trainer.query import rewards_sql

    name = f"bench_export_{uuid.uuid4().hex[:6]}"
    client = fresh_db(dsn, name)
    step = 100_000
    for k in range(0, rows, step):  # built in slices: a million dict rows at once would cost GBs
        arrow = arrow_table("rewards", [reward_row(i) for i in range(k, min(rows, k + step))])
        for offset in range(0, arrow.num_rows, settings.sink_batch_rows):
            client.insert_arrow("rewards", arrow.slice(offset, settings.sink_batch_rows))
    # the earlier steps' databases are still merging in this process's engine: not the export's work
    deadline = time.monotonic() + 180
    while client.command("SELECT count() FROM system.merges") and time.monotonic() < deadline:
        time.sleep(0.5)
    client.close()
    sql, params = rewards_sql({"only_final": True}, 0, 2**64 - 1)
    query, bound = bind(sql, params)
    conn = open_handle(parse_dsn(dsn).path, name, {})  # the reader's own streaming settings

    def engine() -> float:
        start = time.perf_counter()
        result = conn.send_query(query, "ArrowStream", params=bound)
        sum(chunk.size() for chunk in result)
        return time.perf_counter() - start

    exports, floors = [], []
    for _ in range(runs):
        floors.append(rows / engine())
        export_s, n = run_export(settings, name)
        assert n == rows, (n, rows)
        exports.append(rows / export_s)
    conn.close()
    med = {"rows": rows, "export_rows_s": statistics.median(exports), "engine_arrow_rows_s": statistics.median(floors),
           "runs": [{"export_rows_s": e, "engine_arrow_rows_s": f} for e, f in zip(exports, floors, strict=True)]}
    med["ratio"] = med["export_rows_s"] / med["engine_arrow_rows_s"]
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--per-record", type=int, default=50, help="rows per Kafka record")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tables", default="rewards,events")
    ap.add_argument("--in-flight", type=int, default=2, help="sink inserts in flight")
    ap.add_argument("--export-rows", type=int, default=1_000_000, help="rows of the export-at-scale step (0: skip)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sink-"))
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from rewardflow.kafka_local import LocalBroker
        from rewardflow.kafka_local.ports import free_ports
        from rewardflow.settings import load_settings

        port, cport = free_ports(2)
        broker = LocalBroker(load_settings().home, port, cport, partitions=args.partitions, data_dir=tmp / "kafka",
                             die_with_parent=True)
        bootstrap = broker.up(timeout=120).bootstrap
    dsn = f"chdb://{tmp / 'chdb'}"
    overrides: dict[str, Any] = {"clickhouse_dsn": SecretStr(dsn), "kafka_bootstrap": bootstrap, "home": tmp}
    settings = Settings(**overrides)
    owner = get_client(dsn=parse_dsn(dsn))  # this process owns the engine for the whole bench
    report: dict[str, Any] = {"rows": args.rows, "per_record": args.per_record, "partitions": args.partitions,
                              "in_flight": args.in_flight, "load_average_at_start": list(os.getloadavg()),
                              "sink_batch_rows": settings.sink_batch_rows, "sink_batch_seconds": settings.sink_batch_seconds,
                              "tables": {}, "python": platform.python_version(), "machine": platform.machine()}
    try:
        for table in args.tables.split(","):
            rows = [MAKERS[table](i) for i in range(args.rows)]
            values = [orjson.dumps(rows[k:k + args.per_record], option=orjson.OPT_NON_STR_KEYS) for k in range(0, len(rows), args.per_record)]
            arrow = arrow_table(table, rows)
            runs = []
            for run in range(1, args.runs + 1):
                topic = f"bench.{table}.{uuid.uuid4().hex[:10]}"
                create_topics(bootstrap, {topic: args.partitions})
                produce(bootstrap, topic, values)
                sink_db, raw_db = f"bench_sink_{run}_{table}_{uuid.uuid4().hex[:6]}", f"bench_raw_{run}_{table}_{uuid.uuid4().hex[:6]}"
                fresh_db(dsn, sink_db).close()
                sink_s = run_sink(settings, sink_db, topic, TOPIC_OF[table], table, args.rows, len(values), args.in_flight)
                raw_client = fresh_db(dsn, raw_db)
                raw_s = run_raw(raw_client, table, arrow, settings.sink_batch_rows)
                raw_client.close()
                json_client = fresh_db(dsn, raw_db + "_json")
                json_s = run_raw_json(json_client, table, values, args.per_record, settings.sink_batch_rows)
                json_client.close()
                entry: dict[str, Any] = {"run": run, "sink_rows_s": args.rows / sink_s, "raw_insert_arrow_rows_s": args.rows / raw_s,
                                         "raw_insert_json_rows_s": args.rows / json_s}
                if table == "rewards":
                    export_s, n = run_export(settings, sink_db)
                    assert n == args.rows, (n, args.rows)
                    entry["export_arrow_rows_s"] = n / export_s
                    entry["export_arrow_no_maps_rows_s"] = args.rows / run_export_scalars(settings, sink_db)
                runs.append(entry)
                delete_topics(bootstrap, [topic], timeout=30)
                print(f"{table} run {run}: " + ", ".join(f"{k}={v:,.0f}" for k, v in entry.items() if k != "run"), flush=True)
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "run"}
            med["ratio"] = med["sink_rows_s"] / med["raw_insert_arrow_rows_s"]
            med["ratio_vs_raw_json"] = med["sink_rows_s"] / med["raw_insert_json_rows_s"]
            report["tables"][table] = {"runs": runs, "median": med, "bytes_per_row": sum(map(len, values)) / args.rows}
        if args.export_rows:
            report["export_at_scale"] = scale = run_export_scale(settings, dsn, args.export_rows, args.runs)
            print(f"export at scale ({args.export_rows:,} rows): " + ", ".join(
                f"{r['export_rows_s']:,.0f} (engine alone {r['engine_arrow_rows_s']:,.0f})" for r in scale["runs"]), flush=True)
    finally:
        owner.close()
        if broker is not None:
            broker.down(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    head = ("table", "sink rows/s", "raw insert_arrow", "ratio", "raw JSON insert", "sink/JSON", "export Arrow", "export w/o maps")
    print("\n" + f"{head[0]:<9}" + "".join(f"{h:>17}" for h in head[1:]))
    for table, res in report["tables"].items():
        m = res["median"]
        cells = [f"{m['sink_rows_s']:,.0f}", f"{m['raw_insert_arrow_rows_s']:,.0f}", f"{m['ratio']:.2f}",
                 f"{m['raw_insert_json_rows_s']:,.0f}", f"{m['ratio_vs_raw_json']:.2f}",
                 f"{m['export_arrow_rows_s']:,.0f}" if "export_arrow_rows_s" in m else "-",
                 f"{m['export_arrow_no_maps_rows_s']:,.0f}" if "export_arrow_no_maps_rows_s" in m else "-"]
        print(f"{table:<9}" + "".join(f"{c:>17}" for c in cells))
    if "export_at_scale" in report:
        e = report["export_at_scale"]
        print(f"export at scale, {e['rows']:,} rows as written: {e['export_rows_s']:,.0f} rows/s; engine's own Arrow "
              f"output of the same SELECT {e['engine_arrow_rows_s']:,.0f}; ratio {e['ratio']:.2f}")
    print(f"(rows/s, medians of {args.runs}; targets: sink/insert_arrow >= 0.5, export >= 1,000,000 rows/s; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    report["load_average_at_end"] = list(os.getloadavg())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
