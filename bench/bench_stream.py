"""Stream worker throughput (ingest + join + reward) beside a raw consume + decode of the same topic. Not a test.

For each run, on fresh topics (a unique ``REWARDFLOW_TOPIC_PREFIX``):

1. untimed: N realistic events (``rewardflow.events.samples`` turns; a Kafka
   record carries a burst of 2-4 complete turns of one session, ~20-50
   events; records in the order of their newest event) are encoded (Avro by
   default);
2. worker: ``python -m rewardflow_streams.main`` (one process, production
   event-time settings) is started and waits until it owns every raw
   partition; then the records are produced and the clock runs from the
   first produce until the worker has written one ``events.valid`` record per
   input record (the sum of that topic's end offsets, polled every 20 ms: no
   consumer competes with the worker for the CPU). Untimed afterwards, every
   ``events.valid`` row is read back and counted (must be N);
3. floor: a plain confluent-kafka consumer reads the same raw topic from the
   start and decodes every record with ``rewardflow.events.wire.decode_record``
   (fastavro / orjson, no validation); timed from the first record fetched
   until all N events are decoded. The run's topics are then deleted.

Reports medians in events/s and the ratio worker / floor, prints a table and
writes ``bench/results/stream.json``. ``--profile`` also runs the pure core
(``PartitionProcessor`` over a dict store, per partition in offset order)
on the same records in this process, without and then with cProfile, and
prints where the time goes.

    python bench/bench_stream.py [--bootstrap HOST:PORT] [--events 200000] [--runs 3] [--profile]

Without ``--bootstrap`` (or ``REWARDFLOW_KAFKA_BOOTSTRAP``) a local broker is started in a temp dir.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from rewardflow.kafka import topics as T
from rewardflow.core.config import DictStore, JoinConfig
from rewardflow.core.processor import PartitionProcessor
from rewardflow.demo.worker_proc import WORKER_MODULE, WorkerProcess
from rewardflow.events.samples import PRODUCERS, START_MS, turn_events
from rewardflow.events.validate import to_dict
from rewardflow.events.wire import decode_record, encode_avro, encode_json
from rewardflow.kafka_local.admin import delete_topics
from rewardflow.kafka.provision import ensure_topics
from rewardflow.kafka.topics import RAW_PARTITIONER
from rewardflow.rewards.registry import active_specs
from rewardflow.settings import Settings

RESULTS = Path(__file__).resolve().parent / "results" / "stream.json"
TARGET = 20_000
Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


# ---------------------------------------------------------------------- workload
def session_batches(n_events: int, fmt: str, seed: int = 5) -> list[Record]:
    """Records of one session's burst of 2-4 complete turns (~20-50 events), in the order of their newest event.

    Sessions start over an hour and have bursts 5-20 min apart; a burst's turns start within 10 s, and
    a record carries them whole (served ... 900 s persistence checks), so no event is late, while
    a session's state (tombstones are kept an hour) grows from record to record as in production.
    """
    rng = random.Random(seed)
    timed: list[tuple[int, int, Record]] = []
    total, n_sessions = 0, 0
    while total < n_events:
        envelope = {"org_id": "org-bench", "session_id": f"sess-{n_sessions:06d}", "producer": PRODUCERS[0]}
        n_sessions += 1
        at = START_MS + rng.randint(0, 3_600_000)
        for _ in range(3):
            batch: list[dict[str, Any]] = []
            for k in range(rng.randint(2, 4)):
                batch += [to_dict(e) for e in turn_events(rng, envelope, at + k * rng.randint(0, 10_000))]
            batch = sorted(batch, key=lambda e: e["ts"])[: n_events - total]
            total += len(batch)
            if batch:
                value = encode_avro(batch, batch_id=batch[0]["event_id"]) if fmt == "avro" else encode_json(batch)
                record = (envelope["session_id"].encode(), value, [("rf-format", fmt.encode())])
                timed.append((max(e["ts"] for e in batch), len(timed), record))
            at += rng.randint(300_000, 1_200_000)
    return [r for _, _, r in sorted(timed)]


def produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    """Pre-produce ``records`` (key, value, headers) with the SDK's partitioner; raise if any stays unsent.

    Idempotent, as the SDK's producer: a retried send never reorders a partition (reordered records
    would turn events late and cost turns their reward)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": RAW_PARTITIONER,
                         "enable.idempotence": True,
                         "compression.type": "lz4", "message.max.bytes": 2_000_000})
    for key, value, headers in records:
        while True:
            try:
                producer.produce(topic, value, key, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) != 0:
        raise SystemExit("pre-produce did not finish")


# ---------------------------------------------------------------------- the worker
def worker_settings(bootstrap: str, partitions: int, max_record_bytes: int, home: Path) -> Settings:
    return Settings(kafka_bootstrap=bootstrap, topic_prefix=f"bench{uuid.uuid4().hex[:8]}.", partitions=partitions,
                    max_record_bytes=max_record_bytes, home=home)


def end_offsets(consumer: Consumer, topic: str, partitions: int) -> int:
    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
               for p in range(partitions))


def run_worker(settings: Settings, records: list[Record], workdir: Path, timeout: float,
               profile_to: Path | None = None) -> dict[str, Any]:
    """Seconds from the first produce until the worker has committed every raw record.

    Faust commits a batch only after its outputs and state writes are flushed to Kafka, so this
    is the time until everything produced is processed and its outputs are durable.
    """
    ensure_topics(settings)
    profiler = ["-m", "cProfile", "-o", str(profile_to)] if profile_to else []
    worker = WorkerProcess(settings, workdir / "worker.log", argv=[sys.executable, *profiler, "-m", WORKER_MODULE],
                           cwd=workdir, detach=True)
    worker.start()
    try:
        worker.wait_joined(60)
        # never subscribes, so it does not join the worker's group: it only reads its committed offsets
        watcher = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": worker.group})
        raw = [TopicPartition(settings.topic(T.RAW), p) for p in range(settings.partitions)]
        start = time.perf_counter()
        produce(settings.kafka_bootstrap, settings.topic(T.RAW), records)
        produced_s = time.perf_counter() - start
        ends = [watcher.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in raw]
        while (done := sum(max(tp.offset, 0) for tp in watcher.committed(raw, timeout=10))) < sum(ends):
            if not worker.alive or time.perf_counter() - start > timeout:
                raise SystemExit(f"worker stopped or timed out at {done}/{sum(ends)} committed raw records; "
                                 f"log: {worker.log_path}")
            time.sleep(0.05)
        elapsed = time.perf_counter() - start
        watcher.close()
        assert worker.proc is not None
        return {"seconds": elapsed, "produce_seconds": produced_s, "rss_mb": _rss_mb(worker.proc.pid)}
    finally:
        worker.close()


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _assigned_from_start(settings: Settings, topic: str) -> Consumer:
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "fetch.max.bytes": 52_428_800})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(settings.partitions)])
    return c


def count_valid_rows(settings: Settings) -> int:
    """Untimed check: every events.valid row, counted (each row is an object starting with event_id)."""
    c = _assigned_from_start(settings, settings.topic(T.VALID))
    tps = [TopicPartition(settings.topic(T.VALID), p) for p in range(settings.partitions)]
    ends = {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
    read_to = dict.fromkeys(ends, 0)
    rows = 0
    deadline = time.monotonic() + 120
    while any(read_to[p] < ends[p] for p in ends) and time.monotonic() < deadline:
        for msg in c.consume(5000, 1.0):
            if msg.error() is None:
                rows += msg.value().count(b'{"event_id":')
                read_to[msg.partition()] = msg.offset() + 1
    c.close()
    return rows


# ---------------------------------------------------------------------- the floor
def run_floor(settings: Settings, n_events: int) -> float:
    """Seconds from the first record fetched until every event of the raw topic is decoded (ticks skipped)."""
    c = _assigned_from_start(settings, settings.topic(T.RAW))
    first = c.consume(1, 30.0)  # connection and first fetch are not throughput: the clock starts after
    start = time.perf_counter()
    decoded = 0
    while decoded < n_events:
        for msg in [*first, *c.consume(5000, 0.05)]:  # returns what has arrived, never waits long
            if msg.error() is None and msg.headers() != [("rf-format", b"tick")]:
                decoded += len(decode_record(msg.value(), msg.headers(), max_bytes=2_000_000))
        first = []
    elapsed = time.perf_counter() - start
    c.close()
    return elapsed


def delete_deployment_topics(settings: Settings) -> None:
    """Every topic of the run's prefix (raw, outputs, the worker's changelog): runs leave GBs otherwise."""
    names = [t for t in AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(timeout=10).topics
             if t.startswith(settings.topic_prefix)]
    delete_topics(settings.kafka_bootstrap, names, timeout=30)


# ---------------------------------------------------------------------- in-process core
def core_in_process(settings: Settings, records: list[Record], profile: bool) -> tuple[float, str]:
    """Seconds for PartitionProcessor over the records (dict store, sessions spread over P partitions),
    in batches of ``worker_batch_records`` per partition as the worker feeds it."""
    cfg, specs = JoinConfig.from_settings(settings), active_specs(settings)
    procs = {p: PartitionProcessor(cfg, specs, DictStore(), settings.topic(T.RAW), p) for p in range(settings.partitions)}
    offsets = dict.fromkeys(procs, 0)
    by_session: dict[bytes, int] = {}
    prof = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if prof:
        prof.enable()
    pending: dict[int, list[tuple[bytes | None, Any, int]]] = {p: [] for p in procs}
    for key, value, headers in records:
        p = by_session.setdefault(key, len(by_session) % settings.partitions)
        pending[p].append((value, headers, offsets[p]))
        offsets[p] += 1
        if len(pending[p]) >= settings.worker_batch_records:
            procs[p].process_batch(pending[p], 0)
            pending[p] = []
    for p, batch in pending.items():
        procs[p].process_batch(batch, 0)
    if prof:
        prof.disable()
    elapsed = time.perf_counter() - start
    text = ""
    if prof:
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("tottime").print_stats(22)
        stats.sort_stats("cumulative").print_stats(30)
        text = buf.getvalue()
    return elapsed, text


# ---------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("REWARDFLOW_KAFKA_BOOTSTRAP"))
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--format", choices=("avro", "json"), default="avro")
    ap.add_argument("--timeout", type=float, default=900.0, help="per worker run, seconds")
    ap.add_argument("--max-record-bytes", type=int, default=Settings.model_fields["max_record_bytes"].default,
                    help="REWARDFLOW_MAX_RECORD_BYTES of the worker (default: the production default); its "
                         "changelog takes records of twice this")
    ap.add_argument("--profile", action="store_true", help="also profile the pure core in this process")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    ap.add_argument("--worker-profile", type=Path, default=None,
                    help="run the worker of the LAST run under cProfile, stats to this file (slows it down)")
    args = ap.parse_args()

    records = session_batches(args.events, args.format)
    n_records = len(records)
    print(f"{args.events:,} events in {n_records:,} session-batch records ({args.events / n_records:.1f} events/record, "
          f"{sum(len(v) for _, v, _ in records) / n_records:,.0f} B/record, {args.format})")
    tmp = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    broker, bootstrap = None, args.bootstrap
    if not bootstrap:
        from rewardflow.kafka_local import LocalBroker
        from rewardflow.kafka_local.ports import free_ports
        from rewardflow.settings import load_settings

        port, cport = free_ports(2)
        broker = LocalBroker(load_settings().home, port, cport, partitions=args.partitions, data_dir=tmp / "kafka",
                             die_with_parent=True)
        bootstrap = broker.up(timeout=120).bootstrap
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    try:
        for run in range(args.runs):
            workdir = tmp / f"run{run + 1}"
            workdir.mkdir()
            settings = worker_settings(bootstrap, args.partitions, args.max_record_bytes, workdir / "home")
            profile_to = args.worker_profile.resolve() if args.worker_profile and run == args.runs - 1 else None
            w = run_worker(settings, records, workdir, args.timeout, profile_to)
            n_rows = count_valid_rows(settings)
            if n_rows != args.events:
                raise SystemExit(f"run {run + 1}: {n_rows} events.valid rows, expected {args.events}")
            floor_s = run_floor(settings, args.events)
            delete_deployment_topics(settings)
            rows.append({"run": run + 1, "worker_events_s": args.events / w["seconds"],
                         "floor_events_s": args.events / floor_s, "worker_seconds": w["seconds"],
                         "produce_seconds": w["produce_seconds"], "floor_seconds": floor_s,
                         "worker_rss_mb": w["rss_mb"], "prefix": settings.topic_prefix})
            r = rows[-1]
            print(f"run {run + 1}: worker {r['worker_events_s']:>9,.0f} ev/s ({w['seconds']:.1f} s; produce "
                  f"{w['produce_seconds']:.1f} s)   floor {r['floor_events_s']:>10,.0f} ev/s   "
                  f"ratio {r['worker_events_s'] / r['floor_events_s']:.3f}")
        core_s, profile_text = core_in_process(settings, records, profile=False)
        if args.profile:
            _, profile_text = core_in_process(settings, records, profile=True)
    finally:
        if broker is not None:
            broker.down(timeout=30)
    worker = statistics.median(r["worker_events_s"] for r in rows)
    floor = statistics.median(r["floor_events_s"] for r in rows)
    core = args.events / core_s
    print(f"\n| {'path':<52} | {'events/s (median of ' + str(args.runs) + ')':>24} |")
    print(f"|{'-' * 54}|{'-' * 26}|")
    print(f"| {'worker process: ingest + join + reward (Faust)':<52} | {worker:>24,.0f} |")
    print(f"| {'floor: confluent-kafka consume + decode_record':<52} | {floor:>24,.0f} |")
    print(f"| {'ratio worker / floor':<52} | {worker / floor:>24.3f} |")
    print(f"| {'pure core in process (no Kafka), 1 run':<52} | {core:>24,.0f} |")
    print(f"| {'target per worker process':<52} | {TARGET:>24,} |")
    if profile_text:
        print("\npure core profile (cProfile):\n" + profile_text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "events": args.events, "records": n_records, "format": args.format, "partitions": args.partitions,
        "runs": rows, "median_worker_events_s": worker, "median_floor_events_s": floor, "ratio": worker / floor,
        "core_in_process_events_s": core, "target_events_s": TARGET, "meets_target": worker >= TARGET,
        "settings": "production defaults (horizons 30..900 s, grace 60 s, lateness 5 s, windows 300/3600 s), "
                    f"max_record_bytes={args.max_record_bytes}",
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "loadavg_1_5_15": {"before": load_before, "after": os.getloadavg()},
    }, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
