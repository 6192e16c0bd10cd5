"""The stream worker as a child process, configured by the parent's settings.

Contract: :meth:`start` returns once the process is spawned (it joins its
consumer group on its own); :meth:`stop` sends SIGTERM and waits for the
graceful shutdown (flush, commit), then SIGKILLs after ``timeout``;
:meth:`kill` is SIGKILL (for fault tests). The log goes to ``log_path``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from pydantic import SecretStr

from rewardflow.settings import Settings


def settings_env(settings: Settings) -> dict[str, str]:
    """``REWARDFLOW_*`` variables that reproduce ``settings`` in a child process."""
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


class WorkerProcess:
    """``python -m rewardflow_streams.main`` with the given settings."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings, self.log_path = settings, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        env = {**os.environ, **settings_env(self.settings)}
        self.proc = subprocess.Popen([sys.executable, "-m", "rewardflow_streams.main"], env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
