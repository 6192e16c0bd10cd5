"""Orchestration of ``rewardflow demo`` (see :mod:`rewardflow.cli.demo`).

Goodhart monitors: the demo evaluates its longest windows (1 h by default)
with the library defaults otherwise (same-window baseline, at least 200 turns
per side, alpha 0.001). At demo scale a 5 min window holds ~100 turns per arm,
too few for ``min_samples``, while a 1 h window holds most of the run; so the
simulated traffic starts at the start of the current 1 h window (up to an hour
in the past), and that first window, once closed, carries the whole signal.

Contract: :meth:`DemoRunner.run` blocks until the demo is over and always
stops what it started (worker, sink, and the local broker if it started it),
also on errors and Ctrl-C. It returns the process exit code: 0 when the counts
reconcile, 1 when they do not or finalisation timed out, 2 on setup errors.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rewardflow.kafka import topics as T
from rewardflow.analysis.goodhart import MonitorConfig
from rewardflow.demo.reconcile import Counts, expected_counts, reconcile
from rewardflow.demo.worker_proc import WorkerProcess
from rewardflow.settings import Settings

BASELINE, CANDIDATE, GAMING = "ckpt-base", "ckpt-cand", "ckpt-cand-b"
CHECKPOINTS = [BASELINE, CANDIDATE, GAMING]
RETRAIN_PERIOD_MS = 5 * 3_600_000

COUNT_SQL = """
SELECT
  (SELECT uniqExact(org_id, session_id, sample_id) FROM rewards
   WHERE provisional = 0 AND spec_version = {spec:String}) AS finalised,
  (SELECT uniqExact(exclusion_id) FROM exclusions WHERE reason = 'orphan') AS orphans,
  (SELECT uniqExact(exclusion_id) FROM exclusions WHERE reason = 'duplicate') AS duplicates,
  (SELECT uniqExact(exclusion_id) FROM late_events) AS late,
  (SELECT uniqExact(dead_letter_id) FROM dead_letters) AS dead_letters,
  (SELECT uniqExact(org_id, session_id, request_id, event_id) FROM events) AS events,
  (SELECT uniqExact(org_id, session_id, sample_id) FROM rewards WHERE provisional = 0 AND spec_version = {spec:String}
   AND revision > 0) AS corrected
"""


class DemoRunner:
    """One isolated demo run under ``run_dir``."""

    def __init__(self, settings: Settings, run_dir: Path, console: Console) -> None:
        self.settings, self.run_dir, self.console = settings, run_dir, console
        self.started_broker: Any = None
        self.worker = WorkerProcess(settings, run_dir / "worker.log", detach=True)  # ends with the demo, even killed
        self.sink: Any = None
        self.edge: Any = None  # the ingestion edge (a process) the simulated editors and agents send through
        self.edge_url = ""
        self.edge_stats: Any = None
        self.reads: Any = None  # this process's read endpoint: the edge reads the keys through it
        self._stop = threading.Event()
        self._sink_thread: threading.Thread | None = None
        window_s = max(settings.window_sizes_s)
        self.monitors = MonitorConfig(window_size_s=window_s)
        self.start_ms = 0  # set by run(): the simulation's whole span lies before the broker's clock
        self.planted: dict[str, str] = {}  # candidate -> what the simulation made it do
        self.balance: Any = None  # the exclusion balance read by _monitor

    # ------------------------------------------------------------------ lifecycle
    def run(self, *, sessions: int, turns_per_session: int, seed: int, hack: str, noise: bool,
            json_only: bool, out_dir: Path, timeout_s: float, candidate_kind: str = "published",
            policy: Path | None = None) -> int:
        from rewardflow.sim.config import default_start_ms

        # aligned to the largest window: the first monitored window is a full one
        self.start_ms = default_start_ms(int(time.time() * 1000), duration_s=3_600.0, turns_per_session=turns_per_session,
                                         align_s=max(self.settings.window_sizes_s))
        try:
            self._start()
            truth = self._simulate(sessions, turns_per_session, seed, hack, noise, candidate_kind)
            expected = expected_counts(truth, through_edge=True)
            counts, done = self._wait(expected, timeout_s)
            alerts = self._monitor(truth)
            self._stop_pipeline()
            return self._report(truth, expected, counts, done, alerts, json_only, out_dir, policy)
        finally:
            self._stop_pipeline()
            if self.started_broker is not None:
                self.started_broker.down()

    def _start(self) -> None:
        from rewardflow.rewards.registry import prepare_database
        from rewardflow.sink.route import RewardSink
        from rewardflow.kafka_local import LocalBroker
        from rewardflow.kafka_local.admin import metadata_ready
        from rewardflow.kafka.provision import ensure_topics

        s = self.settings
        if not metadata_ready(s.kafka_bootstrap, timeout=3.0):
            self.console.print(f"starting the local Kafka broker on {s.kafka_bootstrap} …")
            broker = LocalBroker(s.home, s.local_broker_port, s.local_broker_controller_port, s.partitions,
                                 die_with_parent=True)  # also when the demo is killed before its cleanup
            broker.up(timeout=180)
            self.started_broker = broker
        ensure_topics(s)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        prepare_database(s)
        self._register_lineage()
        self.sink = RewardSink(s)
        self._sink_thread = threading.Thread(target=self.sink.run, args=(self._stop,), name="demo-sink")
        self._sink_thread.start()
        self.edge = self._start_edge()
        self.worker.start()
        self.console.print(f"worker pid {self.worker.proc.pid if self.worker.proc else '?'}, "
                           f"log {self.worker.log_path}; data {self.run_dir}")

    def _register_lineage(self) -> None:
        """The story's checkpoints in the registry: the baseline went live one retrain period (5 h) before
        the traffic, and both candidates were trained from it and went live as the traffic starts."""
        from rewardflow.clickhouse.connect import as_dsn, get_client
        from rewardflow.lineage.store import CheckpointStore

        client = get_client(dsn=as_dsn(self.settings.dsn))
        try:
            store = CheckpointStore(client)
            store.register(BASELINE, "", self.start_ms - RETRAIN_PERIOD_MS, "the serving policy")
            for candidate in (CANDIDATE, GAMING):
                store.register(candidate, BASELINE, self.start_ms, "trained from live traffic of the baseline")
        finally:
            client.close()

    def _start_edge(self) -> Any:
        """``rewardflow collect`` in a process of its own (a core of its own), reading the keys through
        this process's read endpoint, as it would beside a running ``rewardflow run``."""
        import sys

        from rewardflow.demo.worker_proc import ChildProcess
        from rewardflow.kafka_local.ports import free_ports
        from rewardflow.readapi.server import ReadServer

        self.reads = ReadServer(self.sink.dsn, self.settings).start()
        # the port configured (REWARDFLOW_COLLECT_PORT), else a free one: the default may be a running pipeline's
        port = self.settings.collect_port if "collect_port" in self.settings.model_fields_set else free_ports(1)[0]
        settings = self.settings.model_copy(update={"collect_port": port})
        edge = ChildProcess(settings, self.run_dir / "collector.log",
                            [sys.executable, "-c", "from rewardflow.cli.main import main; main()", "collect",
                             "--log-level", "WARNING"], cwd=self.run_dir, detach=True)
        edge.start()
        self.edge_url = f"http://127.0.0.1:{settings.collect_port}"
        edge.wait_answering(f"{self.edge_url}/healthz", timeout=60)
        return edge

    def _end_of_traffic(self, last_ts: int) -> None:
        """Move every raw partition's watermark past the last turn's deadline with signed ticks, as the
        workers' idle clock would after the traffic stops (here at once, not after minutes)."""
        from confluent_kafka import Producer

        from rewardflow.core.ticks import TICK_HEADERS, signed_tick
        from rewardflow.settings import tick_key

        s = self.settings
        wm = last_ts + s.horizons_s[-1] * 1000 + s.grace_ms + s.allowed_lateness_ms + 1
        topic = s.topic(T.RAW)
        producer = Producer(s.kafka_client_config())
        for partition in range(s.partitions):
            producer.produce(topic, signed_tick(tick_key(s), topic, wm), partition=partition, headers=list(TICK_HEADERS))
        producer.flush(30)

    def _stop_pipeline(self) -> None:
        if self.edge is not None:
            self.edge.stop()
            self.edge = None
        if self.reads is not None:
            self.reads.stop()
            self.reads = None
        self.worker.stop()
        self._stop.set()
        if self._sink_thread is not None:
            self._sink_thread.join()
            self._sink_thread = None

    # ------------------------------------------------------------------ steps
    def _simulate(self, sessions: int, turns: int, seed: int, hack: str, noise: bool, kind: str) -> Any:
        from rewardflow.clickhouse.connect import get_client
        from rewardflow.collector.keys import IngestKeys
        from rewardflow.sim.edge_send import send_through_edge
        from rewardflow.sim.send import hack_of
        from rewardflow.sim.config import story_config
        from rewardflow.sim.generator import Simulator
        from rewardflow.sim.profiles import CANDIDATE_KINDS

        s = self.settings
        candidate_kind = next(k for k in CANDIDATE_KINDS if k == kind)
        planted = hack_of(hack)
        assert planted is not None, hack
        cfg = story_config(BASELINE, CANDIDATE, GAMING, hack=planted, candidate_kind=candidate_kind, noise=noise,
                           sessions=sessions, turns_per_session=turns, seed=seed, start_ms=self.start_ms,
                           grace_ms=s.grace_ms, lateness_ms=s.allowed_lateness_ms, correction_ms=s.correction_window_ms)
        self.planted = {CANDIDATE: "the published gains" if candidate_kind == "published" else "a clearly worse model",
                        GAMING: "the published gains, and clients that hide failing turns (hide-failures)"
                        if hack == "hide-failures" else f"the published gains, and the {hack} reward hack"}
        sim = Simulator(cfg)
        admin = IngestKeys(get_client(dsn=s.dsn))  # a key per org, as each org's editors would hold
        orgs = [f"org-{i:04d}" for i in range(1, cfg.orgs + 1)] + ["org-sim"]
        keys = {org: admin.create(org, "demo")[1] for org in orgs}
        self.console.print(f"ingestion edge {self.edge_url}: {len(keys)} keys, one per org")
        self.edge_stats = send_through_edge(sim, self.edge_url, keys, self.console)
        self._end_of_traffic(self.edge_stats.last_ts)
        return sim.truth

    def _counts(self) -> Counts:
        from rewardflow.clickhouse.connect import get_client

        spec = self._spec_version()
        row = get_client(dsn=self.settings.dsn).query(COUNT_SQL, parameters={"spec": spec}).result_rows[0]
        return Counts(*[int(x) for x in row])

    def _spec_version(self) -> str:
        from rewardflow.rewards.registry import active_specs

        return active_specs(self.settings)[0].version

    def _wait(self, expected: Counts, timeout_s: float) -> tuple[Counts, bool]:
        total = expected.finalised + expected.orphans
        deadline = time.monotonic() + timeout_s
        columns = (TextColumn("[bold]finalising"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} turns"),
                   TimeElapsedColumn())
        with Progress(*columns, console=self.console) as progress:
            task = progress.add_task("wait", total=total)
            while True:
                counts = self._counts()
                progress.update(task, completed=counts.finalised + counts.orphans)
                if counts.covers(expected):
                    time.sleep(self.settings.sink_batch_seconds + 0.5)  # let stragglers land
                    return self._counts(), True
                if time.monotonic() > deadline or not self.worker.alive:
                    if not self.worker.alive:
                        self.console.print(f"[red]the worker exited; see {self.worker.log_path}")
                    return counts, False
                time.sleep(1.0)

    def _monitor(self, truth: Any) -> list[Any]:
        """Evaluate the Goodhart monitors and the exclusion balance over the closed windows; publish alerts
        to the alerts topic."""
        from confluent_kafka import Producer

        from rewardflow.analysis.balance import balance_alerts, mean_rewards
        from rewardflow.analysis.goodhart import alert_messages, evaluate_windows
        from rewardflow.analysis.source import fetch_balance, fetch_windows

        spec, size = self._spec_version(), self.monitors.window_size_s or max(self.settings.window_sizes_s)
        rows = fetch_windows(self.settings, CHECKPOINTS, spec).to_pylist()
        alerts = evaluate_windows(rows, BASELINE, self.monitors)
        self.balance = fetch_balance(self.settings, rows, window_s=size, spec_version=spec)
        alerts += balance_alerts(self.balance, BASELINE, rewards=mean_rewards(rows, window_s=size, spec_version=spec))
        if alerts:
            producer = Producer(self.settings.kafka_client_config())
            for key, value in alert_messages(alerts):
                producer.produce(self.settings.topic(T.ALERTS), value, key)
            producer.flush(30)
            time.sleep(self.settings.sink_batch_seconds + 1.0)
        return alerts

    def _report(self, truth: Any, expected: Counts, counts: Counts, done: bool, alerts: list[Any],
                json_only: bool, out_dir: Path, policy_path: Path | None) -> int:
        from rewardflow.analysis.source import fetch_corrections, fetch_registry, fetch_rewards, fetch_windows
        from rewardflow.demo.present import print_story, write_story
        from rewardflow.demo.story import corrections_of, judge, load_gate, next_spec, replay_shift

        spec = self._spec_version()
        policy = load_gate(policy_path)
        judged = judge(fetch_rewards(self.settings, CHECKPOINTS, spec), BASELINE, [CANDIDATE, GAMING], spec, alerts, policy,
                       fetch_registry(self.settings), self.balance.overall if self.balance is not None else None)
        corrections = corrections_of(fetch_corrections(self.settings, spec))
        shift = None
        nxt = next_spec(self.settings, spec)
        blocked = [a for a in alerts if judged[a["checkpoint_id"]].verdict.alerts  # the next spec answers a Goodhart
                   and not str(a["monitor"]).startswith("exclusion_")]  # alert; an exclusion imbalance is no spec's
        if blocked and nxt is not None:
            first = min(blocked, key=lambda a: (a["window_start"], a["checkpoint_id"]))
            self.console.print(f"replaying {first['checkpoint_id']}'s alerted window under {nxt.spec.version} …")
            shift = replay_shift(self.settings, nxt, spec, BASELINE, first["checkpoint_id"],
                                 (int(first["window_start"]), int(first["window_end"])))
        windows = fetch_windows(self.settings, CHECKPOINTS, spec)
        edge = (truth.malformed, self.edge_stats.refused) if self.edge_stats is not None else None
        checks = reconcile(expected, counts, edge)
        ok = done and all(c.ok for c in checks)
        html = write_story(out_dir, judged, policy, windows, alerts, shift, self.planted, spec, corrections)
        summary = {"ok": ok, "candidates": {ck: {"report": j.report.to_dict(), "gate": dataclasses.asdict(j.gate),
                                                 "verdict": j.verdict.to_dict(), "simulated": self.planted[ck]}
                                            for ck, j in judged.items()},
                   "replay": dataclasses.asdict(shift) if shift is not None else None,
                   "corrections": {**dataclasses.asdict(corrections), "total": corrections.total},
                   "reconciliation": [{"check": c.name, "expected": c.expected, "actual": c.actual, "ok": c.ok} for c in checks],
                   "alerts": alerts, "monitors": dataclasses.asdict(self.monitors), "sim_start_ms": self.start_ms,
                   "unattributed_exclusions": self.balance.unattributed if self.balance is not None else None,
                   "edge": dataclasses.asdict(self.edge_stats) if self.edge_stats is not None else None,
                   "truth": truth.to_dict(), "html": str(html), "data_dir": str(self.run_dir)}
        (out_dir / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
        if json_only:
            print(orjson.dumps(summary, option=orjson.OPT_NON_STR_KEYS).decode())
        else:
            print_story(judged, checks, alerts, shift, self.planted, html, out_dir / "summary.json", corrections)
            if not done:
                self.console.print("[red]not every simulated turn was finalised in time")
        return 0 if ok else 1
