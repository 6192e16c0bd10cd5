"""Child processes configured by the parent's settings: the stream worker, and others like it.

Contract: :class:`ChildProcess` runs ``argv`` with an environment that
reproduces ``settings`` exactly (every inherited ``REWARDFLOW_*`` variable is
dropped, then :func:`settings_env` and the ``env`` overrides are set), with
stdout and stderr appended to ``log_path`` (a marker line at each start, kill
and forced stop). It may be started, killed and restarted any number of
times. :meth:`~ChildProcess.start` returns once the process is spawned;
:meth:`~ChildProcess.stop` sends SIGTERM and waits for the graceful shutdown
(flush, commit), then SIGKILLs after ``timeout``; :meth:`~ChildProcess.kill`
is SIGKILL (for fault tests); both are idempotent. With ``detach`` the child
runs in its own session (no signals from the terminal) and is SIGKILLed if
this process dies without stopping it (Linux).

:class:`WorkerProcess` is ``python -m rewardflow_streams.main``; its
:meth:`~WorkerProcess.wait_joined` blocks until the worker's consumer group is
stable with one member of the latest start owning every raw partition.
Failures raise :class:`WorkerError` with the tail of the log.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rewardflow.children import WORKER_MODULE, parent_death_signal, settings_env
from rewardflow.kafka import topics as T
from rewardflow.settings import Settings

# librdkafka's log of the admin client goes through logging (under pytest: shown with a failed test)
KAFKA_LOG = logging.getLogger("rewardflow.demo.worker_proc.librdkafka")


class WorkerError(RuntimeError):
    """A child process exited, did not start, or did not get ready in time."""


class ChildProcess:
    """``argv`` with ``settings`` in its environment and its output appended to ``log_path``."""

    name: ClassVar[str] = "process"
    stop_timeout: ClassVar[float] = 30.0  # default of stop(): seconds from SIGTERM to SIGKILL

    def __init__(self, settings: Settings, log_path: Path, argv: Sequence[str], *, cwd: Path | None = None,
                 env: Mapping[str, str] | None = None, detach: bool = False) -> None:
        self.settings, self.log_path, self.argv, self.cwd, self.detach = settings, log_path, list(argv), cwd, detach
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
        self.env.update(settings_env(settings), PYTHONFAULTHANDLER="1")  # a crash or SIGABRT writes the stacks
        self.env.update(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self.alive:
            raise WorkerError(f"{self.name} already running (pid {self.proc and self.proc.pid})")
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            log.write(f"\n===== {self.name} start #{self.starts} at {time.strftime('%H:%M:%S')} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=self.detach,
                                         preexec_fn=parent_death_signal() if self.detach else None)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM (graceful: flush + commit), SIGKILL after ``timeout``; idempotent. The exit code, if started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            timeout = self.stop_timeout if timeout is None else timeout
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                self._note(f"no exit {timeout:.0f}s after SIGTERM: SIGKILL")
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no flush, no commit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._note("SIGKILL")

    def wait_exit(self, timeout: float) -> int:
        """Block until the process exits on its own; its exit code."""
        if self.proc is None:
            raise WorkerError(f"{self.name} never started")
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise WorkerError(f"{self.name} did not exit within {timeout:.0f}s:\n{self.log_tail()}") from None

    def wait_answering(self, url: str, timeout: float) -> None:
        """Block until ``url`` answers an HTTP GET; raises :class:`WorkerError` (with the log's end)
        when the process exits first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return
            except OSError:
                if not self.alive or time.monotonic() > deadline:
                    why = "exited" if not self.alive else f"did not answer {url} within {timeout:.0f}s"
                    raise WorkerError(f"{self.name} {why}:\n{self.log_tail(4000)}") from None
                time.sleep(0.2)

    def abort_with_stacks(self) -> None:
        """SIGABRT a running process so faulthandler writes where each thread is to the log (diagnosis)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)

    # ------------------------------------------------------------------ log
    def _note(self, text: str) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"===== {text} at {time.strftime('%H:%M:%S')} =====\n".encode())

    def log_tail(self, max_chars: int = 20_000) -> str:
        """The end of the log, with carriage returns as newlines and cursor show/hide codes removed."""
        if not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_bytes().decode(errors="replace").replace("\r", "\n")
        text = text.replace("\x1b[?25l", "").replace("\x1b[?25h", "")
        return text[-max_chars:]


class WorkerProcess(ChildProcess):
    """``python -m rewardflow_streams.main`` (or ``argv``) with the given settings."""

    name = "worker"

    def __init__(self, settings: Settings, log_path: Path, *, argv: Sequence[str] | None = None,
                 cwd: Path | None = None, env: Mapping[str, str] | None = None, detach: bool = False) -> None:
        super().__init__(settings, log_path, argv or [sys.executable, "-m", WORKER_MODULE], cwd=cwd, env=env,
                         detach=detach)
        self.group = settings.topic("worker")  # Faust's app id is its consumer group
        self._admin: Any = None
        self._gone_members: set[str] = set()

    def kill(self) -> None:
        """SIGKILL. Its group membership lingers until the session times out: :meth:`wait_joined` waits that out."""
        self._gone_members |= {m.member_id for m in self._members()}
        super().kill()

    def restart(self, timeout: float = 40.0) -> None:
        self.start()
        self.wait_joined(timeout)

    def close(self) -> None:
        """Stop the worker and destroy the admin client."""
        self.stop()
        self.release_admin()

    def release_admin(self) -> None:
        """Destroy the admin client now (it is made again if needed).

        librdkafka's destroy of an admin client hangs for good once its broker
        went away (seen at interpreter exit after the broker stopped, and after
        a broker restart), so destroy it while its broker is healthy.
        """
        self._admin = None
        gc.collect()

    # ------------------------------------------------------------------ readiness
    def _members(self) -> list[Any]:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self.settings.kafka_client_config(), logger=KAFKA_LOG)
        try:
            return list(self._admin.describe_consumer_groups([self.group])[self.group].result(timeout=5).members)
        except Exception:  # group not created yet, coordinator loading
            return []

    def wait_joined(self, timeout: float = 40.0) -> None:
        """Block until one member of *this* start owns every raw partition of a stable group."""
        raw = self.settings.topic(T.RAW)
        want = set(range(self.settings.partitions))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise WorkerError(f"worker exited with {self.proc and self.proc.returncode}:\n{self.log_tail()}")
            members = self._members()
            if len(members) == 1 and members[0].member_id not in self._gone_members:
                owned = {tp.partition for tp in members[0].assignment.topic_partitions if tp.topic == raw}
                if owned == want:
                    return
            time.sleep(0.25)
        raise WorkerError(f"worker did not join group {self.group} within {timeout:.0f}s:\n{self.log_tail()}")

