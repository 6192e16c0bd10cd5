"""The owner's read endpoint against the real engine: authenticated, truly read-only, bounded."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from rewardflow.clickhouse.errors import AccessDenied, QueryError, ReaderUnavailable
from rewardflow.clickhouse.readers import CursorError
from rewardflow.clickhouse.readonly import ReadOnlyViolation
from rewardflow.clickhouse.remote import RemoteReader, endpoint_alive, request_signature, signed_text, token_proof
from rewardflow.readapi.server import ReadServer
from rewardflow.readapi.tokens import TokenStore, read_local_token
from rewardflow.settings import Settings
from tests.conftest_clickhouse import ChDatabase, free_port
from tests.slowclients import closed_now, trickle

pytestmark = pytest.mark.clickhouse

# Statements that are not a single read, that write a file, or that reach outside the database. Each
# spelling came from a way a keyword check can be fooled: comments, string literals, heredocs, case,
# unicode, parentheses, clauses after INTO OUTFILE. ``{f}`` is a path that must never be created.
BYPASSES = [
    "SELECT 1 INTO OUTFILE '{f}'",
    "SELECT 1 -- '\n INTO OUTFILE '{f}' FORMAT TSVRaw",
    "SELECT $$'$$ INTO OUTFILE '{f}'",
    "SELECT $tag$'$tag$ INTO OUTFILE '{f}'",
    "select 1 iNtO oUtFiLe '{f}'",
    "SELECT 1 /* x */ INTO /* ' */ OUTFILE '{f}'",
    "SELECT 1 # '\n INTO OUTFILE '{f}'",
    "SELECT 1 INTO OUTFILE '{f}' TRUNCATE",
    "SELECT 1 INTO OUTFILE '{f}' APPEND",
    "SELECT 1 INTO OUTFILE '{f}' AND STDOUT",
    "SELECT 1 INTO OUTFILE '{f}' COMPRESSION 'gzip'",
    "(SELECT 1) INTO OUTFILE '{f}'",
    "WITH 1 AS x SELECT x INTO OUTFILE '{f}'",
    "SELECT 1 UNION ALL SELECT 2 INTO OUTFILE '{f}'",
    "EXPLAIN AST SELECT 1 INTO OUTFILE '{f}'",
    "SELECT 'x' AS `INTO OUTFILE` INTO OUTFILE '{f}'",
    "SELECT * FROM file('{f}', TSV, 'a String')",
    "SELECT file('/etc/hostname')",
    "SELECT * FROM FILE('{f}')",
    "SELECT * FROM url('http://127.0.0.1:9/', CSV, 'a Int32')",
    "SELECT * FROM s3('http://127.0.0.1:9/x.csv', CSV, 'a Int32')",
    "SELECT * FROM remote('127.0.0.1:9', system.one)",
    "SELECT * FROM executable('id', TSV, 'a String')",
    "SELECT * FROM (SELECT * FROM url('http://127.0.0.1:9/', CSV, 'a Int32'))",
    "SELECT 1 SETTINGS readonly = 0",
    "SELECT 1 SETTINGS max_memory_usage = 0",
    "INSERT INTO rewards SELECT * FROM rewards",
    "DROP TABLE rewards",
    "TRUNCATE TABLE rewards",
    "ALTER TABLE rewards DELETE WHERE 1",
    "CREATE TABLE x (a Int32) ENGINE = Memory",
    "SELECT 1; DROP TABLE rewards",
    "SET readonly = 0",
    "SYSTEM FLUSH LOGS",
    "KILL QUERY WHERE 1",
    "OPTIMIZE TABLE rewards FINAL",
    "ＳＥＬＥＣＴ 1",
    "",
    "-- nothing but a comment",
]


def grant(settings: Settings, role: str = "analyst", trainer: str | None = None) -> str:
    return TokenStore(settings.home).create(role, "test", trainer)[1]


@pytest.fixture
def endpoint(ch_db: ChDatabase) -> Iterator[tuple[ReadServer, Settings]]:
    settings = ch_db.settings(read_max_memory_bytes=256 * 1024**2, read_idle_timeout_s=1.0, read_max_queries=2)
    server = ReadServer(ch_db.dsn, settings, "127.0.0.1", 0).start()
    yield server, settings
    server.stop()


def post(url: str, body: bytes, token: str | None = None, ctype: str = "text/plain",
         authorization: str | None = None) -> tuple[int, bytes, Any]:
    """POST ``body`` with the bearer ``token`` or the ``authorization`` given; (status, body, headers)."""
    if authorization is None and token:
        authorization = f"Bearer {token}"
    headers = {"Content-Type": ctype, **({"Authorization": authorization} if authorization else {})}
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


# ---------------------------------------------------------------------------- authentication
def test_a_token_is_required_and_a_revoked_one_stops_working(endpoint: Any, ch_db: ChDatabase) -> None:
    server, settings = endpoint
    assert endpoint_alive(server.url)  # /health answers without a token
    assert post(f"{server.url}/query", b"SELECT 1")[0] == 401
    status, body, headers = post(f"{server.url}/query", b"SELECT 1", "rfr_000000000000_not-a-real-token-at-all")
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer, RF-HMAC-SHA256" and body.startswith(b"unauthorized")
    store = TokenStore(settings.home)
    g, token = store.create("analyst", "alice")
    status, body, _ = post(f"{server.url}/query", b"SELECT number AS n FROM system.numbers LIMIT 3", token)
    assert status == 200 and pa.ipc.open_stream(body).read_all().column("n").to_pylist() == [0, 1, 2]
    store.revoke(g.token_id)
    assert post(f"{server.url}/query", b"SELECT 1", token)[0] == 401  # the very next request
    assert token not in (settings.home / "read-tokens.json").read_text()  # stored hashed
    assert oct((settings.home / "read-tokens.json").stat().st_mode & 0o777) == "0o600"


def test_a_trainer_token_moves_only_its_own_cursor_and_only_forward(endpoint: Any, ch_db: ChDatabase) -> None:
    server, settings = endpoint
    mine = RemoteReader(server.url, token=grant(settings, "trainer", "t1"), database=ch_db.name)
    mine.advance_cursor("t1", 42, 1, "{}")
    with pytest.raises(AccessDenied, match="may not move"):
        mine.advance_cursor("t2", 43, 1, "{}")
    with pytest.raises(CursorError, match="back"):
        mine.advance_cursor("t1", 41, 1, "{}")
    with pytest.raises(CursorError, match="beyond"):
        mine.advance_cursor("t1", 2**64 - 1, 1, "{}")
    with pytest.raises(CursorError, match="filters"):
        mine.advance_cursor("t1", 50, 1, "x" * 5_000)
    analyst = RemoteReader(server.url, token=grant(settings), database=ch_db.name)
    with pytest.raises(AccessDenied):
        analyst.advance_cursor("t1", 44, 1, "{}")
    assert ch_db.client.command("SELECT argMax(cursor, _seq) FROM trainer_cursors WHERE trainer = 't1'") == 42
    assert ch_db.client.command("SELECT count() FROM trainer_cursors WHERE trainer = 't2'") == 0


def test_the_owner_writes_a_local_token_only_its_user_can_read(endpoint: Any) -> None:
    server, settings = endpoint
    token = read_local_token(settings.home)
    assert token is not None and oct((settings.home / "read.token").stat().st_mode & 0o777) == "0o600"
    assert post(f"{server.url}/query", b"SELECT 1", token)[0] == 200


# ---------------------------------------------------------------------------- read-only
@pytest.mark.parametrize("sql", BYPASSES)
def test_bypasses_are_refused_and_no_file_appears(endpoint: Any, ch_db: ChDatabase, tmp_path: Path, sql: str) -> None:
    server, settings = endpoint
    target = tmp_path / "written.txt"
    statement = sql.replace("{f}", str(target))
    remote = RemoteReader(server.url, token=grant(settings), database=ch_db.name)
    with pytest.raises(ReadOnlyViolation, match="^refused"):
        remote.query_arrow(statement)
    local = server.service.borrow(ch_db.name)  # the same guard in-process (rewardflow sql on a free directory)
    try:
        with pytest.raises(ReadOnlyViolation, match="^refused"):
            local.query_arrow(statement)
    finally:
        server.service.give_back(ch_db.name, local)
    assert not target.exists() and not Path("written.txt").exists()
    assert ch_db.client.command("EXISTS TABLE rewards") == 1


# Parameters a driver would paste into the text (clickhouse-connect's ``%(name)s``, for a statement with
# no ``{name:Type}`` placeholder): quoted by the driver, the value closes the literal around it and runs as SQL.
PASTED = [
    ("SELECT 'x' AS p ORDER BY '%(a)s{f}%(b)s'", {"a": " INTO OUTFILE ", "b": " FORMAT TSVRaw --"}),
    ("SELECT 'x' AS p ORDER BY '%(a)s{f}%(b)s'", {"a": " INTO OUTFILE ", "b": " APPEND FORMAT TSVRaw --"}),
    ("SELECT '%(a)s' AS p", {"a": "') INTO OUTFILE '{f}' --"}),
    ("SELECT 1 AS p WHERE 'x' LIKE '%x'", {"a": "x"}),  # (a stray % the driver cannot format)
]


@pytest.mark.parametrize(("sql", "parameters"), PASTED)
def test_parameters_the_driver_would_write_into_the_text_are_refused(endpoint: Any, ch_db: ChDatabase, tmp_path: Path,
                                                                    sql: str, parameters: dict[str, str]) -> None:
    server, settings = endpoint
    target = tmp_path / "written.txt"
    statement = sql.replace("{f}", str(target))
    params = {k: v.replace("{f}", str(target)) for k, v in parameters.items()}
    remote = RemoteReader(server.url, token=grant(settings), database=ch_db.name)
    with pytest.raises(ReadOnlyViolation, match="^refused: the parameters would be written into the statement"):
        remote.query_arrow(statement, params)
    local = server.service.borrow(ch_db.name)
    try:
        for run in (local.query_arrow, lambda q, p: list(local.stream_arrow(q, p))):
            with pytest.raises(ReadOnlyViolation, match="^refused: the parameters would be written"):
                run(statement, params)
    finally:
        server.service.give_back(ch_db.name, local)
    assert not target.exists()


def test_parameters_the_engine_binds_stay_values(endpoint: Any, ch_db: ChDatabase, tmp_path: Path) -> None:
    server, settings = endpoint
    target = tmp_path / "written.txt"
    params = {"v": "x", "a": " INTO OUTFILE ", "b": f"{target}' FORMAT TSVRaw --"}
    remote = RemoteReader(server.url, token=grant(settings), database=ch_db.name)
    sql = "SELECT {v:String} AS v, '%(a)s{b:String}' AS p, {a:String} || {b:String} AS q"  # a placeholder: no pasting
    assert remote.query_arrow(sql, params).to_pylist() == [{"v": "x", "p": "%(a)s{b:String}",
                                                            "q": params["a"] + params["b"]}]
    assert remote.query_arrow("SELECT 1 AS one", params).to_pylist() == [{"one": 1}]  # unused ones change nothing
    assert not target.exists()


def test_reads_that_look_like_bypasses_are_allowed(endpoint: Any, ch_db: ChDatabase) -> None:
    server, settings = endpoint
    remote = RemoteReader(server.url, token=grant(settings), database=ch_db.name)
    for sql in ["SELECT 'INTO OUTFILE' AS s", "SELECT `INTO OUTFILE`.x FROM (SELECT 1 AS x) AS `INTO OUTFILE`",
                "WITH 2 AS x SELECT x", "SELECT * FROM numbers(2)", "SHOW TABLES", "DESCRIBE TABLE rewards",
                "EXISTS TABLE rewards", "EXPLAIN AST SELECT 1", "SELECT 1 -- INTO OUTFILE 'x'",
                "SELECT count() FROM rewards WHERE spec_version = {v:String}"]:
        remote.query_arrow(sql, {"v": "v1"} if "{v:" in sql else None)


def test_bad_query_and_bad_database_are_clean_400s(endpoint: Any, ch_db: ChDatabase) -> None:
    server, settings = endpoint
    token = grant(settings)
    with pytest.raises(QueryError, match="Code 60"):
        RemoteReader(server.url, token=token, database=ch_db.name).query_arrow("SELECT * FROM nope")
    with pytest.raises(QueryError, match="not a plain identifier"):
        RemoteReader(server.url, token=token, database="x; DROP").query_arrow("SELECT 1")


def test_empty_result_keeps_its_schema(endpoint: Any, ch_db: ChDatabase) -> None:
    server, settings = endpoint
    remote = RemoteReader(server.url, token=grant(settings), database=ch_db.name)
    table = remote.query_arrow("SELECT reward_id, persisted FROM rewards")
    assert table.num_rows == 0 and table.column_names == ["reward_id", "persisted"]
    assert list(remote.stream_arrow("SELECT reward_id FROM rewards")) == []


def test_every_streamed_response_ends_even_when_the_query_outruns_the_client(endpoint: Any) -> None:
    """A result of many blocks is written faster than it is sent, so the query thread finishes with
    its queue full. Each response must still end (the HTTP body completes, not only the Arrow stream),
    and must give its worker thread back: more responses than the endpoint has worker threads (40)."""
    server, settings = endpoint
    token = grant(settings)
    for i in range(45):
        req = urllib.request.Request(f"{server.url}/query", data=b"SELECT number FROM numbers(1000000)", method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=20) as resp:
            body = resp.read()  # to the end of the HTTP body: raises TimeoutError if it never ends
        table = pa.ipc.open_stream(body).read_all()
        assert table.num_rows == 1_000_000 and table.column("number")[-1].as_py() == 999_999, i


# ---------------------------------------------------------------------------- bounds
def test_a_memory_hungry_query_is_stopped_by_its_limit_while_writes_go_on(endpoint: Any, ch_db: ChDatabase) -> None:
    server, settings = endpoint
    remote = RemoteReader(server.url, token=grant(settings), database=ch_db.name)
    writes: list[int] = []
    stop = threading.Event()

    def ingest() -> None:  # the pipeline's writes, meanwhile
        i = 0
        while not stop.is_set():
            ch_db.client.command(f"INSERT INTO trainer_cursors (trainer, cursor, rows, filters) VALUES ('w{i}', 1, 1, '')")
            writes.append(i)
            i += 1

    t = threading.Thread(target=ingest)
    t.start()
    try:
        with pytest.raises(QueryError, match="Code 241|MEMORY_LIMIT"):
            remote.query_arrow("SELECT groupArray(number) FROM numbers(100000000)")
    finally:
        stop.set()
        t.join()
    assert writes and ch_db.client.command("SELECT count() FROM trainer_cursors") == len(writes)
    assert remote.query_arrow("SELECT 1 AS x").column("x").to_pylist() == [1]  # the endpoint goes on


def test_a_query_whose_blocks_are_over_the_limit_is_stopped_naming_it(ch_db: ChDatabase) -> None:
    settings = ch_db.settings(read_max_block_bytes=4 * 1024**2)
    server = ReadServer(ch_db.dsn, settings, "127.0.0.1", 0).start()
    try:
        remote = RemoteReader(server.url, token=grant(settings), database=ch_db.name)
        with pytest.raises(QueryError, match="REWARDFLOW_READ_MAX_BLOCK_BYTES"):
            remote.query_arrow("SELECT repeat(repeat('x', 1000), 6000) AS wide FROM numbers(4)")
        # a block over it after the answer began: the answer is cut, never a shorter result that looks whole
        later = "SELECT number, if(number >= 200000, repeat('a', 2000), '') AS s FROM numbers(300000)"
        with pytest.raises(QueryError, match="ended before the end of its result|cut off"):
            remote.query_arrow(later)
        with pytest.raises(QueryError, match="ended before the end of its result|cut off"):
            sum(b.num_rows for b in remote.stream_arrow(later))
        assert remote.query_arrow("SELECT count() AS n FROM numbers(1000000)").column("n").to_pylist() == [1_000_000]
    finally:
        server.stop()


def test_more_queries_than_slots_get_503_with_retry_after(endpoint: Any, ch_db: ChDatabase) -> None:
    server, settings = endpoint
    token = grant(settings)
    slow = b"SELECT sleepEachRow(1) FROM numbers(2)"
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(post(f"{server.url}/query", slow, token)[0]))
               for _ in range(settings.read_max_queries)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    status, body, headers = post(f"{server.url}/query", b"SELECT 1", token)
    for t in threads:
        t.join()
    assert status == 503 and headers["Retry-After"] == "1" and b"retry" in body
    assert results == [200] * settings.read_max_queries
    assert post(f"{server.url}/query", b"SELECT 1", token)[0] == 200  # the slots came back


def test_a_token_runs_at_most_its_share_of_the_queries(ch_db: ChDatabase) -> None:
    settings = ch_db.settings(read_max_queries=3, read_max_queries_per_token=2)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        greedy, other = grant(settings), grant(settings)
        slow = b"SELECT sleepEachRow(1) FROM numbers(2)"
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(post(f"{server.url}/query", slow, greedy)[0]))
                   for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        status, body, headers = post(f"{server.url}/query", b"SELECT 1", greedy)
        assert status == 429 and headers["Retry-After"] == "1" and b"REWARDFLOW_READ_MAX_QUERIES_PER_TOKEN" in body
        assert post(f"{server.url}/query", b"SELECT 1", other)[0] == 200  # a slot is left for everyone else
        for t in threads:
            t.join()
        assert results == [200, 200]
        assert post(f"{server.url}/query", b"SELECT 1", greedy)[0] == 200  # its share came back


def test_a_client_that_takes_none_of_its_response_loses_the_connection_and_its_slot(ch_db: ChDatabase) -> None:
    settings = ch_db.settings(read_max_queries=1, read_send_timeout_s=1.5)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        token = grant(settings)
        host, port = server.url.rsplit("/", 1)[-1].rsplit(":", 1)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (a small window: the server's buffer fills soon)
        s.connect((host, int(port)))
        sql = b"SELECT number FROM numbers(10000000000)"
        s.sendall(b"POST /query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
                  + b"\r\nContent-Length: " + str(len(sql)).encode() + b"\r\n\r\n" + sql)
        assert s.recv(12) == b"HTTP/1.1 200"  # streaming an endless result, and then reading no more of it
        began = time.monotonic()
        status = post(f"{server.url}/query", b"SELECT 1", token)[0]
        assert status == 503  # the only slot is held
        while status == 503 and time.monotonic() - began < 20:
            time.sleep(0.2)
            status = post(f"{server.url}/query", b"SELECT 1", token)[0]
        assert status == 200, "a response nobody reads still holds its slot"
        assert time.monotonic() - began < 10
        assert _closed(s) or _drained_to_the_end(s)  # and its connection is gone
        s.close()


def _drained_to_the_end(s: socket.socket) -> bool:
    """Whether reading what the server had sent before closing ``s`` ends in the close (within 10 s)."""
    s.settimeout(10)
    try:
        while s.recv(1 << 20):
            pass
        return True
    except OSError:
        return True


def test_the_reader_waits_out_a_busy_endpoint_for_at_most_its_busy_wait(ch_db: ChDatabase) -> None:
    settings = ch_db.settings(read_max_queries=1)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        token = grant(settings)
        hold = threading.Thread(target=post, args=(f"{server.url}/query", b"SELECT sleepEachRow(1) FROM numbers(2)", token))
        hold.start()
        time.sleep(0.5)
        with pytest.raises(ReaderUnavailable, match="busy"):
            RemoteReader(server.url, token=token, busy_wait_s=0).query_arrow("SELECT 1 AS x")
        began = time.monotonic()
        table = RemoteReader(server.url, token=token, busy_wait_s=10).query_arrow("SELECT 1 AS x")
        assert table.column("x").to_pylist() == [1] and time.monotonic() - began >= 0.5  # it waited for the slot
        hold.join()


def test_a_body_over_the_limit_is_refused_with_413(ch_db: ChDatabase) -> None:
    settings = ch_db.settings(read_max_body_bytes=4_096)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        token = grant(settings)
        assert post(f"{server.url}/query", b"SELECT '" + b"x" * 5_000 + b"'", token)[0] == 413
        assert post(f"{server.url}/query", json.dumps({"sql": "SELECT 1", "parameters": {"p": "x" * 5_000}}).encode(),
                    token, "application/json")[0] == 413


def test_a_thousand_idle_connections_leave_the_threads_bounded_and_are_closed(endpoint: Any) -> None:
    server, settings = endpoint
    host, port = server.url.rsplit("/", 1)[-1].rsplit(":", 1)
    before = threading.active_count()
    sockets = [socket.create_connection((host, int(port)), timeout=5) for _ in range(1_000)]
    try:
        time.sleep(0.5)
        assert threading.active_count() <= before + 2  # no thread per connection
        time.sleep(settings.read_idle_timeout_s + 1.5)  # the server closes connections that send nothing
        closed = sum(1 for s in sockets if _closed(s))
        assert closed == len(sockets), f"{len(sockets) - closed} idle connections still open"
    finally:
        for s in sockets:
            s.close()
    assert post(f"{server.url}/query", b"SELECT 1", grant(settings))[0] == 200


@pytest.mark.parametrize("part", ["head", "body"])
def test_a_request_sent_a_byte_at_a_time_is_closed_at_its_deadline(ch_db: ChDatabase, part: str) -> None:
    settings = ch_db.settings(read_idle_timeout_s=1.0, read_request_timeout_s=2.5, read_max_connections=8)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        host, port = server.url.rsplit("/", 1)[-1].rsplit(":", 1)
        start = (b"POST /query HTTP/1.1\r\nHost: x\r\nX-a: " if part == "head" else
                 b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nSELECT ")
        sockets = [socket.create_connection((host, int(port)), timeout=5) for _ in range(8)]  # every slot
        began = time.monotonic()
        still_open = trickle(sockets, start, 6.0)
        took = time.monotonic() - began
        assert not still_open, f"{len(still_open)} slow requests still open after {took:.1f} s"
        assert took < (2.0 if part == "head" else 3.5)  # the head's deadline, or the whole request's
        for s in sockets:
            s.close()
        assert post(f"{server.url}/query", b"SELECT 1", grant(settings))[0] == 200


def test_one_client_address_holds_at_most_its_share_of_the_connections(ch_db: ChDatabase) -> None:
    settings = ch_db.settings(read_max_client_connections=16, read_idle_timeout_s=30.0)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        host, port = server.url.rsplit("/", 1)[-1].rsplit(":", 1)
        sockets = [socket.create_connection((host, int(port)), timeout=5) for _ in range(24)]
        time.sleep(0.5)
        held = [s for s in sockets if not closed_now(s)]
        assert len(held) == 16  # the rest closed at once, not after the idle timeout
        with pytest.raises(OSError):  # a request on one more connection: closed at once
            post(f"{server.url}/query", b"SELECT 1", grant(settings))
        for s in sockets:
            s.close()
        time.sleep(0.5)
        assert post(f"{server.url}/query", b"SELECT 1", grant(settings))[0] == 200  # the share is free again


def test_loopback_addresses_share_one_clients_share_of_the_connections(ch_db: ChDatabase) -> None:
    settings = ch_db.settings(read_max_client_connections=8, read_idle_timeout_s=30.0)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        host, port = server.url.rsplit("/", 1)[-1].rsplit(":", 1)
        sockets = [socket.create_connection((host, int(port)), timeout=5, source_address=(f"127.0.0.{2 + i % 4}", 0))
                   for i in range(16)]  # four addresses of this host, four connections each
        time.sleep(0.5)
        assert len([s for s in sockets if not closed_now(s)]) == 8
        for s in sockets:
            s.close()


def _closed(s: socket.socket) -> bool:
    s.settimeout(2)
    try:
        return s.recv(1) == b""
    except OSError:
        return True


# ---------------------------------------------------------------------------- configuration and ownership
def test_binding_beyond_loopback_needs_tls_or_the_explicit_flag(tmp_path: Path) -> None:
    from rewardflow.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="REWARDFLOW_WEB_TLS_CERTFILE"):
        load_settings(home=tmp_path, web_host="0.0.0.0")
    assert load_settings(home=tmp_path, web_host="0.0.0.0", web_insecure_public=True).web_host == "0.0.0.0"
    assert load_settings(home=tmp_path, web_host="::1").web_host == "::1"


def test_a_reader_started_while_the_owner_runs_uses_the_endpoint(endpoint: Any, ch_db: ChDatabase) -> None:
    from rewardflow.clickhouse.enginelock import probe_engine

    if not ch_db.dsn.embedded:
        pytest.skip("only a chDB directory has an owner")
    server, settings = endpoint
    assert ch_db.dsn.path is not None
    owner = probe_engine(ch_db.dsn.path)
    assert owner is not None and owner.this_process and owner.pid == os.getpid()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    env.update({"REWARDFLOW_HOME": str(settings.home), "REWARDFLOW_CLICKHOUSE_DSN": ch_db.dsn.secret,
                "REWARDFLOW_WEB_PORT": server.url.rsplit(":", 1)[1]})
    ch_db.client.command("INSERT INTO trainer_cursors (trainer, cursor, rows, filters) VALUES ('seen', 7, 1, '')")
    code = ("import sys; from rewardflow.cli.main import main; "
            "sys.argv = ['rewardflow', 'sql', '--format', 'csv', '--database', sys.argv[1], "
            "'SELECT cursor FROM trainer_cursors']; main()")
    out = subprocess.run([sys.executable, "-c", code, ch_db.name], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ['"cursor"', "7"]
    bad = subprocess.run([sys.executable, "-c", code.replace("SELECT cursor FROM trainer_cursors", "DROP TABLE rewards"),
                          ch_db.name], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: refused") and "Traceback" not in bad.stderr
    env["REWARDFLOW_HOME"] = str(settings.home / "elsewhere")  # another user: no local token file to read
    denied = subprocess.run([sys.executable, "-c", code, ch_db.name], env=env, capture_output=True, text=True, timeout=120)
    assert denied.returncode == 2 and "refused the token" in denied.stderr and "Traceback" not in denied.stderr


@pytest.mark.parametrize("hello", ["missing", "forged"])
def test_a_process_on_the_endpoints_port_is_never_shown_the_token(endpoint: Any, hello: str) -> None:
    """Another process that answers /health as the endpoint does (it took the port first, or the reader was
    given the wrong URL) cannot prove it keeps the token, so the reader never sends it."""
    import http.server

    seen: list[str] = []

    class Squatter(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(200, {"service": "rewardflow-read", "pid": 1})

        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/hello" and hello == "forged":
                self._answer(200, {"service": "rewardflow-read", "proof": "0" * 64})
            else:
                self._answer(404, {})

        def _answer(self, status: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server, settings = endpoint
    token = grant(settings, role="owner")
    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Squatter)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{squatter.server_address[1]}"
        assert endpoint_alive(url)  # it looks like the endpoint
        with pytest.raises(AccessDenied, match="the token was not sent"):
            RemoteReader(url, token=token).query_arrow("SELECT 1")
    finally:
        squatter.shutdown()
    assert seen and not any(token in h for h in seen)
    # the endpoint that keeps the token proves it, once a reader
    remote = RemoteReader(server.url, token=token)
    assert remote.query_arrow("SELECT 1 AS x").column("x").to_pylist() == [1]
    assert remote.query_arrow("SELECT 2 AS x").column("x").to_pylist() == [2]


def test_a_reader_proves_the_endpoint_before_every_request_and_follows_no_redirect(endpoint: Any) -> None:
    """What listens on the port can change between two requests of one reader; and a redirect (from a
    proxy in front of the endpoint, say) would carry the token wherever it points."""
    import http.server

    server, settings = endpoint
    token = grant(settings)
    remote = RemoteReader(server.url, token=f"  {token}\n")  # (as a variable set with spaces would give it)
    assert remote.query_arrow("SELECT 1 AS x").column("x").to_pylist() == [1]
    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(404 if self.path == "/hello" else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    recorder = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)

    class Proxy(http.server.BaseHTTPRequestHandler):  # passes /hello on, redirects the rest to the recorder
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/hello":
                answer = post(f"{server.url}/hello", body, ctype="application/json")[1]
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                return
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{recorder.server_address[1]}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    for s in (recorder, proxy):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        with pytest.raises(AccessDenied, match="redirect"):
            RemoteReader(f"http://127.0.0.1:{proxy.server_address[1]}", token=token).query_arrow("SELECT 1")
        remote.url = f"http://127.0.0.1:{recorder.server_address[1]}"  # another process on the port, now
        with pytest.raises(AccessDenied, match="the token was not sent"):
            remote.query_arrow("SELECT 1")
    finally:
        proxy.shutdown()
        recorder.shutdown()
    assert not any(token in h for h in seen)


def test_a_relay_between_reader_and_endpoint_never_holds_the_token_nor_a_request_it_can_use(endpoint: Any) -> None:
    """A process the reader was sent to (a wrong port or URL) that passes every request on to the real
    endpoint sees signed requests only: no token, and no request it may send again or change."""
    import http.server

    server, settings = endpoint
    token = grant(settings)
    relayed: list[tuple[str, str, bytes]] = []  # (path, Authorization, body)

    class Relay(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            auth = self.headers.get("Authorization", "")
            relayed.append((self.path, auth, body))
            status, answer, _ = post(f"{server.url}{self.path}", body, ctype=self.headers.get("Content-Type", ""),
                                     authorization=auth or None)
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    relay = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Relay)
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    try:
        remote = RemoteReader(f"http://127.0.0.1:{relay.server_address[1]}", token=token)
        assert remote.query_arrow("SELECT 7 AS x").column("x").to_pylist() == [7]
    finally:
        relay.shutdown()
    assert relayed and not any(token in auth or token.encode() in body for _, auth, body in relayed)
    path, auth, body = next(r for r in relayed if r[0] == "/query")
    assert auth.startswith("RF-HMAC-SHA256 id=")

    def send(data: bytes, authorization: str) -> tuple[int, bytes]:
        return post(f"{server.url}{path}", data, ctype="application/json", authorization=authorization)[:2]

    again = send(body, auth)
    assert again[0] == 401 and b"taken before" in again[1]
    changed = send(body.replace(b"SELECT 7", b"SELECT 8"), auth)
    assert changed[0] == 401 and b"signature does not match" in changed[1]
    stale = send(body, re.sub(r"ts=[0-9]+", f"ts={int(time.time()) - 900}", auth))
    assert stale[0] == 401 and b"off this endpoint's clock" in stale[1]
    assert post(f"{server.url}{path}", body, authorization=auth)[0] == 401  # (text/plain) the content type is signed too
    assert post(f"{server.url}/query", b"SELECT 1", token)[0] == 200  # the token itself still works as a bearer


def test_the_endpoints_proof_for_any_nonce_never_passes_for_a_request_signature(endpoint: Any) -> None:
    """``/hello`` answers anyone, for any nonce, with a MAC made from the token: a request signature is made
    under another key, so asking ``/hello`` to sign a request's text gives nothing that signs it."""
    server, settings = endpoint
    token = grant(settings, role="owner")
    token_id = token.split("_")[1]
    body = json.dumps({"action": "list", "database": None}).encode()
    ts, nonce = int(time.time()), "ab" * 8
    message = signed_text("/keys", ts, nonce, "x", body)  # (short: within what /hello would take)
    assert len(message) <= 128
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert token_proof(digest, message) != request_signature(digest, "/keys", ts, nonce, "x", body)
    status, answer, _ = post(f"{server.url}/hello", json.dumps({"token_id": token_id, "nonce": message}).encode(),
                             ctype="application/json")
    assert status == 400 and b"16 to 64 lowercase hex" in answer  # (a nonce is random hex, never such a text)
    proof = token_proof(digest, message)  # what an endpoint that took it would have answered
    forged = f"RF-HMAC-SHA256 id={token_id},ts={ts},nonce={nonce},sig={proof}"
    assert post(f"{server.url}/keys", body, ctype="x", authorization=forged)[0] == 401


def test_a_busy_answer_gets_the_same_signed_request_again_never_a_new_one(endpoint: Any) -> None:
    """A reader retries a 503 or 429 with the very request it sent: a process that answers "busy" to collect
    signed copies collects one request, which the endpoint takes once."""
    import http.server

    server, settings = endpoint
    token = grant(settings)
    seen: list[str] = []

    class Busy(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/hello":  # passed on, so the reader believes it talks to the endpoint
                answer = post(f"{server.url}/hello", body, ctype="application/json")[1]
                self.send_response(200)
            else:
                seen.append(self.headers.get("Authorization", ""))
                answer = b"busy"
                self.send_response(503)
                self.send_header("Retry-After", "0.5")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    busy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=busy.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ReaderUnavailable, match="busy"):
            RemoteReader(f"http://127.0.0.1:{busy.server_address[1]}", token=token, busy_wait_s=2).query_arrow("SELECT 1")
    finally:
        busy.shutdown()
    assert len(seen) >= 3 and len(set(seen)) == 1


def test_the_endpoint_keeps_its_port_on_the_other_loopback_too(ch_db: ChDatabase) -> None:
    """``localhost`` may be ::1 or 127.0.0.1: the endpoint's port on the other one is never another process's."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    port = free_port()
    squatter = socket.socket(socket.AF_INET6)
    try:
        squatter.bind(("::1", port))
    except OSError:
        pytest.skip("no ::1 on this machine")
    squatter.listen(1)
    settings = ch_db.settings(web_port=port)
    with pytest.raises(OSError, match=f"port {port} on ::1 is taken"):
        ReadServer(ch_db.dsn, settings, "127.0.0.1")
    squatter.close()
    with ReadServer(ch_db.dsn, settings, "127.0.0.1"):
        late = socket.socket(socket.AF_INET6)
        with pytest.raises(OSError):  # and once it runs, nobody takes it there
            late.bind(("::1", port))
        late.close()


def test_an_unreachable_endpoint_is_reader_unavailable() -> None:
    with pytest.raises(ReaderUnavailable):
        RemoteReader("http://127.0.0.1:9", token="x").query_arrow("SELECT 1")


def test_a_client_that_goes_away_frees_its_query_slot(ch_db: ChDatabase) -> None:
    import http.client

    settings = ch_db.settings(read_max_queries=1)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        token = grant(settings)
        host, port = server.url.rsplit("/", 1)[-1].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/query", body=b"SELECT number FROM numbers(10000000000)",
                     headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read(65_536)  # streaming an endless result...
        assert post(f"{server.url}/query", b"SELECT 1", token)[0] == 503  # ...which holds the only slot
        conn.close()  # the client gives up
        deadline, status = time.monotonic() + 15, 503
        while status == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
            status = post(f"{server.url}/query", b"SELECT 1", token)[0]
        assert status == 200, "the abandoned query still holds its slot"


def test_a_client_that_leaves_before_the_first_batch_frees_its_query_slot(ch_db: ChDatabase) -> None:
    """An aggregation has no batch until it ends: its client leaving stops the engine's query then."""
    settings = ch_db.settings(read_max_queries=1, read_max_execution_s=60)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        token = grant(settings)
        host, port = server.url.rsplit("/", 1)[-1].rsplit(":", 1)
        sql = b"SELECT count() FROM numbers(1000000000000) WHERE sipHash64(number) = 0"
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"POST /query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
                      + b"\r\nContent-Length: " + str(len(sql)).encode() + b"\r\n\r\n" + sql)
            time.sleep(1.0)
            assert post(f"{server.url}/query", b"SELECT 1", token)[0] == 503  # the aggregation holds the slot
        began, status = time.monotonic(), 503
        while status == 503 and time.monotonic() - began < 15:
            time.sleep(0.2)
            status = post(f"{server.url}/query", b"SELECT 1", token)[0]
        assert status == 200, "the query of a client gone before its first batch still holds its slot"
        assert time.monotonic() - began < 5


def test_the_endpoint_serves_tls_with_its_certificate(ch_db: ChDatabase, tmp_path: Path) -> None:
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    settings = ch_db.settings(web_tls_certfile=cert, web_tls_keyfile=key)
    with ReadServer(ch_db.dsn, settings, "127.0.0.1", 0) as server:
        assert server.url.startswith("https://")
        remote = RemoteReader(server.url, token=grant(settings), database=ch_db.name, cafile=cert)
        assert remote.query_arrow("SELECT 1 AS x").column("x").to_pylist() == [1]
        with pytest.raises(ReaderUnavailable):  # a client that does not trust the certificate does not connect
            RemoteReader(server.url, token=grant(settings), database=ch_db.name).query_arrow("SELECT 1")


@pytest.mark.kafka
def test_rewardflow_run_serves_reads_to_a_reader_started_while_it_runs(kafka_broker: Any, tmp_path: Path) -> None:
    """``rewardflow run`` owns its chDB directory; ``rewardflow sql`` started meanwhile reads through its
    endpoint with the owner's local token, and opens nothing itself."""
    import shutil

    from tests.conftest_clickhouse import free_port

    exe = shutil.which("rewardflow", path=str(Path(sys.executable).parent)) or "rewardflow"

    home, db = tmp_path / "home", tmp_path / "chdb"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    env.update({"REWARDFLOW_HOME": str(home), "REWARDFLOW_CLICKHOUSE_DSN": f"chdb://{db}",
                "REWARDFLOW_KAFKA_BOOTSTRAP": kafka_broker.bootstrap, "REWARDFLOW_WEB_PORT": str(free_port()),
                "REWARDFLOW_TOPIC_PREFIX": f"t{os.getpid()}{int(time.time())}."})
    run = subprocess.Popen([exe, "run", "--no-worker", "--status-interval", "0"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{env['REWARDFLOW_WEB_PORT']}"
        deadline = time.monotonic() + 120
        while not endpoint_alive(url, timeout=0.5):
            assert run.poll() is None and time.monotonic() < deadline, run.stderr.read() if run.stderr else ""
            time.sleep(0.2)
        sql = subprocess.run([exe, "sql", "--format", "csv",
                              "SELECT count() AS n FROM rewards"], env=env, capture_output=True, text=True, timeout=120)
        assert sql.returncode == 0, sql.stderr
        assert sql.stdout.split() == ['"n"', "0"]
    finally:
        run.terminate()
        run.wait(60)
