"""The owner's read endpoint: Arrow out, writes refused, narrow cursor writes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pyarrow as pa
import pytest

from rewardflow.clickhouse.errors import QueryError
from rewardflow.clickhouse.readonly import ReadOnlyViolation
from rewardflow.clickhouse.readserver import ReadServer
from rewardflow.clickhouse.remote import RemoteReader, endpoint_alive
from tests.conftest_clickhouse import ChDatabase, free_port

pytestmark = pytest.mark.clickhouse


@pytest.fixture
def server(ch_db: ChDatabase) -> Iterator[ReadServer]:
    srv = ReadServer(ch_db.dsn, "127.0.0.1", free_port()).start()
    yield srv
    srv.stop()


def post(url: str, body: bytes, ctype: str = "text/plain") -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_plain_sql_body_returns_an_arrow_stream(server: ReadServer, ch_db: ChDatabase) -> None:
    status, body = post(f"{server.url}/query", b"SELECT number AS n FROM system.numbers LIMIT 3")
    assert status == 200
    assert pa.ipc.open_stream(body).read_all().column("n").to_pylist() == [0, 1, 2]
    assert endpoint_alive(server.url)


def test_writes_are_refused_with_403_and_nothing_changes(server: ReadServer, ch_db: ChDatabase) -> None:
    status, body = post(f"{server.url}/query", json.dumps({"sql": "DROP TABLE rewards", "database": ch_db.name}).encode(), "application/json")
    assert status == 403 and body.startswith(b"refused")
    assert ch_db.client.command("EXISTS TABLE rewards") == 1
    remote = RemoteReader(server.url, database=ch_db.name)
    with pytest.raises(ReadOnlyViolation):
        remote.query_arrow("TRUNCATE TABLE rewards")
    with pytest.raises(QueryError, match="Code 164"):
        remote.query_arrow("SELECT 1 SETTINGS readonly = 0")  # the server-side guarantee


def test_bad_query_and_bad_database_are_clean_400s(server: ReadServer, ch_db: ChDatabase) -> None:
    remote = RemoteReader(server.url, database=ch_db.name)
    with pytest.raises(QueryError, match="Code 60"):
        remote.query_arrow("SELECT * FROM nope")
    with pytest.raises(QueryError, match="not a plain identifier"):
        RemoteReader(server.url, database="x; DROP").query_arrow("SELECT 1")


def test_empty_result_keeps_its_schema_and_cursor_commit_works(server: ReadServer, ch_db: ChDatabase) -> None:
    remote = RemoteReader(server.url, database=ch_db.name)
    table = remote.query_arrow("SELECT reward_id, persisted FROM rewards")
    assert table.num_rows == 0 and table.column_names == ["reward_id", "persisted"]
    assert list(remote.stream_arrow("SELECT reward_id FROM rewards")) == []
    remote.advance_cursor("t", 42, 1, "{}")
    assert ch_db.client.command("SELECT argMax(cursor, _seq) FROM trainer_cursors WHERE trainer = 't'") == 42
