"""``rewardflow run``: stream workers as supervised child processes, the ClickHouse sink in this one.

Each worker is a process of its own (``--workers N``, one consumer group; one per core by
default), so the workers and the sink, with the embedded engine it owns, use every core. Their
output is this command's output. A worker that exits while it should run is restarted
(:class:`~rewardflow.children.WorkerSupervisor`); when workers keep exiting, everything stops with
one ``error:`` line and exit code 1.

Order of shutdown on SIGINT/SIGTERM: the workers stop their agents, flush their producers and
commit; then the edge (if served) lets requests in flight finish; then the sink flushes its
buffers to ClickHouse and commits; the process exits 0 (or the workers' largest exit code).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, NoReturn

import typer

from rewardflow import logrepeats
from rewardflow.children import default_worker_count, worker_metrics_ports
from rewardflow.heaptrim import HeapTrimmer
from rewardflow.settings import Settings, load_settings

log = logging.getLogger("rewardflow.run")


def _fail(msg: str) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def ensure_kafka(settings: Settings, start: bool, hint: str = " or pass --start-kafka") -> None:
    """Check the broker answers; with ``start``, bring up the project's local broker first. Not answering
    and not ``start``: exit 2 with one line, which ends with ``hint`` (what else the command offers)."""
    from rewardflow.kafka_local.admin import metadata_ready

    if metadata_ready(settings.kafka_bootstrap, timeout=3.0, config=settings.kafka_client_config()):
        return
    if not start:
        _fail(f"Kafka at {settings.kafka_bootstrap} does not answer; start it (`rewardflow kafka up`){hint}")
    from rewardflow.kafka_local import LocalBroker

    broker = LocalBroker(settings.home, settings.local_broker_port, settings.local_broker_controller_port,
                         settings.partitions)
    info = broker.up(timeout=120)
    typer.echo(f"started local Kafka at {info.bootstrap} (pid {info.pid})")


def ensure_ports_free(settings: Settings, sink: bool, workers: int, collect: bool = False) -> None:
    """Fail with one line when a port this process will serve on is taken (by another deployment)."""
    import socket

    from rewardflow.clickhouse.connect import as_dsn

    wanted = [("read endpoint", settings.web_port)] if sink and as_dsn(settings.dsn).embedded else []
    try:
        ports = worker_metrics_ports(settings, workers)
    except ValueError as exc:
        _fail(str(exc))
    wanted += [(f"worker {i} metrics", port) for i, port in enumerate(ports)]
    hosts = {"read endpoint": settings.web_host, "collector": settings.collect_host}
    wanted += [("collector", settings.collect_port)] if collect else []
    for what, port in wanted:
        host = hosts.get(what, settings.web_host)
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                variable = "REWARDFLOW_COLLECT_PORT" if what == "collector" else "REWARDFLOW_WEB_PORT (it serves on that port and the next)"
                _fail(f"port {port} on {host} ({what}) is taken: {exc.strerror}. Another `rewardflow run` "
                      f"may be running; stop it, or move this one with {variable}")


class StatusLine(threading.Thread):
    """Logs one structured status line every ``interval`` seconds."""

    def __init__(self, settings: Settings, interval: float, parts: dict[str, Any]) -> None:
        super().__init__(name="rewardflow-status", daemon=True)
        self.settings, self.interval, self.parts = settings, interval, parts
        self.stopped = threading.Event()

    def run(self) -> None:
        from rewardflow.kafka import topics as T
        from rewardflow.kafka.lag import group_lag

        while not self.stopped.wait(self.interval):
            workers, sink = self.parts.get("workers"), self.parts.get("sink")
            lag = group_lag(self.settings.kafka_client_config(), self.settings.topic("worker"),
                            self.settings.topic(T.RAW))
            fields = status_fields(None if workers is None else workers.alive,
                                   None if sink is None else sink.metrics.snapshot(), lag)
            log.info("status " + " ".join(f"{k}={v}" for k, v in fields.items()))


def status_fields(workers_alive: int | None, sink: dict[str, Any] | None, lag_raw: int | None) -> dict[str, Any]:
    """The fields of a status line: workers alive, the rows the sink wrote (and, beside them, the rows of what
    was not scored: a pipeline whose events all arrive late looks busy otherwise), the raw topic's lag
    (``unknown`` when Kafka did not answer)."""
    fields: dict[str, Any] = {}
    if workers_alive is not None:
        fields["workers_alive"] = workers_alive
    if sink is not None:
        written = sink["rows_written"]
        fields["rows_written"] = sum(written.values())
        for table, name in (("rewards", "rewards"), ("late_events", "late"), ("dead_letters", "dead_letters"),
                            ("exclusions", "excluded")):
            fields[name] = written.get(table, 0)
        fields["sink_retries"] = sink["retries"]
    fields["lag_raw"] = "unknown" if lag_raw is None else lag_raw
    return fields


def command(
    start_kafka: bool = typer.Option(False, "--start-kafka", help="Start the project's local Kafka broker if none answers."),
    sink: bool = typer.Option(True, "--sink/--no-sink", help="Run the ClickHouse sink in this process."),
    worker: bool = typer.Option(True, "--worker/--no-worker", help="Run stream workers (child processes of this one)."),
    workers: int | None = typer.Option(None, "--workers", min=1, max=64, show_default=False,
                                       help="Stream worker processes, one consumer group (default: one per core, at "
                                       "most one per partition). Worker i serves its metrics on the i-th port after "
                                       "WEB_PORT, skipping COLLECT_PORT. More workers on other machines join the same group."),
    status_interval: float = typer.Option(10.0, help="Seconds between status lines (0 = none)."),
    log_level: str = typer.Option("INFO", help="Python log level."),
    monitor_baseline: str | None = typer.Option(None, help="Baseline checkpoint of the Goodhart monitors "
                                                "(default: each checkpoint against its own trailing windows)."),
    monitor_interval: float = typer.Option(60.0, help="Seconds between Goodhart monitor rounds (0 = off)."),
    collect: bool = typer.Option(False, "--collect/--no-collect", help="Also serve the ingestion edge "
                                 "(POST /v1/events and /v1/traces on COLLECT_HOST:COLLECT_PORT) from this process."),
) -> None:
    """Run the stream worker and the ClickHouse sink against the configured Kafka and ClickHouse.

    Creates the topics it needs first; the workers start while it applies the migrations. Stops gracefully
    on SIGINT/SIGTERM: flush, commit, exit 0. Metrics: a status line every
    --status-interval seconds, each worker's Prometheus text at http://WEB_HOST:PORT/metrics, PORT the
    i-th port after WEB_PORT (COLLECT_PORT skipped).
    """
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")
    if log_level.upper() != "DEBUG":
        logrepeats.install()  # a broker away: librdkafka's failed connects once per 10 s
    settings = load_settings()
    if workers is None:
        workers = default_worker_count(settings)
    elif worker and workers > settings.partitions:
        log.warning("--workers %d for %d partitions (REWARDFLOW_PARTITIONS): %d of them will hold no partition "
                    "and idle as spares (each a process of ~90 MB)", workers, settings.partitions,
                    workers - settings.partitions)
    ensure_ports_free(settings, sink, workers if worker else 0, collect)
    ensure_kafka(settings, start_kafka)
    from rewardflow.kafka.provision import ensure_topics

    ensure_topics(settings)
    # the read endpoint's socket is bound now, not once the sink is ready: a process that took the port in
    # between would be asked for reads (and shown the local token) by every reader of this machine
    from rewardflow.clickhouse.connect import as_dsn

    reads: Any = _read_endpoint(settings) if sink and as_dsn(settings.dsn).embedded else None
    parts: dict[str, Any] = {}
    stop = threading.Event()
    thread: threading.Thread | None = None
    edge: Any = None
    status: StatusLine | None = None
    supervisor: Any = None

    def stop_sink() -> None:
        if edge is not None:
            edge.stop()  # requests in flight finish and Kafka acknowledges them before the sink stops
        stop.set()
        if thread is not None:
            thread.join()
        if reads is not None:
            reads.stop()

    code = 0
    trimmer = HeapTrimmer(settings.heap_trim_seconds).start() if sink else None
    try:
        if worker:  # the workers need Kafka only: they start while the sink prepares ClickHouse
            from rewardflow.children import WorkerSupervisor

            parts["workers"] = supervisor = WorkerSupervisor(settings, workers, log_level=log_level.upper()).start()
        if sink:
            from rewardflow.clickhouse.errors import ClickHouseError
            from rewardflow.sink.route import RewardSink
            from rewardflow.rewards.registry import prepare_database
            from rewardflow.rewards.spec import SpecError

            try:
                prepare_database(settings)
                parts["sink"] = sink_obj = RewardSink(settings)
            except (ClickHouseError, SpecError) as exc:
                _fail(str(exc))
            except Exception as exc:  # driver errors (connection refused, auth) vary by backend
                from rewardflow.clickhouse.errors import clean_message

                _fail(f"cannot prepare ClickHouse: {clean_message(exc)}")
            thread = threading.Thread(target=sink_obj.run, args=(stop,), name="rewardflow-sink")
            thread.start()
            if reads is not None:  # this process owns the chDB directory: everyone else reads through it
                reads.start()
        edge = _collector(settings, sink_obj.dsn if sink and sink_obj.dsn.embedded else None) if collect else None
        if sink and monitor_interval > 0:
            from rewardflow.analysis.monitor_loop import MonitorLoop

            MonitorLoop(settings, monitor_baseline, monitor_interval).start()
        status = StatusLine(settings, status_interval, parts)
        if status_interval > 0:
            status.start()
        if supervisor is not None:
            failed = _wait_for_signal(supervisor.check)
            code = supervisor.stop(timeout=60.0)
            if failed:
                typer.echo(f"error: {failed}", err=True)
                code = 1
        else:
            _wait_for_signal()
    finally:
        if supervisor is not None:
            supervisor.stop()
        if status is not None:
            status.stopped.set()
        stop_sink()
        if trimmer is not None:
            trimmer.stop()
    log.info("stopped%s", "" if code == 0 else f" (exit code {code})")
    raise typer.Exit(code)


def _collector(settings: Settings, owned_dsn: Any) -> Any:
    """The ingestion edge, started; keys come from this process's engine when it owns chDB."""
    from rewardflow.clickhouse.connect import get_client, open_reader
    from rewardflow.collector.server import Collector, keys_from_client, keys_from_reader

    load = keys_from_client(get_client(dsn=owned_dsn)) if owned_dsn is not None else keys_from_reader(open_reader(settings))
    return Collector(settings, load).start()


def _read_endpoint(settings: Settings) -> Any:
    """The owner's read endpoint with its socket bound, not started yet; exit 2 when its address is taken."""
    from rewardflow.clickhouse.connect import as_dsn
    from rewardflow.readapi.server import ReadServer

    try:
        return ReadServer(as_dsn(settings.dsn), settings)
    except OSError as exc:
        _fail(f"{exc.strerror or exc}; no reader of this machine may be served by another process on it")


def _wait_for_signal(check: Any = None) -> str | None:
    """Block until SIGINT/SIGTERM, or until ``check()`` (called twice a second) returns a message."""
    import signal

    got = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: got.set())
    while not got.wait(0.5):
        failed = check() if check is not None else None
        if failed:
            return str(failed)
    return None
