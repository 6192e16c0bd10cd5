"""End-to-end benchmark: Kafka raw topic -> ``rewardflow run`` (``--workers`` stream worker processes and the sink) -> rows in chDB. Not a test.

For each size N (``--sizes``, default 100k, 300k, 1M events) and each repeat (``--repeat``):

1. untimed: the simulator (``rewardflow.sim``, A/B config, no noise) makes N
   events; session starts arrive at a constant ``--sessions-per-hour`` so a
   bigger N means *more hours* of traffic, not more concurrent sessions (state
   should then stay flat thanks to expiry). A session's events due within
   ``--batch-window-ms`` form one Kafka record, a session batch framed as the
   SDK frames every record (``--format``: Avro, the SDK's default, or JSON),
   keyed by session_id with header ``rf-format``. They
   are produced to the raw topic of a fresh topic prefix with a plain
   confluent-kafka producer *before* the pipeline starts.
2. pipeline: ``rewardflow run`` starts as a subprocess (its own chDB path,
   idle timeout 1 s and idle clock rate 1000 so the tail of turns finalises
   within seconds after the backlog). Clock: from ``Popen`` until
   ``SELECT count() FROM events`` on the worker's read endpoint reaches N
   (asked every 0.25 s once the rate so far puts the end within a second, up to every 2 s
   before: each query costs the run process CPU). Also reported: the same rate counted from the moment
   the read endpoint answers (startup excluded).
3. freshness: once the final rewards stop changing, every record of the
   rewards topic is read with its Kafka timestamp (the time the worker emitted
   the reward = the turn's finalisation) and joined by ``reward_id`` with the
   ``rewards`` table's ``_inserted_at`` (server time of the sink's insert):
   p50/p99 of the delay, for final rewards (and all rows). Target p99 <= 2 s.
   Note: most rewards here are emitted *during* the backlog, i.e. under full
   load, which is the worst case.
   With ``--steady FRACTION`` (default 0.5), each size gets one more run in steady state:
   ``rewardflow run`` starts on an empty raw topic and, once ready, an idempotent producer
   feeds the same records in order at FRACTION x the median rate the backlog runs reached
   after ready (half the measured maximum by default), paced by event count. Freshness is
   then measured as above, at a constant input rate instead of while draining a backlog.
   Fed this way, event time runs faster than the wall clock (hours of traffic in seconds),
   so the idle clock runs at half that pace (idle timeout 2 s): faster, a partition the
   worker reached late would tick its watermark past records still to come.
4. memory: ``VmHWM`` (peak RSS) from /proc after all turns are finalised, of the
   ``rewardflow run`` process (the sink and the embedded engine) and of its largest worker
   process, beside the number of finalised turns, and the run process's RSS right after its
   read endpoint came up (its startup floor). Every 8 s it also samples the run process's
   anonymous and file-backed RSS and what the engine accounts for (``system.metrics``,
   ``system.parts``, ``system.jemalloc_stats``); the report prints the sample of largest
   anonymous RSS and the last one, and ``memory_series`` in the JSON holds them all. What the
   engine's allocator does not hold of the anonymous RSS is the C heap and Python's.
5. floor: in this process, a plain confluent-kafka consumer reads the same
   raw records, decodes them (``decode_record``: fastavro/orjson, no
   validation), builds the ``events`` rows (envelope columns + payload JSON +
   source partition/offset) as Arrow and ``insert_arrow``s them in batches of
   ``sink_batch_rows`` into a chDB database of this process (another path than
   the worker's). Ratio = pipeline / floor (target >= 0.5; target pipeline
   >= 20k events/s with the broker on the same 2-core machine).
6. CPU: the machine's busy CPU seconds from start to the last row stored (``/proc/stat``),
   split into the workers, the ``rewardflow run`` process and the rest (the broker, this
   script's polling, the host), per event. The pipeline runs one worker per core unless
   ``--workers`` says otherwise.

Prints a rich table and writes ``bench/results/e2e.json`` (with the load
average: this machine is shared, numbers move with it).

    python bench/bench_e2e.py [--bootstrap HOST:PORT] [--sizes 100000,300000,1000000] [--repeat 3] [--quick]

Without ``--bootstrap`` (or ``REWARDFLOW_KAFKA_BOOTSTRAP``) a local broker is started (and stopped) in a temp dir.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from pydantic import SecretStr

from rewardflow.kafka import topics as T
from rewardflow.clickhouse.catalog import table as table_def
from rewardflow.clickhouse.connect import get_client
from rewardflow.clickhouse.ddl import create_database
from rewardflow.clickhouse.dsn import parse_dsn
from rewardflow.clickhouse.migrate import migrate
from rewardflow.clickhouse.remote import RemoteReader, endpoint_alive
from rewardflow.readapi.tokens import read_local_token
from rewardflow.children import default_worker_count
from rewardflow.demo.worker_proc import ChildProcess
from rewardflow.events.validate import to_dict

from bench_stream import produce  # noqa: E402 - the benches run as scripts from bench/
from rewardflow.events.wire import AVRO, JSON, decode_record, encode_avro
from rewardflow.kafka_local.ports import free_ports, port_is_free
from rewardflow.kafka.provision import ensure_topics
from rewardflow.settings import Settings
from rewardflow.sim import Simulator, ab_config

RESULTS = Path(__file__).resolve().parent / "results" / "e2e.json"
TARGET_EVENTS_S = 20_000
TARGET_RATIO = 0.5
TARGET_FRESH_P99_S = 2.0
Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


# ---------------------------------------------------------------------- workload
def make_records(n_events: int, sessions_per_hour: float, batch_window_ms: int,
                 seed: int, now_ms: int | None = None, fmt: str = AVRO) -> tuple[list[Record], int, list[int], float]:
    """N simulated events as session-batch records in send order, in wire format ``fmt`` (Avro, the SDK's
    default, or JSON, as the SDK writes them with ``wire_format="json"``); also the number of distinct turns,
    each record's event count and the seconds of event time they span. Event time ends about an hour
    before ``now_ms`` (default: the wall clock); the same ``now_ms`` and seed give the same records."""
    sessions = max(1, int(n_events / 75) + 1)  # ~78 events per simulated session; truncated to N below
    duration_s = max(60.0, sessions / sessions_per_hour * 3600)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    start_ms = now - int(duration_s * 1000) - 2 * 3_600_000  # all in the past, newest ~1 h ago (TTL-safe)
    cfg = ab_config(sessions=sessions, duration_s=duration_s, start_ms=start_ms, seed=seed,
                    batch_window_ms=batch_window_ms)
    records: list[Record] = []
    sizes: list[int] = []
    turns: set[str] = set()
    total = 0
    for group in Simulator(cfg).stream():
        if group.raw is not None or not group.events:
            continue
        events = [to_dict(e) for e in group.events][: n_events - total]
        total += len(events)
        turns.update(e["request_id"] for e in events if e["event_type"] == "InferenceServed")
        # framed as the SDK frames every record, one event or many: a session batch (its encoders write
        # the bytes of encode_avro with a batch id, and of {"batch_id", "session_id", "events"} in JSON)
        if fmt == JSON:
            value = orjson.dumps({"batch_id": events[0]["event_id"], "session_id": group.session_id, "events": events})
        else:
            value = encode_avro(events, batch_id=events[0]["event_id"])
        records.append((group.session_id.encode(), value, [("rf-format", fmt.encode())]))
        sizes.append(len(events))
        if total >= n_events:
            break
    if total < n_events:
        raise SystemExit(f"simulator made only {total} events for {n_events}")
    return records, len(turns), sizes, duration_s


# ---------------------------------------------------------------------- the pipeline
def web_ports() -> int:
    """A free port P with P+1 free too (read endpoint, metrics)."""
    for _ in range(50):
        (p,) = free_ports(1)
        if p < 65535 and port_is_free(p + 1):
            return p
    raise SystemExit("no two consecutive free ports")


def proc_status(pid: int, field: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rewardflow_exe() -> list[str]:
    exe = Path(sys.executable).parent / "rewardflow"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("rewardflow")
    if found:
        return [found]
    return [sys.executable, "-c", "from rewardflow.cli.main import main; main()"]


def scalar(reader: RemoteReader, sql: str) -> int:
    return int(reader.query_arrow(sql).column(0)[0].as_py())


def count_wait(count: int, n_events: int, rows_for_s: float | None) -> float:
    """Seconds until the count is asked again: a quarter of the time the rows left take at the rate so
    far, between 0.25 s (the end within a second) and 2 s; 0.25 s before the first row."""
    if not count or not rows_for_s or rows_for_s <= 0:
        return 0.25
    left_s = (n_events - count) / (count / rows_for_s)
    return min(2.0, max(0.25, left_s / 4))


def sample_merges(reader: RemoteReader, peaks: dict[str, float]) -> None:
    """Raise ``peaks[table]`` to the memory (MB) of each merge running now: the engine's share of the
    peak RSS moves with the size of the parts it merges. A failed query is skipped."""
    try:
        got = reader.query_arrow("SELECT table, max(memory_usage) AS m FROM system.merges "
                                 "WHERE database = currentDatabase() GROUP BY table").to_pydict()
    except Exception:  # noqa: BLE001 - a sample, not a result
        return
    for table, mem in zip(got["table"], got["m"], strict=True):
        peaks[table] = max(peaks.get(table, 0.0), mem / 2**20)


_JEMALLOC = re.compile(r"Allocated: (\d+), active: (\d+), metadata: (\d+).*?resident: (\d+), mapped: (\d+), retained: (\d+)",
                       re.S)


def engine_memory(reader: RemoteReader) -> dict[str, float]:
    """MB the embedded engine accounts for now: its tracked total, each cache that holds anything, the
    active parts' primary keys and marks (and their count), and its allocator's totals. A failed query
    leaves its figures out: a diagnosis, not a result."""
    out: dict[str, float] = {}
    queries = (
        "SELECT metric, toFloat64(value) FROM system.metrics WHERE (metric = 'MemoryTracking' "
        "OR metric LIKE '%CacheBytes') AND value != 0",
        "SELECT 'primary_keys', toFloat64(sum(primary_key_bytes_in_memory_allocated)) FROM system.parts "
        "WHERE active UNION ALL SELECT 'marks', toFloat64(sum(marks_bytes)) FROM system.parts WHERE active "
        "UNION ALL SELECT 'active_parts', toFloat64(count()) FROM system.parts WHERE active",
    )
    for sql in queries:
        try:
            got = reader.query_arrow(sql).to_pylist()
        except Exception:  # noqa: BLE001 - a diagnosis
            continue
        for row in got:
            name, value = list(row.values())
            out[name] = value if name == "active_parts" else value / 2**20
    try:
        stats = str(reader.query_arrow("SELECT stats FROM system.jemalloc_stats").column(0)[0].as_py())
        m = _JEMALLOC.search(stats)
        if m:
            for name, value in zip(("allocated", "active", "metadata", "resident", "mapped", "retained"),
                                   m.groups(), strict=True):
                out[f"jemalloc_{name}"] = int(value) / 2**20
    except Exception:  # noqa: BLE001 - a diagnosis
        pass
    return out


def memory_sample(reader: RemoteReader, pid: int, t: float) -> dict[str, float]:
    """One point of a run's memory series: seconds since start, the process's anonymous and
    file-backed RSS (MB) and :func:`engine_memory`."""
    return {"t": t, "rss_anon": proc_status(pid, "RssAnon") or 0.0, "rss_file": proc_status(pid, "RssFile") or 0.0,
            **engine_memory(reader)}


def memory_line(series: list[dict[str, float]]) -> str:
    """The series' point of largest anonymous RSS and its last point, for a run's report."""
    if not series:
        return ""

    def point(p: dict[str, float]) -> str:
        return (f"{p['t']:.0f} s: anon {p['rss_anon']:,.0f}, file {p['rss_file']:,.0f}, engine allocator resident "
                f"{p.get('jemalloc_resident', 0):,.0f} (allocated {p.get('jemalloc_allocated', 0):,.0f}), tracked "
                f"{p.get('MemoryTracking', 0):,.0f}, marks cache {p.get('MarkCacheBytes', 0):,.1f}, parts "
                f"{p.get('active_parts', 0):,.0f}")
    top = max(series, key=lambda p: p["rss_anon"])
    return f"    memory, MB, largest anon at {point(top)}; at the end {point(series[-1])}"


def largest_merge(run: dict[str, Any]) -> str:
    """`` (largest merge 412 MB, rewards)`` from a run's merge peaks, or '' when no merge was seen."""
    peaks = run.get("merge_peak_mb") or {}
    if not peaks:
        return ""
    table, mb = max(peaks.items(), key=lambda kv: kv[1])
    return f" (largest merge {mb:,.0f} MB, {table})"


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used so far; 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every core, anything but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


class CpuLedger:
    """Where the machine's CPU went over a pipeline run: the workers, the ``rewardflow run`` process
    (sink, embedded engine, read API), and the rest (the broker, this benchmark's polling, the host)."""

    def __init__(self, run_pid: int) -> None:
        self.run_pid = run_pid
        self.worker_cpu: dict[int, float] = {}
        self.machine0 = machine_busy_seconds()

    def sample(self) -> None:
        """Keep each worker's CPU so far (call while polling: a worker that exits keeps its last reading)."""
        for w in worker_pids(self.run_pid):
            self.worker_cpu[w] = max(self.worker_cpu.get(w, 0.0), cpu_seconds(w))

    def totals(self, n_events: int, seconds: float) -> dict[str, float]:
        self.sample()
        machine = machine_busy_seconds() - self.machine0
        workers, run = sum(self.worker_cpu.values()), cpu_seconds(self.run_pid)
        return {"machine_s": machine, "cores_busy": machine / seconds, "workers_s": workers, "run_s": run,
                "rest_s": max(0.0, machine - workers - run), "us_per_event": machine / n_events * 1e6,
                "worker_us_per_event": workers / n_events * 1e6, "run_us_per_event": run / n_events * 1e6}


def worker_pids(pid: int) -> list[int]:
    """The stream worker processes ``rewardflow run`` (``pid``) supervises."""
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if Path(f"/proc/{pid}").exists() else []:
        try:
            if b"rewardflow_streams.main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(int(child))
        except OSError:
            pass
    return out


class PacedProducer(threading.Thread):
    """Produces ``records`` in order at ``rate`` events/s (a steady input, as live clients send), with
    an idempotent producer as :func:`produce` has, lingering 5 ms instead of 20 since the feed is paced;
    ``error`` holds what stopped it."""

    def __init__(self, bootstrap: str, topic: str, records: list[Record], events_per_record: list[int],
                 rate: float) -> None:
        super().__init__(daemon=True, name="bench-paced-producer")
        self.bootstrap, self.topic, self.records, self.sizes, self.rate = bootstrap, topic, records, events_per_record, rate
        self.started_at = self.finished_at = 0.0
        self.max_behind_s = 0.0  # how far the producer itself fell behind its schedule
        self.error: BaseException | None = None

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "partitioner": T.RAW_PARTITIONER,
                             "enable.idempotence": True, "compression.type": "lz4", "message.max.bytes": 2_000_000})
        try:
            self.started_at = start = time.perf_counter()
            sent = 0
            for (key, value, headers), n in zip(self.records, self.sizes, strict=True):
                due = start + sent / self.rate
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                else:
                    self.max_behind_s = max(self.max_behind_s, now - due)
                while True:
                    try:
                        producer.produce(self.topic, value, key, headers=headers)
                        break
                    except BufferError:
                        producer.poll(0.01)
                producer.poll(0)
                sent += n
            if producer.flush(120) != 0:
                raise RuntimeError("the paced producer did not finish")
            self.finished_at = time.perf_counter()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc


def run_pipeline(settings: Settings, n_events: int, n_turns: int, workdir: Path, timeout: float, workers: int = 1,
                 paced: PacedProducer | None = None) -> dict[str, Any]:
    """Start ``rewardflow run`` and time it until every event is stored; with ``paced``, the raw topic is
    empty at the start and ``paced`` feeds it once the pipeline is ready (steady state). Then wait for
    the tail of the ``n_turns`` turns to be finalised (see below) and read the counts."""
    run = ChildProcess(settings, workdir / "run.log", [*rewardflow_exe(), "run", "--workers", str(workers)],
                       cwd=workdir, detach=True)
    t0 = time.perf_counter()
    run.start()
    assert run.proc is not None
    proc = run.proc
    cpu = CpuLedger(proc.pid)
    url = f"http://{settings.web_host}:{settings.web_port}"
    out: dict[str, Any] = {"pid": proc.pid, "log": str(run.log_path)}
    try:
        def check() -> None:
            if not run.alive:
                raise SystemExit(f"rewardflow run exited with {proc.returncode}; log: {run.log_path}")
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"timed out after {timeout}s; log: {run.log_path}")

        while not endpoint_alive(url, timeout=0.5):
            check()
            time.sleep(0.1)
        t_ready = time.perf_counter()
        out["rss_at_ready_mb"] = proc_status(proc.pid, "VmRSS")
        if paced is not None:
            paced.start()
        reader = RemoteReader(url, token=read_local_token(settings.home), timeout=60)  # (the owner writes it)
        count, t_first, max_rss = 0, None, 0.0
        merge_mb: dict[str, float] = {}  # the largest memory a running merge took, by table
        series: list[dict[str, float]] = []  # the run process's memory and the engine's share, every 8 s
        # Each query costs the run process ~5-20 ms of CPU (bench/README.md, "What the polling costs"), so
        # the count is asked as often as the end needs: every 0.25 s once the rate says the end is within
        # a second, up to every 2 s before. /proc (RSS, CPU) is read every 0.25 s: it costs the run nothing.
        next_count = next_merges = next_memory = time.perf_counter()
        while count < n_events:
            check()
            if paced is not None and paced.error is not None:
                raise SystemExit(f"the paced producer failed: {paced.error!r}")
            time.sleep(0.25)
            now = time.perf_counter()
            max_rss = max(max_rss, proc_status(proc.pid, "VmRSS") or 0.0)
            cpu.sample()
            if now >= next_count:
                try:
                    # every event accounted for: stored as valid, or routed late (the simulated clients
                    # deliver some events long after their turn; those never reach `events`)
                    count = scalar(reader, "SELECT (SELECT count() FROM events) + (SELECT count() FROM late_events)")
                except Exception:  # noqa: BLE001 - the table may not be migrated for a moment
                    count = 0
                now = time.perf_counter()
                if count and t_first is None:
                    t_first = now
                next_count = now + count_wait(count, n_events, None if t_first is None else now - t_first)
            if now >= next_merges:
                sample_merges(reader, merge_mb)
                next_merges = now + 2.0
            if now >= next_memory:
                series.append(memory_sample(reader, proc.pid, now - t0))
                next_memory = now + 8.0
        t_done = time.perf_counter()
        out["cpu"] = cpu.totals(n_events, t_done - t0)
        out.update(seconds=t_done - t0, startup_seconds=t_ready - t0,
                   events_s=n_events / (t_done - t0), events_s_after_ready=n_events / (t_done - t_ready),
                   first_row_after_s=(t_first or t_done) - t0)
        if paced is not None:
            paced.join()
            out.update(offered_events_s=paced.rate, producer_seconds=paced.finished_at - paced.started_at,
                       producer_max_behind_s=paced.max_behind_s,
                       drained_after_producer_s=t_done - paced.finished_at)
        # let the tail of turns finalise (idle clock): until every turn has its final reward, or none
        # finalises for 30 s (the caller then names what is missing); a live feed's tail finalises in
        # steps seconds apart, on an idle clock slower than a backlog's
        last, stable_since = -1, time.perf_counter()
        while last < n_turns and time.perf_counter() - stable_since < 30.0:
            check()
            time.sleep(0.5)
            final = scalar(reader, "SELECT uniqExact(sample_id) FROM rewards WHERE provisional = 0")
            if final != last:
                last, stable_since = final, time.perf_counter()
        out["finalised_turns"] = last
        # the peaks before the checks below: their memory (the distinct event ids) is this benchmark's, not the pipeline's
        out["peak_rss_mb"] = proc_status(proc.pid, "VmHWM")
        series.append(memory_sample(reader, proc.pid, time.perf_counter() - t0))
        out["worker_peak_rss_mb"] = max((proc_status(w, "VmHWM") or 0.0 for w in worker_pids(proc.pid)), default=None)
        out["rss_end_mb"] = proc_status(proc.pid, "VmRSS")
        out["late_rows"] = scalar(reader, "SELECT count() FROM late_events")
        out["orphans"] = scalar(reader, "SELECT uniqExact(exclusion_id) FROM exclusions WHERE reason = 'orphan'")
        out["distinct_events"] = scalar(reader, "SELECT uniqExact(event_id) FROM events")
        out["event_rows"] = scalar(reader, "SELECT count() FROM events")
        out["max_sampled_rss_mb"] = max_rss
        out["merge_peak_mb"] = merge_mb
        out["memory_series"] = series
        inserted = reader.query_arrow(
            "SELECT reward_id, provisional, toUnixTimestamp64Micro(_inserted_at) AS ins FROM rewards").to_pydict()
        reader.close()
        out["inserted"] = dict(zip(inserted["reward_id"], zip(inserted["ins"], inserted["provisional"], strict=True),
                                   strict=True))
        return out
    finally:
        run.stop(60)


def _from_start(bootstrap: str, topic: str) -> tuple[Consumer, dict[int, int]]:
    """A consumer assigned every partition of ``topic`` from its start, and each partition's end offset."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}", "enable.auto.commit": False,
                  "fetch.max.bytes": 52_428_800})
    partitions = len(c.list_topics(topic, timeout=10).topics[topic].partitions)
    highs = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(partitions)}
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    return c, highs


def reward_timestamps(settings: Settings) -> dict[str, int]:
    """reward_id -> Kafka timestamp (ms) of the record that carried it (first copy)."""
    c, highs = _from_start(settings.kafka_bootstrap, settings.topic(T.REWARDS))
    seen: dict[int, int] = dict.fromkeys(highs, -1)
    ts_of: dict[str, int] = {}
    deadline = time.monotonic() + 120
    while any(seen[p] < highs[p] - 1 for p in highs) and time.monotonic() < deadline:
        for msg in c.consume(5000, 0.5):
            if msg.error() is not None:
                continue
            seen[msg.partition()] = msg.offset()
            body = orjson.loads(msg.value())
            ts = msg.timestamp()[1]
            for row in body if isinstance(body, list) else [body]:
                ts_of.setdefault(row["reward_id"], ts)
    c.close()
    return ts_of


def freshness(ts_of: dict[str, int], inserted: dict[str, tuple[int, int]]) -> dict[str, Any]:
    final, every = [], []
    for rid, (ins_us, provisional) in inserted.items():
        ts = ts_of.get(rid)
        if ts is None:
            continue
        delay = ins_us / 1e6 - ts / 1e3
        every.append(delay)
        if not provisional:
            final.append(delay)

    def pct(xs: list[float], q: float) -> float | None:
        if not xs:
            return None
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return {"final_rows": len(final), "all_rows": len(every), "p50_s": pct(final, 0.5), "p99_s": pct(final, 0.99),
            "max_s": max(final) if final else None, "all_p50_s": pct(every, 0.5), "all_p99_s": pct(every, 0.99),
            "unmatched": len(inserted) - len(every)}


# ---------------------------------------------------------------------- the floor
_ARROW = {"String": pa.string(), "LowCardinality(String)": pa.string(), "Int64": pa.int64(), "UInt16": pa.uint16(),
          "UInt32": pa.uint32(), "UInt64": pa.uint64()}
_ENVELOPE = ("event_id", "event_type", "schema_version", "ts", "org_id", "session_id", "request_id")


def events_schema() -> pa.Schema:
    t = table_def("events")
    return pa.schema([(c, _ARROW[t.column(c).type]) for c in t.record_columns])


def run_floor(settings: Settings, client: Any, n_events: int, batch_rows: int) -> float:
    """Seconds: consume the raw topic from the start, decode, build events rows, insert_arrow in batches."""
    schema = events_schema()
    names = schema.names
    start = time.perf_counter()
    c, _ = _from_start(settings.kafka_bootstrap, settings.topic(T.RAW))
    cols: dict[str, list[Any]] = {n: [] for n in names}
    done = 0

    def flush() -> None:
        client.insert_arrow("events", pa.table([pa.array(cols[n], schema.field(n).type) for n in names], schema=schema))
        for v in cols.values():
            v.clear()

    while done < n_events:
        for msg in c.consume(5000, 1.0):
            if msg.error() is not None or msg.headers() == [("rf-format", b"tick")]:
                continue
            part, off = msg.partition(), msg.offset()
            for e in decode_record(msg.value(), msg.headers(), max_bytes=2_000_000):
                for k in _ENVELOPE:
                    cols[k].append(e[k])
                prod = e.get("producer") or {}
                cols["producer_name"].append(prod.get("name", ""))
                cols["producer_version"].append(prod.get("version", ""))
                cols["payload"].append(orjson.dumps(e).decode())
                cols["source_partition"].append(part)
                cols["source_offset"].append(off)
                done += 1
            if len(cols["event_id"]) >= batch_rows:
                flush()
    if cols["event_id"]:
        flush()
    elapsed = time.perf_counter() - start
    c.close()
    return elapsed


# ---------------------------------------------------------------------- main
def med(xs: list[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def summarise(size: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    m = {k: med([r[k] for r in runs]) for k in ("events_s", "events_s_after_ready", "floor_events_s", "fresh_p50_s",
                                                "fresh_p99_s", "fresh_all_p99_s", "peak_rss_mb", "rss_at_ready_mb",
                                                "finalised_turns", "startup_seconds")}
    m["cpu"] = {k: med([r["cpu"][k] for r in runs if "cpu" in r]) for k in runs[0].get("cpu", {})}
    m["ratio"] = m["events_s"] / m["floor_events_s"] if m["events_s"] and m["floor_events_s"] else None
    m["ratio_after_ready"] = (m["events_s_after_ready"] / m["floor_events_s"]
                              if m["events_s_after_ready"] and m["floor_events_s"] else None)
    return {"events": size, "runs": runs, "median": m}


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(x: float | None, fmt: str = ",.0f") -> str:
        return "-" if x is None else format(x, fmt)

    workers = report.get("workers", 1)
    t = Table(title=f"rewardflow end-to-end, {workers} worker process{'es' if workers > 1 else ''} (medians of {report['repeat']}; "
                    f"load avg {report['loadavg_1_5_15']['before'][0]:.1f} -> {report['loadavg_1_5_15']['after'][0]:.1f} "
                    f"on {report['cpus']} cores, shared machine)")
    for col in ("events", "e2e ev/s (from start)", "floor ev/s", "ratio", "e2e ev/s (after ready)", "ratio",
                "fresh p50 s", "fresh p99 s", "finalised turns", "peak RSS MB", "RSS at ready MB"):
        t.add_column(col, justify="right")
    for s in report["sizes"]:
        m = s["median"]
        t.add_row(f"{s['events']:,}", f(m["events_s"]), f(m["floor_events_s"]), f(m["ratio"], ".2f"),
                  f(m["events_s_after_ready"]), f(m["ratio_after_ready"], ".2f"), f(m["fresh_p50_s"], ".2f"),
                  f(m["fresh_p99_s"], ".2f"), f(m["finalised_turns"]), f(m["peak_rss_mb"]), f(m["rss_at_ready_mb"]))
    Console(width=200).print(t)
    for s in report["sizes"]:
        c = s["median"].get("cpu")
        if c:
            print(f"CPU, {s['events']:,} events, from start to the last row stored: {f(c['us_per_event'], '.0f')} µs "
                  f"an event in all, {f(c['cores_busy'], '.2f')} of {report['cpus']} cores busy on average; workers "
                  f"{f(c['worker_us_per_event'], '.0f')} µs an event, `rewardflow run` (sink, engine, read API) "
                  f"{f(c['run_us_per_event'], '.0f')} µs, the rest (broker, this benchmark's polling, the host) "
                  f"{f((c['rest_s'] or 0) / s['events'] * 1e6, '.0f')} µs")
        st = s.get("steady")
        if st:
            print(f"steady state, {s['events']:,} events fed at {st['offered_events_s']:,.0f} events/s "
                  f"({st['fraction_of_max']:g} of the median after ready): freshness p50 {f(st['fresh_p50_s'], '.2f')} s, "
                  f"p99 {f(st['fresh_p99_s'], '.2f')} s, max {f(st['fresh_max_s'], '.2f')} s over "
                  f"{st['final_rows']:,} final rewards; everything stored {f(st['drained_after_producer_s'], '.1f')} s "
                  f"after the last send")
    print(f"targets: e2e >= {TARGET_EVENTS_S:,} events/s, ratio >= {TARGET_RATIO}, freshness p99 <= "
          f"{TARGET_FRESH_P99_S} s (final rewards), peak RSS flat as finalised turns grow. "
          f"Workload: {report['events_per_record']:.1f} events/record (session batches, window "
          f"{report['batch_window_ms']} ms), {report['sessions_per_hour']:,.0f} sessions/h of event time.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=os.environ.get("REWARDFLOW_KAFKA_BOOTSTRAP"))
    ap.add_argument("--sizes", default="100000,300000,1000000", help="comma-separated event counts")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size (medians reported)")
    ap.add_argument("--quick", action="store_true", help="sizes 5000,15000 and one run each (unless given)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--workers", type=int, default=None,
                    help="stream worker processes (rewardflow run --workers); default: rewardflow run's, one per "
                         "core and at most one per partition")
    ap.add_argument("--sessions-per-hour", type=float, default=2_000.0)
    ap.add_argument("--batch-window-ms", type=int, default=1_000,
                    help="a session's events due within this go in one record (1 s: what the SDK's default "
                         "batching cuts from live traffic, ~1.3 events/record; the simulator's max is ~47 s)")
    ap.add_argument("--format", choices=(AVRO, JSON), default=AVRO,
                    help="the records' wire format (avro: the SDK's default; json: its wire_format='json')")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per pipeline run, seconds")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--steady", type=float, default=0.5, metavar="FRACTION",
                    help="after each size's runs, one steady-state run: the pipeline started first, then fed at "
                         "FRACTION x the median rate measured after ready (0: none)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.quick:
        if args.sizes == ap.get_default("sizes"):
            args.sizes = "5000,15000"
        if args.repeat == ap.get_default("repeat"):
            args.repeat = 1
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    if args.workers is None:
        args.workers = default_worker_count(Settings(partitions=args.partitions))
    tmp = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    broker, bootstrap = None, args.bootstrap
    load_before = os.getloadavg()
    if not bootstrap:
        from rewardflow.kafka_local import LocalBroker
        from rewardflow.settings import load_settings

        port, cport = free_ports(2)
        broker = LocalBroker(load_settings().home, port, cport, partitions=args.partitions, data_dir=tmp / "kafka",
                             die_with_parent=True)
        bootstrap = broker.up(timeout=120).bootstrap
    floor_dsn = parse_dsn(f"chdb://{tmp / 'floor-chdb'}")
    owner = get_client(dsn=floor_dsn)  # this process owns the floor's engine; the worker owns its own path
    results: list[dict[str, Any]] = []
    n_records_total = n_events_total = 0
    try:
        for size in sizes:
            t_gen = time.perf_counter()
            records, n_turns, record_sizes, span_s = make_records(size, args.sessions_per_hour, args.batch_window_ms, args.seed,
                                                                    fmt=args.format)
            n_records_total += len(records)
            n_events_total += size
            print(f"{size:,} events: {len(records):,} records ({size / len(records):.1f} events/record), "
                  f"{n_turns:,} turns, generated in {time.perf_counter() - t_gen:.0f} s", flush=True)
            def one_run(label: str, rate: float | None = None) -> dict[str, Any]:
                workdir = tmp / f"n{size}-{label}"
                workdir.mkdir()
                # A backlog's tail finalises on a fast idle clock. Fed live, event time runs span_s / feed
                # seconds faster than the wall: an idle clock faster than that would carry a slow partition's
                # watermark past the records still to come, so it runs at half that pace.
                idle = (1.0, 1000.0) if rate is None else (2.0, 0.5 * span_s / (size / rate))
                settings = Settings(kafka_bootstrap=bootstrap, topic_prefix=f"bench{uuid.uuid4().hex[:8]}.",
                                    partitions=args.partitions, home=workdir / "home",
                                    clickhouse_dsn=SecretStr(f"chdb://{workdir / 'chdb'}"), web_port=web_ports(),
                                    idle_timeout_s=idle[0], idle_clock_rate=idle[1])
                ensure_topics(settings)
                paced, produce_s = None, None
                if rate is None:
                    t_p = time.perf_counter()
                    produce(bootstrap, settings.topic(T.RAW), records)
                    produce_s = time.perf_counter() - t_p
                else:
                    paced = PacedProducer(bootstrap, settings.topic(T.RAW), records, record_sizes, rate)
                w = run_pipeline(settings, size, n_turns, workdir, args.timeout, args.workers, paced)
                fresh = freshness(reward_timestamps(settings), w.pop("inserted"))
                db = f"floor_{uuid.uuid4().hex[:10]}"
                owner.command(create_database(db))
                fclient = get_client(dsn=floor_dsn.with_database(db))
                migrate(fclient)
                floor_s = run_floor(settings, fclient, size, settings.sink_batch_rows)
                fclient.close()
                owner.command(f"DROP DATABASE {db} SYNC")
                shutil.rmtree(workdir / "chdb", ignore_errors=True)
                run = {"run": label, **w, "floor_seconds": floor_s, "floor_events_s": size / floor_s,
                       "pre_produce_seconds": produce_s, "records": len(records), "turns_in_input": n_turns,
                       "fresh_p50_s": fresh["p50_s"], "fresh_p99_s": fresh["p99_s"],
                       "fresh_all_p99_s": fresh["all_p99_s"], "freshness": fresh, "prefix": settings.topic_prefix,
                       "load_avg_1m": os.getloadavg()[0]}
                wrong = {k: v for k, v in {"distinct events": (w["distinct_events"], size),
                                           "final turns": (w["finalised_turns"], n_turns),
                                           "late rows": (w["late_rows"], 0), "orphans": (w["orphans"], 0)}.items()
                         if v[0] != v[1]}
                if wrong:  # the workload has no noise: anything else is a pipeline (or benchmark) fault
                    raise SystemExit("the run is not exact (got, expected): " + ", ".join(f"{k} {v}" for k, v in wrong.items())
                                     + f"; log: {w['log']}")
                return run

            runs = []
            for rep in range(1, args.repeat + 1):
                run = one_run(f"r{rep}")
                runs.append(run)
                fresh = run["freshness"]
                print(f"  run {rep}: e2e {run['events_s']:,.0f} ev/s ({run['seconds']:.1f} s, startup "
                      f"{run['startup_seconds']:.1f} s; after ready {run['events_s_after_ready']:,.0f} ev/s)  floor "
                      f"{run['floor_events_s']:,.0f} ev/s  ratio {run['events_s'] / run['floor_events_s']:.2f}  "
                      f"fresh p50/p99 {fresh['p50_s'] or 0:.2f}/{fresh['p99_s'] or 0:.2f} s ({fresh['final_rows']:,} final)  "
                      f"peak RSS {run['peak_rss_mb'] or 0:,.0f} MB at {run['finalised_turns']:,} finalised turns"
                      f"{largest_merge(run)}  "
                      f"load {run['load_avg_1m']:.1f}", flush=True)
                if run.get("memory_series"):
                    print(memory_line(run["memory_series"]), flush=True)
            summary = summarise(size, runs)
            if args.steady:
                rate = args.steady * summary["median"]["events_s_after_ready"]
                run = one_run("steady", rate)
                fresh = run["freshness"]
                summary["steady"] = {"fraction_of_max": args.steady, **{k: run.get(k) for k in (
                    "offered_events_s", "producer_seconds", "producer_max_behind_s", "drained_after_producer_s",
                    "fresh_p50_s", "fresh_p99_s", "fresh_all_p99_s", "peak_rss_mb", "worker_peak_rss_mb")},
                    "final_rows": fresh["final_rows"], "fresh_max_s": fresh["max_s"], "run": run}
                print(f"  steady state at {rate:,.0f} ev/s ({args.steady:g} of the median after ready): fed in "
                      f"{run['producer_seconds']:.1f} s, all stored {run['drained_after_producer_s']:.1f} s after the "
                      f"last send; fresh p50/p99/max {fresh['p50_s'] or 0:.2f}/{fresh['p99_s'] or 0:.2f}/"
                      f"{fresh['max_s'] or 0:.2f} s ({fresh['final_rows']:,} final)  load {run['load_avg_1m']:.1f}",
                      flush=True)
            results.append(summary)
    finally:
        owner.close()
        if broker is not None:
            broker.down(timeout=30)
    peaks = [(s["median"]["finalised_turns"], s["median"]["peak_rss_mb"]) for s in results]
    report = {
        "sizes": results, "repeat": args.repeat, "partitions": args.partitions, "workers": args.workers,
        "sessions_per_hour": args.sessions_per_hour, "batch_window_ms": args.batch_window_ms,
        "events_per_record": n_events_total / max(1, n_records_total),
        "memory_growth": {"finalised_turns_and_peak_rss_mb": peaks,
                          "peak_rss_last_over_first": (peaks[-1][1] / peaks[0][1]) if len(peaks) > 1 and peaks[0][1]
                          else None},
        "targets": {"events_s": TARGET_EVENTS_S, "ratio": TARGET_RATIO, "freshness_p99_s": TARGET_FRESH_P99_S},
        "settings": "production defaults except idle_timeout_s=1, idle_clock_rate=1000 (tail finalises fast)",
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "loadavg_1_5_15": {"before": list(load_before), "after": list(os.getloadavg())},
    }
    print()
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
