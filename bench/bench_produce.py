"""Produce throughput: the rewardflow SDK beside a raw confluent-kafka producer sending the same bytes.

Not a test. For each run:

1. SDK: ``EventProducer.emit`` for N realistic mixed events (pre-built,
   validated models), then ``flush()``; timed from the first emit to the
   last acknowledgement. ``block_timeout_s`` lets ``emit`` wait while
   ``max_pending_events`` are pending, as the raw loop waits on ``BufferError``. Every producer first sends one record and waits for
   it, untimed: connecting and getting an idempotent producer id take about
   0.5 s here, which is not throughput.
2. The records the SDK wrote are read back from its topic (untimed).
3. Raw: a plain ``confluent_kafka.Producer`` with the SDK's exact librdkafka
   config sends those records (same keys, values, headers) to a fresh topic;
   timed from the first produce to the last acknowledgement. This is the
   baseline of the ratio: encoding and batching cost nothing here.
4. For context, "raw per event": the same producer sends one pre-encoded
   record per event (what a client without per-session batching would send).
5. The budget (untimed in the ratio): the ratio target of 0.7 allows the SDK
   ``raw seconds / 0.7`` for the run, i.e. a time per event. Beside it, the
   time the SDK's own event writers (fastavro or orjson) take
   to encode the same pre-built events, with no batching and no Kafka at all:
   ``encode only``. No design that encodes the events in the emitting thread
   can be faster than that. It is measured twice: over the events as the run
   holds them (200k models allocated session by session, then emitted in time
   order, so each one is cold in the CPU caches, as in the timed SDK run), and
   over the same models emitted 200 at a time right after being touched (warm),
   which is what a client that builds an event and emits it at once sees.

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
from rewardflow.events.wire import FORMAT_HEADER, decode_record, encode_avro, encode_json
from rewardflow.kafka_local.admin import create_topics, delete_topics
from rewardflow.settings import Settings, load_settings

Record = tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]
RESULTS = Path(__file__).resolve().parent / "results" / "produce.json"


def run_sdk(settings: Settings, config: ProducerConfig, events: list[Envelope]) -> tuple[float, int]:
    """Seconds from the second emit to everything acknowledged; records written (warm-up one included)."""
    producer = EventProducer(settings, config)
    producer.emit(events[0])  # warm-up: connection and producer id
    producer.flush()
    start = time.perf_counter()
    for event in events[1:]:
        producer.emit(event)
    stats = producer.flush()
    elapsed = time.perf_counter() - start
    producer.close()
    assert stats.sent == len(events), stats
    return elapsed, stats.records


def encode_only(producer_writers: dict[str, Any], events: list[Envelope]) -> tuple[float, float]:
    """Microseconds per event to encode ``events`` with the SDK's writers: cold (in the run's order), warm."""
    start = time.perf_counter()
    for event in events:
        producer_writers[event.event_type](event.__dict__)
    cold = (time.perf_counter() - start) / len(events) * 1e6
    warm_s = 0.0
    for i in range(0, len(events), 200):
        chunk = events[i:i + 200]
        for event in chunk:  # touch: the chunk is now in the caches
            producer_writers[event.event_type](event.__dict__)
        start = time.perf_counter()
        for event in chunk:
            producer_writers[event.event_type](event.__dict__)
        warm_s += time.perf_counter() - start
    return cold, warm_s / len(events) * 1e6


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
    """Seconds to produce pre-encoded records and have them all acknowledged (after one untimed warm-up record)."""
    producer = Producer(kafka_config)
    acked = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    key, value, headers = records[0]
    producer.produce(topic, value, key, headers=headers, on_delivery=on_delivery)
    producer.flush()
    start = time.perf_counter()
    for i, (key, value, headers) in enumerate(records[1:]):
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


def warm_up_first(records: list[Record], event_id: str) -> list[Record]:
    """``records`` with the SDK's warm-up record (the one carrying ``event_id``) moved to the front."""
    first = next(i for i, (_, value, _) in enumerate(records)
                 if [e["event_id"] for e in decode_record(value)] == [event_id])  # the first byte tells the format
    return [records[first], *records[:first], *records[first + 1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("REWARDFLOW_KAFKA_BOOTSTRAP"))
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--format", choices=("avro", "json"), default="avro")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--max-delay-ms", type=float, default=ProducerConfig.max_delay_ms)
    ap.add_argument("--max-events", type=int, default=None)
    args = ap.parse_args()
    if not args.bootstrap:
        sys.exit("give --bootstrap HOST:PORT or set REWARDFLOW_KAFKA_BOOTSTRAP")
    settings = load_settings(kafka_bootstrap=args.bootstrap)
    events = sample_events(args.events, seed=11)
    encode = encode_avro if args.format == "avro" else encode_json
    header: list[tuple[str, str | bytes | None]] = [(FORMAT_HEADER, args.format.encode())]
    singles: list[Record] = [(e.session_id.encode(), encode([e.model_dump()]), header) for e in events]
    gc.collect()
    gc.freeze()  # the pre-built events are not garbage; keep the collector off them
    rows = []
    for run in range(args.runs):
        sdk_topic, raw_topic, single_topic = (f"bench.produce.{kind}.{uuid.uuid4().hex[:8]}" for kind in ("sdk", "raw", "single"))
        create_topics(args.bootstrap, {sdk_topic: args.partitions, raw_topic: args.partitions, single_topic: args.partitions})
        config = ProducerConfig(topic=sdk_topic, wire_format=args.format,
                                max_delay_ms=args.max_delay_ms, max_events=args.max_events, block_timeout_s=60.0)
        sdk_s, n_records = run_sdk(settings, config, events)
        records = warm_up_first(read_back(args.bootstrap, sdk_topic, n_records), events[0].event_id)
        raw_s = run_raw(config.resolve(settings).kafka, raw_topic, records)
        single_s = run_raw(config.resolve(settings).kafka, single_topic, singles)
        size = sum(len(v) for _, v, _ in records)
        timed = len(events) - 1  # the warm-up event is not timed
        with EventProducer(settings, config) as probe:
            cold_us, warm_us = encode_only(probe._writers, events[1:])
        rows.append({"run": run + 1, "sdk_events_s": timed / sdk_s, "raw_events_s": timed / raw_s,
                     "raw_per_event_events_s": timed / single_s, "records": n_records, "bytes": size,
                     "budget_us_per_event": raw_s / 0.7 / timed * 1e6, "sdk_us_per_event": sdk_s / timed * 1e6,
                     "encode_only_cold_us": cold_us, "encode_only_warm_us": warm_us,
                     "load_avg_1m": os.getloadavg()[0]})
        print(f"run {run + 1}: sdk {rows[-1]['sdk_events_s']:>10,.0f} ev/s   raw {rows[-1]['raw_events_s']:>10,.0f} ev/s   "
              f"raw per event {rows[-1]['raw_per_event_events_s']:>10,.0f} ev/s   {n_records} records, "
              f"{size / n_records:,.0f} B/record, {len(events) / n_records:.1f} events/record, load {os.getloadavg()[0]:.1f}")
        r = rows[-1]
        print(f"       per event: budget at 0.7 {r['budget_us_per_event']:.2f} us; SDK {r['sdk_us_per_event']:.2f} us; "
              f"encode only {r['encode_only_cold_us']:.2f} us as held (cold), {r['encode_only_warm_us']:.2f} us warm")
        delete_topics(args.bootstrap, [sdk_topic, raw_topic, single_topic], timeout=30)
    sdk = statistics.median(r["sdk_events_s"] for r in rows)
    raw = statistics.median(r["raw_events_s"] for r in rows)
    single = statistics.median(r["raw_per_event_events_s"] for r in rows)
    print(f"\n| {'producer':<32} | {'events/s (median of ' + str(args.runs) + ')':>24} |")
    print(f"|{'-' * 34}|{'-' * 26}|")
    label = f"rewardflow SDK ({args.format})"
    print(f"| {label:<32} | {sdk:>24,.0f} |")
    print(f"| {'raw confluent-kafka':<32} | {raw:>24,.0f} |")
    print(f"| {'ratio SDK / raw':<32} | {sdk / raw:>24.2f} |")
    print(f"| {'raw, one record per event':<32} | {single:>24,.0f} |")
    budget = statistics.median(r["budget_us_per_event"] for r in rows)
    cold = statistics.median(r["encode_only_cold_us"] for r in rows)
    warm = statistics.median(r["encode_only_warm_us"] for r in rows)
    print(f"\nPer event (medians): the 0.7 target allows {budget:.2f} us; the SDK's writers alone take {cold:.2f} us "
          f"to encode these events as held (cold in the caches), {warm:.2f} us warm.")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "events": args.events, "format": args.format, "partitions": args.partitions,
        "runs": rows,
        "median_sdk_events_s": sdk, "median_raw_events_s": raw, "ratio": sdk / raw,
        "median_raw_per_event_events_s": single,
        "median_budget_us_per_event": budget, "median_encode_only_cold_us": cold, "median_encode_only_warm_us": warm,
        "config": {k: v for k, v in config.resolve(settings).kafka.items()  # (not its logger, not credentials)
                   if "sasl" not in k and isinstance(v, str | int | float | bool)},
        "max_delay_ms": args.max_delay_ms, "python": platform.python_version(), "cpus": os.cpu_count(),
    }, indent=2))
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
