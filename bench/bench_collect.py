"""Ingestion edge throughput: ``rewardflow collect`` over HTTP beside the SDK producing straight to Kafka. Not a test.

One run, on the same events:

1. workload (untimed): the simulator (``rewardflow.sim``, A/B config, 20 orgs, no
   noise) at ``--sessions-per-hour`` of event time, cut at ``--events``, in send order.
   The request shape (``--shape``):

   * ``sdk`` (default): one request per record the SDK cut from these events in step 3
     of this run (its default batching; read back from its topic): the same events per
     request as per Kafka record, so the ratio compares like with like. How many events
     a record holds depends on how fast the SDK emitted (~15-40 here).
   * ``live``: one request per simulated send group, a session's events due within
     ``--batch-window-ms`` (1 s: what the SDK's 100 ms batching cuts from live
     traffic, ~1.25 events per request): an editor sending as events happen.

   Each request's events are encoded to JSON up front (only ``sent_at`` is filled in
   at send time): clients run on other machines, here they share the 2 cores.
2. setup (untimed): a local Kafka broker (temp dir, free ports; or ``--bootstrap``),
   an embedded chDB database in a temp dir, migrated, with one ingest key per org
   (created by a short helper process: chDB lets one process own a directory, and
   the collector must own it), then ``rewardflow collect`` as a subprocess (its own
   GIL) on a free port with its own topic prefix. The per-key rate limit is lifted
   (``REWARDFLOW_COLLECT_RATE_EVENTS_PER_S``; its default of 5,000 events/s per key
   would be the figure otherwise); everything else is the production default.
3. SDK (timed): ``EventProducer`` (default batching, ``block_timeout_s`` 60) emits the
   same events, as pre-built models, in the same order to a fresh topic; from the
   second emit until every event is acknowledged (the first, untimed, connects).
4. collector (timed): ``--clients`` threads (or ``--procs`` processes of them), each
   over one keep-alive HTTP/1.1 connection with TCP_NODELAY (as urllib3 sets it), a lean
   client (one ``sendall`` per request, the answer read by ``Content-Length``: the load
   generator takes as little as it can of the two cores the collector and the broker share),
   ``POST /v1/events`` with the org's key; a session's requests always go through the same client, in order. A
   429 or 503 is retried after ``Retry-After`` (counted). One untimed request first
   warms the collector's producer; each connection is opened (``GET /healthz``)
   before the clock starts. Clock: from releasing the clients until the last 202.
   Per-request latency: request written until the response body is read.
5. check (untimed): the collector's raw topic is read back; every event must be
   there (distinct ``event_id``). Server-side: CPU seconds of the collector process
   (``/proc``) over the timed phase, per request, and the mean wait for Kafka's
   acknowledgement (its ``/metrics`` histogram); the same CPU figure for the broker
   and this client process. ``--profile`` also samples the collector with py-spy
   (when on PATH) and prints its hottest frames.

Prints a table: collector events/s and requests/s, p50/p99 request latency, SDK
events/s, ratio collector / SDK (target >= 0.5); writes ``bench/results/collect.json``.

    python bench/bench_collect.py [--events 50000] [--clients 32] [--procs 1] [--bootstrap HOST:PORT] [--profile]
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
import zlib
from pathlib import Path
from typing import Any

import orjson
from pydantic import SecretStr

RESULTS = Path(__file__).resolve().parent / "results" / "collect.json"
TARGET_RATIO = 0.5
CLK_TCK = os.sysconf("SC_CLK_TCK")

# A request to send: (session_id, org_id, events JSON array bytes, number of events)
Request = tuple[str, str, bytes, int]

_KEYS_HELPER = r"""
import json, sys
from rewardflow.clickhouse.connect import get_client
from rewardflow.clickhouse.migrate import migrate
from rewardflow.collector.keys import IngestKeys
client = get_client(dsn=sys.argv[1])
migrate(client)
keys = IngestKeys(client)
out = {org: keys.create(org, "bench-collect")[1] for org in sys.argv[2:]}
client.close()
print("KEYS " + json.dumps(out))
"""


# ---------------------------------------------------------------------- workload
def make_workload(n_events: int, sessions_per_hour: float, batch_window_ms: int, seed: int) -> tuple[list[Any], list[Request]]:
    """N simulated events: the models in send order (for the SDK) and one request per send group (for the edge)."""
    from rewardflow.events.validate import to_dict
    from rewardflow.sim import Simulator, ab_config

    sessions = max(1, int(n_events / 75) + 1)  # ~78 events per simulated session; truncated to N below
    duration_s = max(60.0, sessions / sessions_per_hour * 3600)
    start_ms = int(time.time() * 1000) - int(duration_s * 1000) - 2 * 3_600_000  # all in the past
    cfg = ab_config(sessions=sessions, duration_s=duration_s, start_ms=start_ms, seed=seed, batch_window_ms=batch_window_ms)
    models: list[Any] = []
    requests: list[Request] = []
    for group in Simulator(cfg).stream():
        if group.raw is not None or not group.events:
            continue
        events = list(group.events[: n_events - len(models)])
        models.extend(events)
        dicts = []
        for e in events:
            d = to_dict(e)
            if d.get("client_ts") is None:  # set by an edge, never by a client
                d.pop("client_ts", None)
            dicts.append(d)
        requests.append((group.session_id, dicts[0]["org_id"], orjson.dumps(dicts), len(dicts)))
        if len(models) >= n_events:
            break
    if len(models) < n_events:
        raise SystemExit(f"simulator made only {len(models)} events for {n_events}")
    return models, requests


# ---------------------------------------------------------------------- helpers
def rewardflow_exe() -> list[str]:
    exe = Path(sys.executable).parent / "rewardflow"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("rewardflow")
    return [found] if found else [sys.executable, "-c", "from rewardflow.cli.main import main; main()"]


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads) and of its live child processes, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own = (int(fields[11]) + int(fields[12])) / CLK_TCK
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (OSError, IndexError, ValueError):
        return None
    return own + sum(cpu_seconds(int(c)) or 0.0 for c in children)


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def body_of(events_json: bytes) -> bytes:
    """The request document, ``sent_at`` being the client's clock now."""
    return b'{"sent_at":%d,"events":%b}' % (int(time.time() * 1000), events_json)


def create_keys(settings: Any, orgs: list[str], log: Path) -> dict[str, str]:
    """Migrate the chDB directory and create one key per org, in a helper process that then lets go of it."""
    from rewardflow.demo.worker_proc import settings_env

    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")} | settings_env(settings)
    proc = subprocess.run([sys.executable, "-c", _KEYS_HELPER, settings.clickhouse_dsn.get_secret_value(), *orgs],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    log.write_text(proc.stdout + proc.stderr)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("KEYS ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"creating the ingest keys failed (exit {proc.returncode}); see {log}")
    return dict(json.loads(line[5:]))


# ---------------------------------------------------------------------- the SDK
def run_sdk(settings: Any, topic: str, models: list[Any]) -> dict[str, Any]:
    """bench_produce's SDK run (warm-up, then emit all and flush) on the same events."""
    from bench_produce import run_sdk as produce_sdk

    from rewardflow.client import ProducerConfig

    elapsed, records = produce_sdk(settings, ProducerConfig(topic=topic, block_timeout_s=60.0), models)
    timed = len(models) - 1
    return {"seconds": elapsed, "events": timed, "events_s": timed / elapsed, "records": records,
            "events_per_record": len(models) / records}


def sdk_requests(bootstrap: str, topic: str, partitions: int, n_records: int, models: list[Any]) -> list[Request]:
    """One request per record the SDK wrote (same events, same order), sorted by its first event's emit order."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from rewardflow.events.wire import decode_record

    position = {m.event_id: i for i, m in enumerate(models)}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[tuple[int, Request]] = []
    deadline = time.monotonic() + 120
    while len(out) < n_records and time.monotonic() < deadline:
        for msg in c.consume(5000, 0.5):
            if msg.error() is not None:
                continue
            events = decode_record(msg.value(), msg.headers())
            for e in events:
                if e.get("client_ts") is None:
                    e.pop("client_ts", None)
            out.append((position[events[0]["event_id"]],
                        (events[0]["session_id"], events[0]["org_id"], orjson.dumps(events), len(events))))
    c.close()
    if len(out) != n_records:
        raise SystemExit(f"read back {len(out)} of the SDK's {n_records} records")
    out.sort(key=lambda x: x[0])
    return [r for _, r in out]


# ---------------------------------------------------------------------- the HTTP clients
_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")


class Client(threading.Thread):
    """Sends its requests in order over one keep-alive connection; records each latency.

    A lean HTTP/1.1 client: each request is one ``sendall`` of prebuilt header bytes and the body,
    and the answer is read by ``Content-Length``: 0.06-0.08 ms of this process's CPU per request,
    against 0.24 ms with ``http.client`` (which parses every response's headers with the email
    package). On a shared 2-core machine the load generator's CPU is taken from the collector and
    the broker. TCP_NODELAY, as urllib3/requests set it.
    """

    def __init__(self, host: str, port: int, keys: dict[str, str], requests: list[Request], go: threading.Event) -> None:
        super().__init__(daemon=True, name="bench-collect-client")
        self.host, self.port, self.keys, self.requests, self.go = host, port, keys, requests, go
        self.latencies: list[float] = []
        self.done = self.events = self.retries = 0
        self.statuses: collections.Counter[int] = collections.Counter()
        self.rejected = 0
        self.finished_at = 0.0
        self.error: BaseException | None = None
        self.sock: socket.socket | None = None
        self._buf = b""

    def open(self) -> None:
        """Connect (untimed) and send one GET /healthz over the keep-alive connection."""
        self.sock = socket.create_connection((self.host, self.port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n" % self.host.encode())
        status, _headers, _body = self.answer()
        if status != 200:
            raise RuntimeError(f"GET /healthz: {status}")

    def answer(self) -> tuple[int, bytes, bytes]:
        """Read one response: its status, raw header block and body (by ``Content-Length``)."""
        assert self.sock is not None
        buf, recv = self._buf, self.sock.recv
        while (end := buf.find(b"\r\n\r\n")) < 0:
            chunk = recv(65536)
            if not chunk:
                raise ConnectionError("the collector closed the connection")
            buf += chunk
        head = buf[:end]
        found = _CONTENT_LENGTH.search(head)
        if found is None:
            raise ConnectionError(f"an answer without Content-Length: {head[:200]!r}")
        length = int(found.group(1))
        need = end + 4 + length
        while len(buf) < need:
            chunk = recv(65536)
            if not chunk:
                raise ConnectionError("the collector closed the connection")
            buf += chunk
        self._buf = buf[need:]
        return int(head[9:12]), head, buf[end + 4:need]

    def run(self) -> None:
        self.go.wait()
        assert self.sock is not None
        sendall, perf, lat = self.sock.sendall, time.perf_counter, self.latencies
        heads = {org: (f"POST /v1/events HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {key}\r\n"
                       "Content-Type: application/json\r\nContent-Length: ").encode()
                 for org, key in self.keys.items()}
        try:
            for _sid, org, events_json, n in self.requests:
                while True:
                    body = body_of(events_json)
                    t = perf()
                    sendall(b"%b%d\r\n\r\n%b" % (heads[org], len(body), body))
                    status, head, data = self.answer()
                    lat.append(perf() - t)
                    self.statuses[status] += 1
                    if status in (429, 503):
                        self.retries += 1
                        found = re.search(rb"(?i)\r\nretry-after:\s*(\d+)", head)
                        time.sleep(float(found.group(1)) if found else 1.0)
                        continue
                    if status != 202:
                        raise RuntimeError(f"POST /v1/events: {status} {data[:300]!r}")
                    if not data.endswith(b'"rejected":[],"clock_offset_ms":0}'):  # the common case, without parsing
                        doc = orjson.loads(data)
                        self.rejected += len(doc["rejected"])
                        if doc["rejected"]:
                            raise RuntimeError(f"events rejected: {doc['rejected'][:3]}")
                    break
                self.done += 1
                self.events += n
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
        finally:
            self.finished_at = perf()
            self.sock.close()


def shard(requests: list[Request], n: int) -> list[list[Request]]:
    """Split requests over ``n`` clients by session (a session's requests stay in order on one client)."""
    out: list[list[Request]] = [[] for _ in range(n)]
    for r in requests:
        out[zlib.crc32(r[0].encode()) % n].append(r)
    return out


def run_clients(url: str, keys: dict[str, str], shards: list[list[Request]], progress: Any = None,
                counter: Any = None) -> dict[str, Any]:
    """Run one thread per shard; returns latencies, counts and the clock (release -> last answer)."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    go = threading.Event()
    clients = [Client(host, int(port), keys, s, go) for s in shards]
    for c in clients:
        c.open()
        c.start()
    cpu0 = time.process_time()
    start = time.perf_counter()
    go.set()
    total = sum(len(s) for s in shards)
    while any(c.is_alive() for c in clients):
        time.sleep(0.2)
        done = sum(c.done for c in clients)
        if progress is not None:
            progress(done, total)
        if counter is not None:
            counter.value = done
    for c in clients:
        c.join()
        if c.error is not None:
            raise SystemExit(f"a client failed: {c.error!r}")
    end = max(c.finished_at for c in clients)
    statuses: collections.Counter[int] = collections.Counter()
    for c in clients:
        statuses.update(c.statuses)
    return {"start": start, "end": end, "latencies": [x for c in clients for x in c.latencies],
            "requests": sum(c.done for c in clients), "events": sum(c.events for c in clients),
            "retries": sum(c.retries for c in clients), "statuses": dict(statuses),
            "client_cpu_s": time.process_time() - cpu0}


def _client_proc(url: str, keys: dict[str, str], shards: list[list[Request]], ready: Any, go: Any, counter: Any,
                 out: Any) -> None:
    """A client process: its threads wait for ``go`` (a multiprocessing.Event); the result goes to ``out``."""
    ready.set()
    go.wait()
    res = run_clients(url, keys, shards, counter=counter)
    res["wall_start"], res["wall_end"] = time.time() - (time.perf_counter() - res["start"]), \
        time.time() - (time.perf_counter() - res["end"])
    out.put(res)


# ---------------------------------------------------------------------- the collector
def start_owner(settings: Any, workdir: Path) -> Any:
    """``rewardflow run --no-worker``: owns the chDB directory and serves the keys to several collectors."""
    from rewardflow.demo.worker_proc import ChildProcess

    proc = ChildProcess(settings, workdir / "owner.log", [*rewardflow_exe(), "run", "--no-worker", "--status-interval", "0",
                                                          "--monitor-interval", "0"], cwd=workdir, detach=True)
    proc.start()
    proc.wait_answering(f"http://127.0.0.1:{settings.web_port}/health", timeout=120)
    return proc


def start_collector(settings: Any, workdir: Path, processes: int = 1) -> Any:
    from rewardflow.demo.worker_proc import ChildProcess

    proc = ChildProcess(settings, workdir / "collect.log", [*rewardflow_exe(), "collect", "--log-level", "WARNING",
                                                            "--processes", str(processes)], cwd=workdir, detach=True)
    proc.start()
    proc.wait_answering(f"http://{settings.collect_host}:{settings.collect_port}/healthz", timeout=120)
    return proc


def metric_sums(url: str) -> dict[str, float]:
    """The collector's Prometheus samples as name{labels} -> value."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def read_back(bootstrap: str, topic: str, partitions: int, timeout: float = 120.0) -> tuple[int, int, int]:
    """(records, events, distinct event ids) in ``topic`` from its start."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from rewardflow.events.wire import decode_record

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}", "enable.auto.commit": False})
    highs = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(partitions)}
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    ids: set[str] = set()
    records = events = 0
    left = sum(highs.values())
    deadline = time.monotonic() + timeout
    while left > 0 and time.monotonic() < deadline:
        for msg in c.consume(5000, 0.5):
            if msg.error() is not None:
                continue
            left -= 1
            records += 1
            for e in decode_record(msg.value(), msg.headers()):
                events += 1
                ids.add(e["event_id"])
    c.close()
    return records, events, len(ids)


def py_spy() -> str | None:
    return shutil.which("py-spy") or next((str(p) for p in (Path(sys.executable).parent / "py-spy",) if p.exists()), None)


def summarise_profile(raw: Path, top: int = 12) -> dict[str, list[tuple[str, float]]]:
    """Shares of py-spy's samples (threads holding the GIL): by leaf function (self), and by rewardflow function
    on the stack (inclusive); line numbers dropped."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    n = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or not stack:
            continue
        c = int(count)
        n += c
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        own[frames[-1]] += c
        for frame in set(frames):
            if "(rewardflow/" in frame:
                incl[frame] += c
    if not n:
        return {}
    return {"samples": [("all", float(n))],
            "self": [(f, v / n) for f, v in own.most_common(top)],
            "inclusive": [(f, v / n) for f, v in incl.most_common(top)]}


# ---------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--bootstrap", default=os.environ.get("REWARDFLOW_KAFKA_BOOTSTRAP"),
                    help="Kafka to use; default: start a local broker in a temp dir (and stop it)")
    ap.add_argument("--events", type=int, default=50_000, help="events sent by each of the SDK and the clients")
    ap.add_argument("--clients", type=int, default=32, help="concurrent HTTP clients (keep-alive connections), in total")
    ap.add_argument("--procs", type=int, default=1, help="client processes the clients are spread over (1: threads here)")
    ap.add_argument("--collectors", type=int, default=1, help="collector processes on the one port "
                    "(rewardflow collect --processes N; above 1 a `rewardflow run --no-worker` owns chDB and serves the keys)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--sessions-per-hour", type=float, default=2_000.0)
    ap.add_argument("--shape", choices=("sdk", "live"), default="sdk",
                    help="sdk: one request per record the SDK cut from these events in this run (same events per "
                         "request); live: one request per simulated send group (--batch-window-ms)")
    ap.add_argument("--batch-window-ms", type=int, default=1_000,
                    help="live shape: a session's events due within this form one request (1 s: what the SDK's "
                         "100 ms batching cuts from live traffic, ~1.3 events/request)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="sample the collector with py-spy (if on PATH) while timed")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.clients < args.procs or args.procs < 1:
        ap.error("need --procs >= 1 and --clients >= --procs")

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rewardflow.kafka import topics as T
    from rewardflow.kafka_local.admin import create_topics
    from rewardflow.kafka_local.ports import free_ports
    from rewardflow.settings import Settings

    console = Console()
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-collect-"))
    broker = collector = spy = owner = None
    bootstrap, broker_pid = args.bootstrap, None
    try:
        with console.status("generating the workload"):
            t = time.perf_counter()
            models, requests = make_workload(args.events, args.sessions_per_hour, args.batch_window_ms, args.seed)
        orgs = sorted({r[1] for r in requests})
        console.print(f"workload: {len(models):,} events, {len(requests):,} send groups of live traffic "
                      f"({len(models) / len(requests):.2f} events/group), {len(orgs)} orgs, generated in "
                      f"{time.perf_counter() - t:.1f} s")
        if not bootstrap:
            from rewardflow.kafka_local import LocalBroker
            from rewardflow.settings import load_settings

            with console.status("starting a local Kafka broker"):
                port, cport = free_ports(2)
                broker = LocalBroker(load_settings().home, port, cport, partitions=args.partitions,
                                     data_dir=tmp / "kafka", die_with_parent=True)
                info = broker.up(timeout=120)
                bootstrap, broker_pid = info.bootstrap, info.pid
        collect_port, web_port = free_ports(2)
        settings = Settings(kafka_bootstrap=bootstrap, topic_prefix=f"benchcollect{uuid.uuid4().hex[:8]}.",
                            partitions=args.partitions, home=tmp / "home", clickhouse_dsn=SecretStr(f"chdb://{tmp / 'chdb'}"),
                            collect_port=collect_port, web_port=web_port,
                            collect_rate_events_per_s=1e9, collect_rate_burst=1_000_000_000)
        (tmp / "home").mkdir()
        with console.status(f"creating {len(orgs)} ingest keys in chDB"):
            keys = create_keys(settings, orgs, tmp / "keys.log")

        # ---- SDK straight to Kafka
        sdk_topic = f"{settings.topic_prefix}sdk"
        create_topics(bootstrap, {sdk_topic: args.partitions})
        with console.status(f"SDK: emitting {len(models):,} events"):
            sdk = run_sdk(settings, sdk_topic, models)
        console.print(f"SDK: {sdk['events_s']:,.0f} events/s ({sdk['seconds']:.2f} s, {sdk['records']:,} records, "
                      f"{sdk['events_per_record']:.2f} events/record)")
        if args.shape == "sdk":
            with console.status("reading the SDK's records back: one request each"):
                requests = sdk_requests(bootstrap, sdk_topic, args.partitions, sdk["records"], models)
        console.print(f"requests ({args.shape} shape): {len(requests):,}, {len(models) / len(requests):.2f} events/request, "
                      f"{sum(len(r[2]) for r in requests) / len(requests):,.0f} B of events JSON/request")

        # ---- the collector
        with console.status("starting rewardflow collect"):
            if args.collectors > 1:
                owner = start_owner(settings, tmp)
            collector = start_collector(settings, tmp, args.collectors)
        url = f"http://{settings.collect_host}:{settings.collect_port}"
        assert collector.proc is not None
        server_pid = collector.proc.pid
        warm = requests[0]
        conn = http.client.HTTPConnection(settings.collect_host, settings.collect_port, timeout=60)
        conn.request("POST", "/v1/events", body=body_of(warm[2]),
                     headers={"Authorization": f"Bearer {keys[warm[1]]}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        warm_body = resp.read()
        conn.close()
        if resp.status != 202:
            raise SystemExit(f"warm-up request: {resp.status} {warm_body[:300]!r}")
        timed = requests[1:]
        timed_events = sum(r[3] for r in timed)
        shards = shard(timed, args.clients)
        m0 = metric_sums(url)
        spy_out = tmp / "profile.txt"
        if args.profile:
            exe = py_spy()
            if exe is None:
                console.print("[yellow]--profile: py-spy not found on PATH; no profile[/]")
            else:
                spy = subprocess.Popen([exe, "record", "-p", str(server_pid), "-r", "250", "-f", "raw", "-o", str(spy_out),
                                        "--gil", "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
        cpu_server0, cpu_broker0 = cpu_seconds(server_pid), cpu_seconds(broker_pid) if broker_pid else None
        with Progress(TextColumn("collector"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("requests", total=len(timed))
            if args.procs == 1:
                res = run_clients(url, keys, shards, progress=lambda done, _total: bar.update(task, completed=done))
                wall_s = res["end"] - res["start"]
                latencies, client_cpu = res["latencies"], res["client_cpu_s"]
                n_req, n_ev, retries, statuses = res["requests"], res["events"], res["retries"], res["statuses"]
            else:
                ctx = mp.get_context("spawn")
                go, out = ctx.Event(), ctx.Queue()
                groups = [shards[i::args.procs] for i in range(args.procs)]
                counters = [ctx.Value("q", 0, lock=False) for _ in groups]
                readies = [ctx.Event() for _ in groups]
                procs = [ctx.Process(target=_client_proc, args=(url, keys, g, r, go, c, out), daemon=True)
                         for g, r, c in zip(groups, readies, counters, strict=True)]
                for p in procs:
                    p.start()
                for r in readies:
                    r.wait(120)
                time.sleep(1.0)  # let each process open its connections
                go.set()
                results: list[dict[str, Any]] = []
                while len(results) < len(procs):
                    try:
                        results.append(out.get(timeout=0.2))
                    except Exception:  # noqa: BLE001 - queue.Empty
                        if not any(p.is_alive() for p in procs) and out.empty():
                            raise SystemExit("a client process died") from None
                    bar.update(task, completed=sum(c.value for c in counters))
                for p in procs:
                    p.join(30)
                wall_s = max(r["wall_end"] for r in results) - min(r["wall_start"] for r in results)
                latencies = [x for r in results for x in r["latencies"]]
                client_cpu = sum(r["client_cpu_s"] for r in results)
                n_req, n_ev = sum(r["requests"] for r in results), sum(r["events"] for r in results)
                retries = sum(r["retries"] for r in results)
                statuses = dict(sum((collections.Counter(r["statuses"]) for r in results), collections.Counter()))
        cpu_server1, cpu_broker1 = cpu_seconds(server_pid), cpu_seconds(broker_pid) if broker_pid else None
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
            spy = None
        m1 = metric_sums(url)
        assert n_ev == timed_events, (n_ev, timed_events)
        ack_n = m1.get("rewardflow_collect_kafka_ack_seconds_count", 0) - m0.get("rewardflow_collect_kafka_ack_seconds_count", 0)
        ack_s = m1.get("rewardflow_collect_kafka_ack_seconds_sum", 0) - m0.get("rewardflow_collect_kafka_ack_seconds_sum", 0)
        latencies.sort()
        server_cpu = (cpu_server1 - cpu_server0) if cpu_server0 is not None and cpu_server1 is not None else None
        broker_cpu = (cpu_broker1 - cpu_broker0) if cpu_broker0 is not None and cpu_broker1 is not None else None
        col = {"seconds": wall_s, "events": n_ev, "requests": n_req, "events_s": n_ev / wall_s, "requests_s": n_req / wall_s,
               "latency_p50_ms": pct(latencies, 0.50) * 1e3, "latency_p90_ms": pct(latencies, 0.90) * 1e3,
               "latency_p99_ms": pct(latencies, 0.99) * 1e3, "latency_max_ms": latencies[-1] * 1e3,
               "latency_mean_ms": statistics.fmean(latencies) * 1e3, "retries": retries,
               "statuses": {str(k): v for k, v in statuses.items()},
               "kafka_ack_mean_ms": ack_s / ack_n * 1e3 if ack_n else None,
               "server_cpu_s": server_cpu, "server_cpu_share_of_a_core": server_cpu / wall_s if server_cpu else None,
               "server_cpu_ms_per_request": server_cpu / n_req * 1e3 if server_cpu else None,
               "broker_cpu_s": broker_cpu, "client_cpu_s": client_cpu,
               "client_cpu_ms_per_request": client_cpu / n_req * 1e3}

        # ---- check: every event reached the raw topic
        with console.status("reading the collector's raw topic back"):
            expect = timed_events + warm[3]
            records, got_events, distinct = read_back(bootstrap, settings.topic(T.RAW), args.partitions)
        col.update(raw_records=records, raw_events=got_events, raw_distinct_events=distinct)
        if distinct != expect:
            console.print(f"[red]WARNING: {distinct:,} distinct events in the raw topic, expected {expect:,}[/]")
        profile = summarise_profile(spy_out) if spy_out.exists() else {}
    finally:
        if spy is not None:
            spy.kill()
        if collector is not None:
            collector.stop(30)
        if owner is not None:
            owner.stop(30)
        if broker is not None:
            broker.down(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)

    ratio = col["events_s"] / sdk["events_s"]
    report = {
        "events": args.events, "clients": args.clients, "procs": args.procs, "collectors": args.collectors,
        "partitions": args.partitions,
        "shape": args.shape,
        "batch_window_ms": args.batch_window_ms, "sessions_per_hour": args.sessions_per_hour,
        "requests_total": len(requests), "events_per_request": len(models) / len(requests),
        "collector": col, "sdk": sdk, "ratio": ratio, "target_ratio": TARGET_RATIO,
        "profile": profile,
        "settings": "production defaults, except collect_rate_events_per_s (lifted)",
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "loadavg_1_5_15": {"before": list(load_before), "after": list(os.getloadavg())},
    }
    print_table(report, console)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.out}")


def print_table(r: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    c, s = r["collector"], r["sdk"]
    t = Table(title=f"rewardflow collect vs SDK, {r['events']:,} events, {r['shape']} shape ({r['events_per_request']:.2f} "
                    "events/request), "
                    f"{r['clients']} clients in {r['procs']} process(es); load avg {r['loadavg_1_5_15']['before'][0]:.1f} -> "
                    f"{r['loadavg_1_5_15']['after'][0]:.1f} on {r['cpus']} cores (shared machine)")
    for col, just in (("figure", "left"), ("value", "right"), ("note", "left")):
        t.add_column(col, justify=just)
    t.add_row("collector events/s", f"{c['events_s']:,.0f}", f"{c['events']:,} events in {c['seconds']:.1f} s, all 202")
    t.add_row("collector requests/s", f"{c['requests_s']:,.0f}", f"{c['retries']} retried (429/503)")
    t.add_row("request latency p50 / p99", f"{c['latency_p50_ms']:.1f} / {c['latency_p99_ms']:.1f} ms",
              f"p90 {c['latency_p90_ms']:.1f}, max {c['latency_max_ms']:.0f} ms")
    t.add_row("SDK straight to Kafka events/s", f"{s['events_s']:,.0f}",
              f"{s['records']:,} records, {s['events_per_record']:.2f} events/record")
    t.add_row("ratio collector / SDK", f"{r['ratio']:.3f}", f"target >= {r['target_ratio']}")
    if c.get("server_cpu_s") is not None:
        t.add_row("collector CPU", f"{c['server_cpu_share_of_a_core']:.2f} cores",
                  f"{c['server_cpu_ms_per_request']:.2f} ms CPU/request; Kafka ack wait mean "
                  f"{c['kafka_ack_mean_ms'] or 0:.1f} ms/request")
    t.add_row("client CPU", f"{c['client_cpu_s'] / c['seconds']:.2f} cores",
              f"{c['client_cpu_ms_per_request']:.2f} ms CPU/request"
              + (f"; broker {c['broker_cpu_s'] / c['seconds']:.2f} cores" if c.get("broker_cpu_s") is not None else ""))
    t.add_row("raw topic check", f"{c['raw_distinct_events']:,}", f"distinct events in {c['raw_records']:,} records")
    console.print(t)
    if r["profile"]:
        console.print(f"collector profile: py-spy --gil, {r['profile']['samples'][0][1]:,.0f} samples while timed")
        for kind in ("self", "inclusive"):
            console.print(f"  {kind}:")
            for frame, share in r["profile"][kind]:
                console.print(f"    {share:6.1%}  {frame}")


if __name__ == "__main__":
    main()
