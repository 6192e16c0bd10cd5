"""pytest plugin: ONE ClickHouse engine per test session, one fresh database per test.

Fixtures:

* ``ch_dsn`` (session): the engine's :class:`~rewardflow.clickhouse.dsn.Dsn`.
  ``REWARDFLOW_CLICKHOUSE_DSN`` set -> that server; otherwise chDB on a
  session temp directory. chDB allows one engine per process, bound to one
  path, so every test of the session shares it (never open another chDB path
  in a test). The session keeps one admin client open for its whole life.
* ``ch_db`` (function): a uniquely named database in that engine, migrated,
  as a :class:`ChDatabase` (``.name``, ``.dsn``, ``.client``,
  ``.settings(**overrides)``); dropped ``SYNC`` after the test.

Marking is enforced, not hoped for: a test that uses these fixtures, or that
opens a ClickHouse client at all, without ``@pytest.mark.clickhouse`` fails.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import clickhouse_connect
import pytest
from clickhouse_connect.driver.client import Client
from pydantic import SecretStr

from rewardflow.clickhouse.connect import get_client
from rewardflow.clickhouse.ddl import create_database, drop_database
from rewardflow.clickhouse.dsn import Dsn, parse_dsn
from rewardflow.clickhouse.migrate import migrate
from rewardflow.settings import Settings

DSN_ENV = "REWARDFLOW_CLICKHOUSE_DSN"
_FIXTURES = {"ch_dsn", "ch_db"}


def free_port() -> int:
    """A free loopback TCP port (for a read endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ChDatabase:
    """A migrated, per-test database."""

    name: str
    dsn: Dsn
    client: Client
    home: Any

    def settings(self, **overrides: Any) -> Settings:
        """Settings pointing at this database (chDB or server), a private home and a free web port."""
        values: dict[str, Any] = {
            "clickhouse_dsn": SecretStr(self.dsn.secret),
            "home": self.home,
            "web_port": free_port(),
        }
        values.update(overrides)
        return Settings(**values)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    used = _FIXTURES & set(getattr(item, "fixturenames", ()))
    if used and item.get_closest_marker("clickhouse") is None:
        pytest.fail(f"{item.nodeid} uses ClickHouse ({', '.join(sorted(used))}) but is not marked @pytest.mark.clickhouse", pytrace=False)


@pytest.fixture(autouse=True)
def _clickhouse_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unmarked tests may not open a ClickHouse client, however indirectly."""
    if request.node.get_closest_marker("clickhouse") is not None:
        return
    nodeid = request.node.nodeid

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail(f"{nodeid} opened a ClickHouse client but is not marked @pytest.mark.clickhouse", pytrace=False)

    monkeypatch.setattr(clickhouse_connect, "get_client", refuse)


_ENGINE: list[Dsn] = []  # the process's one engine, even if the fixture is registered twice


@pytest.fixture(scope="session")
def ch_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dsn]:
    if not _ENGINE:
        raw = os.environ.get(DSN_ENV) or f"chdb://{tmp_path_factory.mktemp('chdb').resolve()}"
        _ENGINE.append(parse_dsn(raw))
    dsn = _ENGINE[0]
    admin = get_client(dsn=dsn.with_database("default"))  # keeps the chDB engine open for the session
    try:
        yield dsn
    finally:
        admin.close()


@pytest.fixture
def ch_db(ch_dsn: Dsn, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChDatabase]:
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40].strip("_")
    name = f"t_{slug}_{uuid.uuid4().hex[:8]}"
    admin = get_client(dsn=ch_dsn.with_database("default"))
    admin.command(create_database(name))
    dsn = ch_dsn.with_database(name)
    client = get_client(dsn=dsn)
    migrate(client)
    try:
        yield ChDatabase(name, dsn, client, tmp_path_factory.mktemp("home"))
    finally:
        client.close()
        admin.command(drop_database(name))
        admin.close()
