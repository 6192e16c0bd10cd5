"""Child processes of rewardflow commands: their settings, their lifetime, and supervised workers.

:func:`settings_env` reproduces a :class:`Settings` in a child's environment. :func:`parent_death_signal`
has a child killed when its parent dies, even by SIGKILL (Linux), so nothing outlives the command
that started it.

:class:`WorkerSupervisor` runs ``count`` stream worker processes of one consumer group for
``rewardflow run``. They write to this process's standard output and error (one log stream, each
line naming its process id), serve Prometheus metrics on the ports after ``web_port``
(:func:`worker_metrics_ports`), and start in a
session of their own, so a terminal's Ctrl-C reaches only the supervisor, which then stops them in
order. A worker that exits while it should run is restarted; after ``max_restarts`` exits within
``restart_window_s`` the supervisor gives up and says why (:meth:`WorkerSupervisor.check`).

Contract: :meth:`WorkerSupervisor.stop` sends SIGTERM (a worker flushes its producer and commits),
waits up to ``timeout`` seconds, then SIGKILLs; it returns the largest exit code, 0 when every
worker stopped cleanly. Not thread-safe: one thread supervises.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable

from pydantic import SecretStr

from rewardflow.settings import Settings

log = logging.getLogger("rewardflow.run")
WORKER_MODULE = "rewardflow_streams.main"


def settings_env(settings: Settings) -> dict[str, str]:
    """``REWARDFLOW_*`` variables that reproduce ``settings`` in a child process (secrets included)."""
    env: dict[str, str] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, (list, tuple, dict)):
            value = json.dumps(value)
        env[f"REWARDFLOW_{name.upper()}"] = str(value)
    return env


def parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child SIGKILLed when this process dies (``PR_SET_PDEATHSIG``; Linux)."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl  # resolved here: no dlopen after fork
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return preexec


def default_worker_count(settings: Settings) -> int:
    """Workers ``rewardflow run`` starts unless told: one per core this process may run on, at most one
    per partition (a worker beyond the partitions would idle as a spare)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, settings.partitions))


def worker_metrics_ports(settings: Settings, count: int) -> list[int]:
    """The metrics port of worker 0, 1, ... of ``rewardflow run``: the ports after ``web_port``, in order,
    skipping the edge's ``collect_port`` (so ``--collect`` and several workers fit the defaults).
    Raises ``ValueError`` when they would run past 65535."""
    ports: list[int] = []
    port = settings.web_port + 1
    while len(ports) < count:
        if port > 65535:
            raise ValueError(f"{count} workers need {count} metrics ports after REWARDFLOW_WEB_PORT "
                             f"({settings.web_port}); lower it")
        if port != settings.collect_port:
            ports.append(port)
        port += 1
    return ports


class WorkerSupervisor:
    def __init__(self, settings: Settings, count: int, *, log_level: str = "INFO", max_restarts: int = 3,
                 restart_window_s: float = 300.0, argv: list[str] | None = None) -> None:
        """``argv``: the worker command (default ``python -m rewardflow_streams.main --web --log-level L``)."""
        self.settings, self.count, self.log_level = settings, count, log_level
        self.argv = argv or [sys.executable, "-m", WORKER_MODULE, "--web", "--log-level", log_level]
        self.max_restarts, self.restart_window_s = max_restarts, restart_window_s
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self._exits: deque[float] = deque()
        self._stopping = False
        self._ports = worker_metrics_ports(settings, count)

    def metrics_port(self, index: int) -> int:
        """Worker ``index``'s metrics port (:func:`worker_metrics_ports`)."""
        return self._ports[index]

    def start(self) -> WorkerSupervisor:
        for i in range(self.count):
            self._spawn(i)
        return self

    def _spawn(self, index: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
        env.update(settings_env(self.settings), REWARDFLOW_WORKER_METRICS_PORT=str(self.metrics_port(index)),
                   PYTHONFAULTHANDLER="1")
        proc = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=parent_death_signal())
        self.procs[index] = proc
        log.info("worker %d started: pid %d, metrics on %s:%d", index, proc.pid, self.settings.web_host,
                 self.metrics_port(index))

    @property
    def alive(self) -> int:
        return sum(1 for p in self.procs if p is not None and p.poll() is None)

    def check(self) -> str | None:
        """Restart workers that exited; a message (and nothing restarted) once they exit too often."""
        now = time.monotonic()
        for i, proc in enumerate(self.procs):
            if self._stopping or proc is None or proc.poll() is None:
                continue
            self._exits.append(now)
            while self._exits and now - self._exits[0] > self.restart_window_s:
                self._exits.popleft()
            if len(self._exits) > self.max_restarts:
                return (f"worker {i} (pid {proc.pid}) exited with code {proc.returncode}; {len(self._exits)} worker "
                        f"exits within {self.restart_window_s:.0f} s, so the workers are not restarted again "
                        "(see the log above)")
            log.error("worker %d (pid %d) exited with code %s; restarting it", i, proc.pid, proc.returncode)
            self._spawn(i)
        return None

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM every worker, wait, SIGKILL what is left; the largest exit code. Idempotent."""
        self._stopping = True
        live = [p for p in self.procs if p is not None]
        for p in live:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = []
        for p in live:
            try:
                code = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not stop %.0f s after SIGTERM: SIGKILL", p.pid, timeout)
                p.kill()
                code = p.wait(10)
            codes.append(code if code >= 0 else 128 - code)  # killed by signal N: 128 + N, as a shell says
        return max(codes, default=0)
