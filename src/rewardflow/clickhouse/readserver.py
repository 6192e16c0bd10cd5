"""The chDB owner's read endpoint: lets other processes read while this one owns the engine.

chDB allows one process per directory and has no server mode, so the process
that owns it (the worker running the sink) serves read-only queries over
loopback HTTP; :func:`~.connect.open_reader` in any other process falls back
to it. Protocol: see :mod:`.remote`.

Guarantees: ``/query`` runs only statements that pass
:func:`~.readonly.check_read_only`, and runs them with ``readonly = 1``;
``/cursor`` can only append a row to ``trainer_cursors``. The server binds the
host it is given (default loopback) and has no authentication, so never bind
it to a public interface. Threads: one daemon thread accepts, one thread per
request; clients are cached per database and serialise their own calls.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pyarrow as pa

from rewardflow.clickhouse.connect import local_reader
from rewardflow.clickhouse.ddl import quote_ident
from rewardflow.clickhouse.dsn import Dsn
from rewardflow.clickhouse.errors import QueryError
from rewardflow.clickhouse.readers import LocalReader
from rewardflow.clickhouse.readonly import ReadOnlyViolation
from rewardflow.clickhouse.remote import ARROW_STREAM, SERVICE

log = logging.getLogger(__name__)


class ReadServer:
    """Serve ``/health``, ``/query`` and ``/cursor`` for ``dsn`` on ``host:port`` (port 0 = any free)."""

    def __init__(self, dsn: Dsn, host: str = "127.0.0.1", port: int = 0) -> None:
        self.dsn = dsn
        self._readers: dict[str | None, LocalReader] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ReadServer:
        """Start serving in a daemon thread; returns immediately."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="rewardflow-read", daemon=True)
        self._thread.start()
        log.info("read endpoint for %s listening on %s", self.dsn.masked(), self.url)
        return self

    def stop(self) -> None:
        """Stop accepting, wait for the accept loop to end, close cached clients. Idempotent."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()

    def reader(self, database: str | None) -> LocalReader:
        """The cached in-process reader of ``database`` (created on first use)."""
        if database is not None:
            quote_ident(database)  # refuse anything but a plain name
        with self._lock:
            if database not in self._readers:
                self._readers[database] = local_reader(self.dsn.with_database(database))
            return self._readers[database]


def _handler_for(server: ReadServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # body ends at close: lets /query stream

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("read endpoint: " + format, *args)

        def _reply(self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path != "/health":
                self._reply(404, b"not found")
                return
            self._reply(200, json.dumps({"service": SERVICE, "pid": os.getpid()}).encode(), "application/json")

        def do_POST(self) -> None:
            try:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                is_json = self.headers.get("Content-Type", "").startswith("application/json")
                body: dict[str, Any] = json.loads(raw) if is_json else {"sql": raw.decode()}  # curl -d 'SELECT 1'
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                reader = server.reader(body.get("database"))
                if self.path == "/query":
                    self._query(reader, str(body["sql"]), dict(body.get("parameters") or {}))
                elif self.path == "/cursor":
                    reader.advance_cursor(str(body["trainer"]), int(body["cursor"]), int(body["rows"]), str(body["filters"]))
                    self._reply(204, b"")
                else:
                    self._reply(404, b"not found")
            except ReadOnlyViolation as exc:
                self._reply(403, str(exc).encode())
            except (QueryError, ValueError, KeyError, TypeError) as exc:
                self._reply(400, str(exc).encode())
            except Exception as exc:  # noqa: BLE001 - report, keep serving
                log.exception("read endpoint failed")
                self._reply(500, f"{type(exc).__name__}: {exc}".encode())

        def _query(self, reader: LocalReader, sql: str, parameters: dict[str, Any]) -> None:
            batches = reader.stream_arrow(sql, parameters)
            first = next(batches, None)
            schema = first.schema if first is not None else reader.query_arrow(sql, parameters).schema
            self.send_response(200)
            self.send_header("Content-Type", ARROW_STREAM)
            self.end_headers()
            with pa.ipc.new_stream(self.wfile, schema) as writer:
                if first is not None:
                    writer.write_batch(first)
                for batch in batches:
                    writer.write_batch(batch)

    return Handler
