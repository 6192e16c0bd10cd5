"""The embedded engine starts with rewardflow's allocator decay, unless the user chose their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rewardflow.clickhouse.allocator import DIRTY_DECAY_MS, ENGINE_MALLOC_CONF, ENV, configure_engine_allocator


@pytest.fixture
def chdb_unloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "chdb", raising=False)


def test_an_unset_environment_gets_the_engine_decay(chdb_unloaded: None) -> None:
    env: dict[str, str] = {}
    assert configure_engine_allocator(env) == ENGINE_MALLOC_CONF
    assert env == {ENV: ENGINE_MALLOC_CONF}


def test_the_users_own_options_are_kept(chdb_unloaded: None) -> None:
    env = {ENV: "dirty_decay_ms:5000,background_thread:true"}
    assert configure_engine_allocator(env) == "dirty_decay_ms:5000,background_thread:true"
    assert env[ENV] == "dirty_decay_ms:5000,background_thread:true"


def test_nothing_is_written_once_the_engine_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "chdb", sys)  # any module object: chDB counts as loaded
    env: dict[str, str] = {}
    assert configure_engine_allocator(env) is None
    assert env == {}


_OPEN_AND_READ_DECAY = """
import re, sys
from rewardflow.clickhouse.connect import get_client
client = get_client(dsn="chdb://" + sys.argv[1])
stats = client.query("SELECT * FROM system.jemalloc_stats").result_rows[0][0]
print(re.search(r"opt[.]dirty_decay_ms: (-?[0-9]+)", stats).group(1))
"""


def _engine_decay(path: Path, env: dict[str, str]) -> int:
    """The dirty decay the engine reports after a fresh process opened it with ``get_client``."""
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_AND_READ_DECAY, str(path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.clickhouse
def test_a_process_that_opens_the_engine_starts_it_with_the_decay_or_the_users_choice(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if k != ENV}
    assert _engine_decay(tmp_path / "a", base) == DIRTY_DECAY_MS
    assert _engine_decay(tmp_path / "b", {**base, ENV: "dirty_decay_ms:4000"}) == 4000
