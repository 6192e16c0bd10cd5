"""One local Apache Kafka 4.x broker (KRaft, broker+controller) as a background process.

State of a broker lives in its data directory (default
``<home>/kafka/data-<port>``)::

    server.properties  log4j2.properties   rendered on every ``up``
    broker.pid                             PID of the running JVM
    kraft/                                 Kafka's data, formatted once
    logs/server.log                        broker log (log4j2, rolled)
    logs/console.log                       JVM stdout/stderr (crashes before log4j)

``up``, ``down`` and ``status`` are safe to call from several processes:
``up``/``down`` serialise on a lock file in the data directory, and a PID is
only signalled after checking it still runs this broker's config.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rewardflow.kafka_local.admin import metadata_ready
from rewardflow.kafka_local.config import (
    BrokerConfig,
    new_cluster_id,
    render_log4j2_properties,
    render_properties,
    server_properties,
)
from rewardflow.kafka_local.errors import BrokerStartError, PortBusyError
from rewardflow.kafka_local.locking import exclusive_lock
from rewardflow.kafka_local.maven import Progress, ensure_kafka_jars
from rewardflow.kafka_local.ports import port_is_free
from rewardflow.kafka_local.process import is_broker_process, read_pid, terminate, write_pid
from rewardflow.kafka_local.tools import find_java

BROKER_JVM_OPTIONS = ("-Xmx1G", "-Xms1G")  # fixed heap: workaround for KAFKA-19890
TOOL_JVM_OPTIONS = ("-Xmx256m",)


@dataclass(frozen=True)
class BrokerInfo:
    """A snapshot of one broker: where it listens, its PID and log, whether it runs."""

    bootstrap: str
    running: bool
    pid: int | None
    log_file: Path
    data_dir: Path
    started: bool = False
    """True only from the ``up`` call that actually started the process."""


class LocalBroker:
    """Start, stop and inspect one broker bound to 127.0.0.1.

    ``home`` holds the shared jar cache (``<home>/kafka/<version>/libs``).
    Construction does no I/O.
    """

    def __init__(
        self,
        home: Path,
        port: int,
        controller_port: int,
        partitions: int,
        data_dir: Path | None = None,
        *,
        die_with_parent: bool = False,
        node_id: int = 1,
        voters: tuple[tuple[int, int], ...] = (),
        cluster_id: str | None = None,
    ) -> None:
        """``die_with_parent``: the broker gets SIGTERM when the process that started it dies,
        even by SIGKILL (Linux ``PR_SET_PDEATHSIG`` via util-linux ``setpriv``; ignored where
        ``setpriv`` is missing). For brokers owned by a test session or a benchmark, so a killed
        run leaves no 1 GB JVM behind. The signal follows the *thread* that started it: call
        :meth:`up` from a thread that lives as long as the broker should (the main thread).

        ``node_id``, ``voters`` and ``cluster_id``: this broker as one node of a local cluster
        (see :class:`~rewardflow.kafka_local.cluster.LocalCluster`)."""
        if port == controller_port:
            raise ValueError("port and controller_port must differ")
        self.home = home.expanduser()
        self.data_dir = (data_dir or self.home / "kafka" / f"data-{port}").expanduser().absolute()
        self.config = BrokerConfig(port, controller_port, partitions, self.data_dir / "kraft", node_id, voters)
        self.cluster_id = cluster_id
        self._process: subprocess.Popen[bytes] | None = None
        self.die_with_parent = die_with_parent

    @property
    def bootstrap(self) -> str:
        return self.config.bootstrap

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "server.log"

    def status(self) -> BrokerInfo:
        """Whether the PID in the PID file runs this broker. Does not contact Kafka."""
        pid = read_pid(self.pid_file)
        running = pid is not None and is_broker_process(pid, self.properties_file)
        return BrokerInfo(self.bootstrap, running, pid if running else None, self.log_file, self.data_dir)

    def up(self, timeout: float = 60.0, progress: Progress | None = None) -> BrokerInfo:
        """Start the broker in the background and block until it answers metadata requests.

        A no-op when it already runs (``started`` is False then). The first
        call resolves the jars (see :func:`ensure_kafka_jars`) and formats the
        KRaft storage. The process outlives the caller (own session); stop it
        with :meth:`down`. Raises :class:`ToolMissingError` (no Java 17+ or
        Maven), :class:`PortBusyError`, :class:`ResolutionError`, or
        :class:`BrokerStartError` when the JVM exits early or stays silent
        for ``timeout`` seconds; in the last case it is killed before raising.
        """
        with exclusive_lock(self.data_dir / ".lock"):
            current = self.status()
            if current.running:
                return current
            java = find_java()
            libs = ensure_kafka_jars(self.home, progress)
            pid = self.launch(java, libs)
            self.wait_ready(pid, timeout)
            return BrokerInfo(self.bootstrap, True, pid, self.log_file, self.data_dir, started=True)

    def launch(self, java: Path, libs: Path) -> int:
        """Check the ports, write the config, format the storage once and start the JVM; its PID.

        Does not wait: a cluster starts every node before any can answer (see :meth:`wait_ready`).
        """
        for port in (self.config.port, self.config.controller_port):
            if not port_is_free(port):
                raise PortBusyError(
                    f"port {port} on 127.0.0.1 is already in use; "
                    "stop what listens there or pick another with --port/--controller-port"
                )
        self._write_config()
        if not (self.config.log_dirs / "meta.properties").exists():
            self._format_storage(java, libs)
        return self._spawn(java, libs)

    def wait_ready(self, pid: int, timeout: float) -> None:
        """Block until this broker answers metadata requests; :class:`BrokerStartError` (the JVM
        stopped) when it exits first or stays silent for ``timeout`` seconds."""
        self._wait_until_ready(pid, timeout)

    def down(self, timeout: float = 30.0) -> int | None:
        """Stop the broker by its PID: SIGTERM, then SIGKILL after ``timeout`` seconds.

        Blocks until the process is gone. Returns the PID it stopped, or None
        when no broker of this data directory was running (a stale PID file is
        removed, and the process it names, if any, is left alone).
        """
        if not self.data_dir.is_dir():
            return None
        with exclusive_lock(self.data_dir / ".lock"):
            current = self.status()
            if current.pid is not None:
                terminate(current.pid, timeout)
            self.pid_file.unlink(missing_ok=True)
            if self._process is not None:
                self._process.poll()  # let Popen see the exit that terminate() reaped
                self._process = None
            return current.pid

    # --- steps of ``up`` ----------------------------------------------------------

    def _write_config(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(render_properties(server_properties(self.config)))
        (self.data_dir / "log4j2.properties").write_text(render_log4j2_properties(self.log_file))

    def _java_command(self, java: Path, libs: Path, jvm_options: tuple[str, ...], *args: str) -> list[str]:
        log4j = self.data_dir / "log4j2.properties"
        return [str(java), *jvm_options, f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{libs}/*", *args]

    def _format_storage(self, java: Path, libs: Path) -> None:
        quorum = () if self.config.voters else ("--standalone",)  # a static quorum is in the config
        cmd = self._java_command(
            java, libs, TOOL_JVM_OPTIONS, "kafka.tools.StorageTool", "format", *quorum,
            "-t", self.cluster_id or new_cluster_id(), "-c", str(self.properties_file),
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            lines = (proc.stderr + proc.stdout).strip().splitlines() or [f"exit code {proc.returncode}"]
            raise BrokerStartError(f"formatting KRaft storage in {self.config.log_dirs} failed: {lines[-1]}")

    def _spawn(self, java: Path, libs: Path) -> int:
        cmd = self._java_command(java, libs, BROKER_JVM_OPTIONS, "kafka.Kafka", str(self.properties_file))
        setpriv = shutil.which("setpriv") if self.die_with_parent else None
        if setpriv:  # it execs java: the PID stays the broker's
            cmd = [setpriv, "--pdeathsig", "TERM", "--", *cmd]
        with (self.log_file.parent / "console.log").open("ab") as console:
            self._process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                cwd=self.data_dir, start_new_session=True,  # Ctrl-C of the caller must not reach it
            )
        write_pid(self.pid_file, self._process.pid)
        return self._process.pid

    def _wait_until_ready(self, pid: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not metadata_ready(self.bootstrap, timeout=1.0):
            code = self._process.poll() if self._process is not None else None
            if code is not None:
                self.pid_file.unlink(missing_ok=True)
                raise BrokerStartError(
                    f"Kafka exited with code {code} while starting: {self._last_error()} (log: {self.log_file})"
                )
            if time.monotonic() >= deadline:
                terminate(pid)
                self.pid_file.unlink(missing_ok=True)
                raise BrokerStartError(
                    f"Kafka did not answer at {self.bootstrap} within {timeout:.0f} s and was stopped "
                    f"(log: {self.log_file})"
                )
            time.sleep(0.2)

    def _last_error(self) -> str:
        for path in (self.log_file, self.log_file.parent / "console.log"):
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln]
            if errors:
                return errors[-1].strip()[:300]
        return "no error in the logs"

