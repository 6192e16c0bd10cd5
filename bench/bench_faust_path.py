"""What Faust's record delivery costs a stream worker, at the SDK's record shape. Not a test.

For each run, on a fresh raw topic:

1. untimed: the end-to-end benchmark's workload (``bench_e2e.make_records``: simulated sessions, a
   session's events due within ``--batch-window-ms`` in one Avro record, ~1.3 events/record at the
   default 1 s) is produced, idempotently;
2. agent route: a child process runs a Faust app with one agent taking the records as a Faust
   agent does (``stream.take_events(1000, within=0.1)``, concurrency 1, acked by Faust) and doing
   nothing else with them: no decoding, no state, no outputs. Timed from the first batch to the
   last record;
3. bulk route: the same app with the consumer's fetch loop replaced, as the worker's is
   (``streams/bulk.py``): each fetch's records are one batch, acked, past the conductor, the
   channel queue and the stream;
4. floor: a plain confluent-kafka consumer reads the same topic from the start and decodes every
   record (``decode_record``: fastavro), timed from the first record to the last.

Whatever a worker does beyond the route (the core, state writes, output sends) only adds to it,
so the route's records/s is a ceiling for a worker at that shape. Prints records/s and events/s,
the ratio to the floor and the time per record of each, the CPU time per record of each route
(its process's, threads included, from the first batch to the last record: steadier than the
wall time on a shared host), and writes ``bench/results/faust_path.json``. Both routes fetch up to
``REWARDFLOW_WORKER_BATCH_RECORDS`` records at a time, as the worker does. To compare a build of
``streams/bulk.py`` with another, run the script with ``PYTHONPATH=<the other build's src>``.

    python bench/bench_faust_path.py --bootstrap HOST:PORT [--events 100000] [--runs 3] [--partitions 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench_e2e import make_records  # noqa: E402 - the benches run as scripts from bench/
from bench_stream import produce
from rewardflow.events.wire import decode_record

HERE = Path(__file__).resolve().parent


def child(bootstrap: str, topic: str, records: int, out: Path, route: str) -> None:
    """Run the Faust app until ``records`` records went through the agent; write the timing to ``out``.

    ``route="bulk"`` replaces the consumer's fetch loop with one that takes each fetch's records as
    one batch and acks them: the worker's route (``streams/bulk.py``); the agent stays only to
    subscribe the topic.
    """
    import signal

    import faust

    from rewardflow.settings import load_settings

    batch = load_settings().worker_batch_records  # a fetch of up to this many records, as the worker's
    app = faust.App(f"faustpath-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}", store="memory://",
                    web_enabled=False, autodiscover=False, consumer_auto_offset_reset="earliest",
                    stream_wait_empty=False, broker_commit_interval=1.0, broker_max_poll_records=batch,
                    topic_disable_leader=True,
                    datadir=tempfile.mkdtemp(prefix="faustpath-"))
    raw = app.topic(topic, key_serializer="raw", value_serializer="raw")
    seen = {"n": 0, "first": 0.0, "last": 0.0, "batches": 0, "cpu_first": 0.0, "cpu": 0.0}

    def took(n: int) -> None:
        if not seen["n"]:
            seen["first"], seen["cpu_first"] = time.perf_counter(), time.process_time()
        seen["n"] += n
        seen["batches"] += 1
        if seen["n"] >= records and not seen["last"]:
            seen["last"], seen["cpu"] = time.perf_counter(), time.process_time() - seen["cpu_first"]
            out.write_text(json.dumps(seen))
            os.kill(os.getpid(), signal.SIGTERM)

    @app.agent(raw, concurrency=1)
    async def count(stream: Any) -> None:
        async for events in stream.take_events(1000, within=0.1):
            took(len(events))

    if route == "bulk":
        from rewardflow_streams import bulk

        consumer = app.consumer

        async def handle(batch: list[Any]) -> None:
            took(len(batch))
            for message in batch:
                consumer.ack(message)

        bulk.install(consumer, topic, handle)

    faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False).execute_from_commandline()


def run_faust(bootstrap: str, topic: str, records: int, timeout: float, route: str = "agent") -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="faustpath-")) / "timing.json"
    cmd = [sys.executable, str(Path(__file__)), "--child", "--bootstrap", bootstrap, "--topic", topic,
           "--records", str(records), "--out", str(out), "--route", route]
    proc = subprocess.run(cmd, cwd=HERE, timeout=timeout, capture_output=True, text=True)
    if not out.exists():
        raise SystemExit(f"the Faust child exited {proc.returncode} without a result:\n{proc.stderr[-3000:]}")
    got = json.loads(out.read_text())
    return {"seconds": got["last"] - got["first"], "cpu_seconds": got["cpu"], "batches": got["batches"],
            "records": got["n"]}


def run_floor(bootstrap: str, topic: str, partitions: int, records: int) -> tuple[float, int]:
    """Seconds to consume and decode every record from the start; the events decoded."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"floor-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    n = events = 0
    start = 0.0
    while n < records:
        for msg in c.consume(5000, 1.0):
            if msg.error() is not None:
                continue
            if not n:
                start = time.perf_counter()
            n += 1
            events += len(decode_record(msg.value(), msg.headers(), max_bytes=2_000_000))
    elapsed = time.perf_counter() - start
    c.close()
    return elapsed, events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("REWARDFLOW_KAFKA_BOOTSTRAP"))
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--sessions-per-hour", type=float, default=2_000.0)
    ap.add_argument("--batch-window-ms", type=int, default=1_000, help="as bench_e2e.py (1 s: the SDK's shape)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", default=str(HERE / "results" / "faust_path.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--records", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--route", default="agent", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.bootstrap:
        raise SystemExit("--bootstrap (or REWARDFLOW_KAFKA_BOOTSTRAP) is required: start one with "
                         "`rewardflow kafka up`")
    if args.child:
        child(args.bootstrap, args.topic, args.records, Path(args.out), args.route)
        return
    records, _, sizes, _ = make_records(args.events, args.sessions_per_hour, args.batch_window_ms, args.seed)
    print(f"{args.events:,} events in {len(records):,} records ({args.events / len(records):.2f} events/record)")
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    runs = []
    for i in range(args.runs):
        topic = f"faustpath-{uuid.uuid4().hex[:8]}"
        for fut in admin.create_topics([NewTopic(topic, args.partitions, 1)]).values():
            fut.result(timeout=30)
        produce(args.bootstrap, topic, records)
        faust_run = run_faust(args.bootstrap, topic, len(records), args.timeout)
        bulk_run = run_faust(args.bootstrap, topic, len(records), args.timeout, route="bulk")
        floor_s, floor_events = run_floor(args.bootstrap, topic, args.partitions, len(records))
        assert floor_events == args.events, (floor_events, args.events)
        load = os.getloadavg()[0]
        run = {"faust_records_s": len(records) / faust_run["seconds"], "faust_events_s": args.events / faust_run["seconds"],
               "faust_us_per_record": faust_run["seconds"] / len(records) * 1e6, "faust_batches": faust_run["batches"],
               "floor_records_s": len(records) / floor_s, "floor_events_s": args.events / floor_s,
               "floor_us_per_record": floor_s / len(records) * 1e6, "load": round(load, 2),
               "bulk_records_s": len(records) / bulk_run["seconds"], "bulk_events_s": args.events / bulk_run["seconds"],
               "bulk_us_per_record": bulk_run["seconds"] / len(records) * 1e6,
               "faust_cpu_us_per_record": faust_run["cpu_seconds"] / len(records) * 1e6,
               "bulk_cpu_us_per_record": bulk_run["cpu_seconds"] / len(records) * 1e6}
        run["ratio"] = run["faust_records_s"] / run["floor_records_s"]
        runs.append(run)
        print(f"  run {i + 1}: Faust's path {run['faust_records_s']:,.0f} records/s = {run['faust_events_s']:,.0f} "
              f"events/s ({run['faust_us_per_record']:.0f} µs/record, {faust_run['batches']} batches); floor "
              f"{run['floor_records_s']:,.0f} records/s ({run['floor_us_per_record']:.0f} µs/record); ratio "
              f"{run['ratio']:.2f}; bulk route {run['bulk_records_s']:,.0f} records/s ({run['bulk_us_per_record']:.0f} "
              f"µs/record, {run['bulk_cpu_us_per_record']:.1f} µs of CPU); load {load:.1f}")
        for fut in admin.delete_topics([topic]).values():
            fut.result(timeout=30)
    summary = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"median at {args.events / len(records):.2f} events/record: agent route {summary['faust_events_s']:,.0f} "
          f"events/s ({summary['faust_us_per_record']:.0f} µs/record), bulk route {summary['bulk_events_s']:,.0f} "
          f"events/s ({summary['bulk_us_per_record']:.0f} µs/record, {summary['bulk_cpu_us_per_record']:.1f} µs of "
          f"CPU; the agent route {summary['faust_cpu_us_per_record']:.1f})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "events": args.events, "records": len(records), "events_per_record": args.events / len(records),
        "batch_window_ms": args.batch_window_ms, "partitions": args.partitions, "runs": runs, "median": summary,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "command": " ".join(["python", "bench/bench_faust_path.py", *sys.argv[1:]]),
    }, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
