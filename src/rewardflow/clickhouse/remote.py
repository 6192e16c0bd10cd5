"""A :class:`~.readers.Reader` that reads through the chDB owner's HTTP endpoint.

Wire protocol (served by :class:`~.readserver.ReadServer`, loopback only):

* ``GET /health`` -> ``{"service": "rewardflow-read", "pid": N}``
* ``POST /query`` ``{"sql", "parameters", "database"}`` (JSON; or the bare SQL
  as a non-JSON body, e.g. ``curl -d 'SELECT 1' host:port/query``) -> an Arrow IPC
  *stream* (``application/vnd.apache.arrow.stream``); 403 + message when the
  statement is not read-only, 400 + ClickHouse's message when it fails.
* ``POST /cursor`` ``{"trainer", "cursor", "rows", "filters", "database"}`` -> 204.

Blocking: every call is synchronous HTTP with ``timeout`` seconds per socket
operation; a refused connection raises :class:`~.errors.ReaderUnavailable`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import IO, Any

import pyarrow as pa

from rewardflow.clickhouse.errors import QueryError, ReaderUnavailable
from rewardflow.clickhouse.readonly import ReadOnlyViolation, check_read_only

SERVICE = "rewardflow-read"
ARROW_STREAM = "application/vnd.apache.arrow.stream"


def endpoint_alive(url: str, timeout: float = 2.0) -> bool:
    """True if a rewardflow read endpoint answers ``GET /health`` at ``url`` within ``timeout``."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return bool(json.loads(resp.read()).get("service") == SERVICE)
    except (OSError, ValueError):
        return False


class RemoteReader:
    """Reads through the owner's endpoint at ``url`` (``http://host:port``)."""

    def __init__(self, url: str, *, database: str | None = None, timeout: float = 300.0) -> None:
        self.url = url
        self.database = database
        self.timeout = timeout
        self.description = f"{url} (read endpoint of the chDB owner)"

    def _post(self, path: str, body: Mapping[str, Any]) -> IO[bytes]:
        data = json.dumps({**body, "database": self.database}).encode()
        req = urllib.request.Request(
            f"{self.url}{path}", data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            resp: IO[bytes] = urllib.request.urlopen(req, timeout=self.timeout)
            return resp
        except urllib.error.HTTPError as exc:
            message = exc.read().decode("utf-8", "replace").strip() or exc.reason
            if exc.code == 403:
                raise ReadOnlyViolation(message) from None
            raise QueryError(message) from None
        except OSError as exc:
            raise ReaderUnavailable(f"read endpoint {self.url} unreachable: {exc}") from None

    def stream_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None) -> Iterator[pa.RecordBatch]:
        statement = check_read_only(sql)
        with self._post("/query", {"sql": statement, "parameters": dict(parameters or {})}) as resp:
            try:
                reader = pa.ipc.open_stream(resp)
            except pa.ArrowInvalid:
                return  # empty body: a result without rows or schema
            yield from reader

    def query_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        statement = check_read_only(sql)
        with self._post("/query", {"sql": statement, "parameters": dict(parameters or {})}) as resp:
            return pa.ipc.open_stream(resp).read_all()

    def advance_cursor(self, trainer: str, cursor: int, rows: int, filters: str) -> None:
        with self._post("/cursor", {"trainer": trainer, "cursor": cursor, "rows": rows, "filters": filters}):
            pass

    def close(self) -> None:
        return None
