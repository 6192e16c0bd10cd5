"""Produce throughput: the rewardflow SDK beside a raw confluent-kafka producer sending the same bytes.

Not a test. For each run:

1. SDK: ``EventProducer.emit`` for N realistic mixed events (pre-built,
   validated models), then ``flush()``; timed from the first emit to the
   last acknowledgement.
2. The records the SDK wrote are read back from its topic (untimed).
3. Raw: a plain ``confluent_kafka.Producer`` with the SDK's exact librdkafka
   config sends those records (same keys, values, headers) to a fresh topic;
   timed from the first produce to the last acknowledgement.

Reports medians of the runs in events/s and the ratio SDK / raw, prints a
table and writes ``bench/results/produce.json``.

    python bench/bench_produce.py --bootstrap 127.0.0.1:19092 [--events 200000] [--runs 3] [--format avro]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from rewardflow.client import EventProducer, ProducerConfig
from rewardflow.events.models import Envelope
from rewardflow.events.samples import sample_events
from rewardflow.kafka_local.admin import create_topics, delete_topics
from rewardflow.settings import Settings, load_settings

Record = tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]
RESULTS = Path(__file__).resolve().parent / "results" / "produce.json"


def run_sdk(settings: Settings, config: ProducerConfig, events: list[Envelope]) -> tuple[float, int]:
    """Seconds from first emit to everything acknowledged; records written."""
    producer = EventProducer(settings, config)
    start = time.perf_counter()
    for event in events:
        producer.emit(event)
    stats = producer.flush()
    elapsed = time.perf_counter() - start
    producer.close()
    assert stats.sent == len(events), stats
    return elapsed, stats.records


def read_back(bootstrap: str, topic: str, records: int) -> list[Record]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[Record] = []
    deadline = time.monotonic() + 120
    while len(out) < records and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, 1.0):
            key, value, headers = msg.key(), msg.value(), msg.headers() or []
            if msg.error() is None and key is not None and value is not None:
                out.append((key, value, list(headers.items() if isinstance(headers, dict) else headers)))
    consumer.close()
    if len(out) != records:
        raise SystemExit(f"read back {len(out)} of {records} records from {topic}")
    return out


def run_raw(kafka_config: dict[str, Any], topic: str, records: list[Record]) -> float:
    """Seconds to produce pre-encoded records and have them all acknowledged."""
    producer = Producer(kafka_config)
    acked = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    start = time.perf_counter()
    for i, (key, value, headers) in enumerate(records):
        while True:
            try:
                producer.produce(topic, value, key, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 999:
            producer.poll(0)
    producer.flush()
    elapsed = time.perf_counter() - start
    assert acked[0] == len(records), (acked[0], len(records))
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("REWARDFLOW_KAFKA_BOOTSTRAP"))
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--format", choices=("avro", "json"), default="avro")
    ap.add_argument("--avro-writer", choices=("compiled", "fastavro"), default="compiled")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--max-delay-ms", type=float, default=ProducerConfig.max_delay_ms)
    ap.add_argument("--max-events", type=int, default=None)
    args = ap.parse_args()
    if not args.bootstrap:
        sys.exit("give --bootstrap HOST:PORT or set REWARDFLOW_KAFKA_BOOTSTRAP")
    settings = load_settings(kafka_bootstrap=args.bootstrap)
    events = sample_events(args.events, seed=11)
    gc.collect()
    gc.freeze()  # the pre-built events are not garbage; keep the collector off them
    rows = []
    for run in range(args.runs):
        sdk_topic, raw_topic = (f"bench.produce.{kind}.{uuid.uuid4().hex[:8]}" for kind in ("sdk", "raw"))
        create_topics(args.bootstrap, {sdk_topic: args.partitions, raw_topic: args.partitions})
        config = ProducerConfig(topic=sdk_topic, wire_format=args.format, avro_writer=args.avro_writer,
                                max_delay_ms=args.max_delay_ms, max_events=args.max_events)
        sdk_s, n_records = run_sdk(settings, config, events)
        records = read_back(args.bootstrap, sdk_topic, n_records)
        raw_s = run_raw(config.resolve(settings).kafka, raw_topic, records)
        size = sum(len(v) for _, v, _ in records)
        rows.append({"run": run + 1, "sdk_events_s": len(events) / sdk_s, "raw_events_s": len(events) / raw_s,
                     "records": n_records, "bytes": size})
        print(f"run {run + 1}: sdk {rows[-1]['sdk_events_s']:>10,.0f} ev/s   raw {rows[-1]['raw_events_s']:>10,.0f} ev/s   "
              f"{n_records} records, {size / n_records:,.0f} B/record, {len(events) / n_records:.1f} events/record")
        delete_topics(args.bootstrap, [sdk_topic, raw_topic], timeout=30)
    sdk = statistics.median(r["sdk_events_s"] for r in rows)
    raw = statistics.median(r["raw_events_s"] for r in rows)
    print(f"\n| {'producer':<28} | {'events/s (median of ' + str(args.runs) + ')':>24} |")
    print(f"|{'-' * 30}|{'-' * 26}|")
    label = f"rewardflow SDK ({args.format}{', ' + args.avro_writer if args.format == 'avro' else ''})"
    print(f"| {label:<28} | {sdk:>24,.0f} |")
    print(f"| {'raw confluent-kafka':<28} | {raw:>24,.0f} |")
    print(f"| {'ratio SDK / raw':<28} | {sdk / raw:>24.2f} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "events": args.events, "format": args.format, "avro_writer": args.avro_writer, "partitions": args.partitions,
        "runs": rows,
        "median_sdk_events_s": sdk, "median_raw_events_s": raw, "ratio": sdk / raw,
        "config": {k: v for k, v in config.resolve(settings).kafka.items() if "sasl" not in k},
        "max_delay_ms": args.max_delay_ms, "python": platform.python_version(), "cpus": os.cpu_count(),
    }, indent=2))
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
