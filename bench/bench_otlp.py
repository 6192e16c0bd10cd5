"""OTLP ingestion throughput: ``POST /v1/traces`` of ``rewardflow collect``, beside the SDK. Not a test.

The workload is agent turns traced as the GenAI conventions have them: an ``invoke_agent`` root, a
``chat`` span and two ``execute_tool`` spans (one failing), so three of four spans become events.
Exports are protobuf ``ExportTraceServiceRequest`` bodies of ``--spans-per-export`` spans (512:
the OpenTelemetry SDK's ``BatchSpanProcessor`` default under load), sent by ``--clients`` threads on
keep-alive connections. The floor, in the same run: the SDK (``EventProducer``, default batching)
producing the same mapped events straight to Kafka.

Prints spans/s, events/s, export latency p50/p99, the SDK's events/s and the ratio; checks that
every mapped event reached the raw topic; writes ``bench/results/otlp.json``.

    python bench/bench_otlp.py [--turns 20000] [--clients 8] [--spans-per-export 512] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from bench_collect import cpu_seconds, create_keys, pct, read_back, run_sdk, start_collector

RESULTS = Path(__file__).resolve().parent / "results" / "otlp.json"
ORG = "org-bench"


def workload(turns: int, per_export: int, seed: int) -> tuple[list[bytes], list[Any], int]:
    """Export bodies, the events they map to (as models, for the SDK), and the span count."""
    import random

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from rewardflow.events.validate import validate_event
    from rewardflow.otlp.mapping import map_spans
    from rewardflow.otlp.spans import from_protobuf

    rng = random.Random(seed)
    t0 = (int(time.time()) - 3600) * 1_000_000_000

    def kv(k: str, v: Any) -> KeyValue:
        value = AnyValue(int_value=v) if isinstance(v, int) else AnyValue(string_value=v)
        return KeyValue(key=k, value=value)

    spans: list[tuple[bytes, bytes, str, int, int, dict[str, Any], bool]] = []
    for t in range(turns):
        trace, conv = rng.randbytes(16), f"conv-{t % max(1, turns // 4)}"
        start = t0 + t * 50_000_000
        common = {"gen_ai.conversation.id": conv}
        spans += [
            (trace, rng.randbytes(8), "invoke_agent", start, start + 3_000_000_000,
             {**common, "gen_ai.operation.name": "invoke_agent"}, False),
            (trace, rng.randbytes(8), "chat", start, start + rng.randint(300, 3000) * 1_000_000,
             {**common, "gen_ai.operation.name": "chat", "gen_ai.request.model": "ckpt-7",
              "gen_ai.usage.input_tokens": rng.randint(100, 4000), "gen_ai.usage.output_tokens": rng.randint(10, 800)},
             False),
            (trace, rng.randbytes(8), "execute_tool read_file", start, start + 40_000_000,
             {**common, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read_file"}, False),
            (trace, rng.randbytes(8), "execute_tool run_tests", start, start + 900_000_000,
             {**common, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "run_tests",
              "error.type": "TestFailure"}, True),
        ]
    bodies: list[bytes] = []
    models: list[Any] = []
    for i in range(0, len(spans), per_export):
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.extend([kv("service.name", "agent-backend"), kv("service.version", "2.1.0")])
        ss = rs.scope_spans.add()
        for trace, sid, name, start, end, attrs, failed in spans[i:i + per_export]:
            s = ss.spans.add(trace_id=trace, span_id=sid, name=name, start_time_unix_nano=start, end_time_unix_nano=end)
            s.attributes.extend(kv(k, v) for k, v in attrs.items())
            if failed:
                s.status.code = 2
        body = req.SerializeToString()
        bodies.append(body)
        models += [validate_event({**e, "org_id": ORG}) for e in map_spans(from_protobuf(body)).events]
    return bodies, models, len(spans)


def post_all(url: str, key: str, shards: list[list[bytes]]) -> tuple[float, list[float]]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    go, lat, errors = threading.Event(), [], []
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/x-protobuf"}

    def client(bodies: list[bytes]) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        go.wait()
        try:
            for body in bodies:
                while True:
                    t = time.perf_counter()
                    conn.request("POST", "/v1/traces", body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    lat.append(time.perf_counter() - t)
                    if resp.status in (429, 503):
                        time.sleep(float(resp.getheader("Retry-After") or 1))
                        continue
                    if resp.status != 200:
                        raise RuntimeError(f"POST /v1/traces: {resp.status} {data[:300]!r}")
                    break
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(s,), daemon=True) for s in shards]
    for t in threads:
        t.start()
    start = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"a client failed: {errors[0]}")
    return time.perf_counter() - start, sorted(lat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--bootstrap", default=os.environ.get("REWARDFLOW_KAFKA_BOOTSTRAP"),
                    help="Kafka to use; default: start a local broker in a temp dir (and stop it)")
    ap.add_argument("--turns", type=int, default=20_000, help="agent turns traced (4 spans each, 3 mapped)")
    ap.add_argument("--spans-per-export", type=int, default=512)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    from rewardflow.kafka_local.admin import create_topics
    from rewardflow.kafka_local.ports import free_ports
    from rewardflow.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="bench-otlp-"))
    broker = collector = None
    bootstrap = args.bootstrap
    try:
        bodies, models, n_spans = workload(args.turns, args.spans_per_export, args.seed)
        print(f"workload: {n_spans:,} spans in {len(bodies):,} exports -> {len(models):,} events")
        if not bootstrap:
            from rewardflow.kafka_local import LocalBroker
            from rewardflow.settings import load_settings

            port, cport = free_ports(2)
            broker = LocalBroker(load_settings().home, port, cport, partitions=args.partitions,
                                 data_dir=tmp / "kafka", die_with_parent=True)
            bootstrap = broker.up(timeout=120).bootstrap
        collect_port, web_port = free_ports(2)
        settings = Settings(kafka_bootstrap=bootstrap, topic_prefix=f"benchotlp{uuid.uuid4().hex[:8]}.",
                            partitions=args.partitions, home=tmp / "home", clickhouse_dsn=SecretStr(f"chdb://{tmp / 'chdb'}"),
                            collect_port=collect_port, web_port=web_port,
                            collect_rate_events_per_s=1e9, collect_rate_burst=1_000_000_000)
        (tmp / "home").mkdir()
        key = create_keys(settings, [ORG], tmp / "keys.log")[ORG]
        sdk_topic = f"{settings.topic_prefix}sdk"
        create_topics(bootstrap, {sdk_topic: args.partitions})
        sdk = run_sdk(settings, sdk_topic, models)
        print(f"SDK: {sdk['events_s']:,.0f} events/s")
        from rewardflow.kafka import topics as T

        create_topics(bootstrap, {settings.topic(T.RAW): args.partitions})
        collector = start_collector(settings, tmp)
        url = f"http://{settings.collect_host}:{settings.collect_port}"
        assert collector.proc is not None
        cpu0 = cpu_seconds(collector.proc.pid) or 0.0
        shards = [bodies[i::args.clients] for i in range(args.clients)]
        seconds, lat = post_all(url, key, shards)
        cpu = (cpu_seconds(collector.proc.pid) or 0.0) - cpu0
        records, events, distinct = read_back(bootstrap, settings.topic(T.RAW), args.partitions)
        if distinct != len(models):
            raise SystemExit(f"raw topic holds {distinct:,} distinct events; {len(models):,} were mapped")
        r = {"spans": n_spans, "exports": len(bodies), "events": len(models), "seconds": seconds,
             "spans_s": n_spans / seconds, "events_s": len(models) / seconds,
             "export_p50_ms": pct(lat, 0.5) * 1000, "export_p99_ms": pct(lat, 0.99) * 1000,
             "sdk_events_s": sdk["events_s"], "ratio": len(models) / seconds / sdk["events_s"],
             "collector_cores": cpu / seconds, "clients": args.clients, "spans_per_export": args.spans_per_export,
             "load_avg": os.getloadavg(), "raw_records": records}
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, indent=1))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(r, indent=1))
    finally:
        if collector is not None:
            collector.stop()
        if broker is not None:
            broker.down()


if __name__ == "__main__":
    main()
