"""The TypeScript client (clients/typescript) against real collectors, Kafka brokers and chDB.

The harness starts three collectors on one ingestion key: ``main`` (ordinary limits), ``rate``
(10 events/s, burst 10: 429 with Retry-After) and ``outage`` (on a broker of its own, with a 1 s
acknowledgement timeout). It runs the client's ``npm test`` with their URLs in environment
variables (see clients/typescript/test/harness.ts); the outage test asks for the broker to be
stopped by writing a file, and the harness SIGSTOPs the broker's JVM, then SIGCONTs it
:data:`PAUSE_S` seconds later, so the client meets a genuine 503.

Every node test writes the event ids the edge acknowledged to it. Afterwards the raw topics must
hold each of them: exactly once and nothing else on ``main`` and ``rate``; on ``outage`` at least
once (a record the edge gave up on may still have been written: the client was told 503 and sent
it again), and exactly once after the pipeline's deduplication by event_id.

Node.js 18+ and npm are required: without them this test fails (it does not skip). ``dist/`` is
built by ``scripts/run.sh test``; when it is missing or older than the sources it is built here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from rewardflow.collector.keys import IngestKeys
from rewardflow.collector.server import Collector, keys_from_client
from rewardflow.events.wire import decode_record
from rewardflow.kafka.provision import ensure_topics
from rewardflow.kafka_local import LocalBroker
from rewardflow.kafka_local.ports import free_ports
from rewardflow.settings import Settings, load_settings
from tests.conftest_clickhouse import ChDatabase
from tests.conftest_kafka import SessionBroker
from tests.core.feed import Feed
from tests.streams.kafka_io import read_raw

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse]

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "typescript"
PAUSE_S = 4.0
RATE_PER_S, RATE_BURST = 10.0, 10
# the node tests that report deliveries, by the collector they send to
EXPECTED = {
    "main": {"events go in per-session batches of at most maxBatchEvents, in order, each acknowledged once",
             "a batch is sent flushIntervalMs after its first event, without flush()",
             "events the edge rejects are reported with their field and never retried; the rest land",
             "events queued while the edge is unreachable are stored, reloaded by the next client and delivered"},
    "rate": {"over its rate the client backs off for Retry-After, then delivers everything"},
    "outage": {"a 503 while Kafka is stopped is retried with the same events until they land"},
}


def _toolchain() -> str:
    """npm's path, after checking that Node.js 18+ is there (failing, not skipping, when it is not)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("Node.js 18+ and npm are required to test the TypeScript client (clients/typescript): "
                    "install them (e.g. apt-get install nodejs npm)", pytrace=False)
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    major = re.match(r"v(\d+)", version)
    if major is None or int(major.group(1)) < 18:
        pytest.fail(f"Node.js 18+ is required to test the TypeScript client; found {version}", pytrace=False)
    return npm


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=CLIENT, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        pytest.fail(f"`{' '.join(cmd[1:])}` in {CLIENT} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}",
                    pytrace=False)


def _ensure_built(npm: str) -> None:
    """``npm ci`` when node_modules is missing; ``npm run build`` when dist/ is missing or stale."""
    if not (CLIENT / "node_modules" / "typescript").is_dir():
        _run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"])
    built = [p.stat().st_mtime for p in (CLIENT / "dist" / "test").glob("*.test.js")]
    sources = [p.stat().st_mtime for d in ("src", "test") for p in (CLIENT / d).glob("*.ts")]
    if not built or min(built) < max(sources):
        _run([npm, "run", "build"])


class BrokerPause:
    """Stops the broker process (SIGSTOP) once ``<control>/pause`` appears, writes ``paused``; after
    ``PAUSE_S`` writes ``resumed`` and resumes it (SIGCONT). The broker is always resumed on exit."""

    def __init__(self, pid: int, control: Path) -> None:
        self.pid, self.control = pid, control
        self._stop = threading.Event()
        self._paused = False
        self._thread = threading.Thread(target=self._run, name="broker-pause", daemon=True)

    def _run(self) -> None:
        while not (self.control / "pause").exists():
            if self._stop.wait(0.02):
                return
        os.kill(self.pid, signal.SIGSTOP)
        self._paused = True
        (self.control / "paused").write_text("")
        self._stop.wait(PAUSE_S)
        (self.control / "resumed").write_text("")  # before SIGCONT: no acknowledgement can precede it
        self._resume()

    def _resume(self) -> None:
        if self._paused:
            os.kill(self.pid, signal.SIGCONT)
            self._paused = False

    def __enter__(self) -> BrokerPause:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._resume()


def _raw_ids(settings: Settings) -> tuple[Counter[str], list[tuple[bytes | None, Any]]]:
    """How often each event id is on the raw topic, and its records."""
    records = [(r.value, r.headers) for rs in read_raw(settings, timeout=60).values() for r in rs]
    ids = Counter(e["event_id"] for value, headers in records for e in decode_record(value, headers))
    return ids, records


def _delivered(directory: Path) -> dict[str, dict[str, list[str]]]:
    """collector -> node test -> event ids acknowledged."""
    out: dict[str, dict[str, list[str]]] = {}
    for path in directory.glob("*.json"):
        doc = json.loads(path.read_text())
        out.setdefault(doc["collector"], {})[doc["test"]] = doc["eventIds"]
    return out


def test_the_typescript_client_against_real_collectors(kafka_broker: SessionBroker, ch_db: ChDatabase,
                                                       unique_group: str, tmp_path: Path) -> None:
    npm = _toolchain()
    _ensure_built(npm)
    _, key = IngestKeys(ch_db.client).create("org", "typescript-client")
    main = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"{unique_group}.main.", partitions=2)
    rate = ch_db.settings(kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=f"{unique_group}.rate.", partitions=1,
                          collect_rate_events_per_s=RATE_PER_S, collect_rate_burst=RATE_BURST)
    port, controller = free_ports(2)
    broker = LocalBroker(load_settings().home, port, controller, partitions=1, data_dir=tmp_path / "kafka",
                         die_with_parent=True)
    info = broker.up(timeout=120)
    assert info.pid is not None
    try:
        outage = ch_db.settings(kafka_bootstrap=broker.bootstrap, partitions=1, collect_ack_timeout_s=1.0)
        for s in (main, rate, outage):
            ensure_topics(s)
        control, delivered_dir = tmp_path / "control", tmp_path / "delivered"
        control.mkdir()
        delivered_dir.mkdir()
        keys = keys_from_client(ch_db.client)
        with Collector(main, keys, port=0) as edge, Collector(rate, keys, port=0) as limited, \
                Collector(outage, keys, port=0) as fragile, BrokerPause(info.pid, control):
            env = {**os.environ, "RF_TEST_REQUIRE_COLLECTOR": "1", "RF_TEST_KEY": key, "RF_TEST_URL": edge.url,
                   "RF_TEST_RATE_URL": limited.url, "RF_TEST_RATE_BURST": str(RATE_BURST),
                   "RF_TEST_OUTAGE_URL": fragile.url, "RF_TEST_OUTAGE_CONTROL": str(control),
                   "RF_TEST_DELIVERED_DIR": str(delivered_dir)}
            proc = subprocess.run([npm, "test"], cwd=CLIENT, env=env, capture_output=True, text=True, timeout=300,
                                  check=False)
        report = f"npm test exited {proc.returncode}:\n{proc.stdout[-30_000:]}\n{proc.stderr[-5_000:]}"
        assert proc.returncode == 0, report
        assert re.search(r"^# fail 0$", proc.stdout, re.M) and re.search(r"^# skipped 0$", proc.stdout, re.M), report

        delivered = _delivered(delivered_dir)
        assert {c: set(tests) for c, tests in delivered.items()} == EXPECTED
        for name, settings in (("main", main), ("rate", rate)):
            sent = [i for ids in delivered[name].values() for i in ids]
            landed, _ = _raw_ids(settings)
            assert len(sent) == len(set(sent)) > 0
            assert landed == Counter(sent), f"{name}: the raw topic holds other than each acknowledged event once"

        sent = {i for ids in delivered["outage"].values() for i in ids}
        landed, records = _raw_ids(outage)
        assert set(landed) == sent, "outage: an acknowledged event is missing, or an unacknowledged one landed"
        feed = Feed(partition=0)
        for value, headers in records:
            feed.record(value, headers)
        stored = [row["event_id"] for row in feed.total.valid]
        assert sorted(stored) == sorted(sent), "outage: not each event exactly once after deduplication"
    finally:
        broker.down(timeout=30)
