"""The chDB owner's read endpoint: uvicorn serving :mod:`.app` in a thread of the owning process.

chDB allows one process per directory and has no server mode, so the process
that owns it (the sink of ``rewardflow run``) serves reads for everyone else;
:func:`~rewardflow.clickhouse.connect.open_reader` in any other process uses it.

Bounds: at most ``read_max_connections`` connections (more get 503), at most
``read_max_client_connections`` of one client (an address; all of loopback; an IPv6 /64: more
are closed at once), each closed
after ``read_idle_timeout_s`` without a request (also one that never sends one:
uvicorn alone waits for a first request forever), closed when a request it began
is not all in (its head within ``read_idle_timeout_s``, head and body within
``read_request_timeout_s``): uvicorn alone waits forever for a client that sends a
byte now and then, and closed when its response waits on the client, who takes none of
it, for ``read_send_timeout_s`` (which stops the response's query and frees its slot). asyncio serves connections without a thread each. TLS with
``web_tls_certfile`` / ``web_tls_keyfile``; :class:`~rewardflow.settings.Settings`
refuses a non-loopback ``web_host`` without TLS unless ``web_insecure_public`` says a
proxy in front does it.

Contract: the constructor binds the socket (``OSError`` with the address when it
cannot); :meth:`ReadServer.start` returns once the server accepts connections;
:meth:`ReadServer.stop` is idempotent and waits for the server thread to end.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from typing import Any

import uvicorn

from rewardflow.boundedhttp import bounded_protocol
from rewardflow.clickhouse.dsn import Dsn
from rewardflow.readapi.app import create_app
from rewardflow.readapi.service import ReadService
from rewardflow.readapi.stream import OneLineCuts
from rewardflow.readapi.tokens import ensure_local_token
from rewardflow.settings import Settings

log = logging.getLogger(__name__)


def _twin_loopback(host: str, port: int, explicit: bool) -> socket.socket | None:
    """On loopback, the same port of the other address family's loopback, bound and never listening, so
    no other process serves readers there (``localhost`` may be either). None when that family has no
    loopback; ``OSError`` when another process holds that port and ``explicit`` (a port chosen, not any)."""
    twin = {"127.0.0.1": (socket.AF_INET6, "::1"), "::1": (socket.AF_INET, "127.0.0.1")}.get(host)
    if twin is None:
        return None
    sock = socket.socket(twin[0], socket.SOCK_STREAM)
    try:
        sock.bind((twin[1], port))
        return sock
    except OSError as exc:
        sock.close()
        if explicit and exc.errno == errno.EADDRINUSE:
            raise OSError(exc.errno, f"port {port} on {twin[1]} is taken: a process other than this endpoint could "
                                     "serve its readers there (set REWARDFLOW_WEB_PORT)") from None
        return None


class ReadServer:
    """Serve the read endpoint of ``dsn`` on ``host:port`` (default: ``web_host`` / ``web_port``; port 0 = any)."""

    def __init__(self, dsn: Dsn, settings: Settings, host: str | None = None, port: int | None = None) -> None:
        self.dsn, self.settings = dsn, settings
        self.host = host if host is not None else settings.web_host
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY on its connections
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((self.host, settings.web_port if port is None else port))
        except OSError as exc:
            self._sock.close()
            raise OSError(exc.errno, f"cannot listen on {self.host}:{settings.web_port if port is None else port}: "
                                     f"{exc.strerror} (another rewardflow on this port? set REWARDFLOW_WEB_PORT)") from None
        self._sock.listen(1024)
        try:
            self._twin = _twin_loopback(self.host, self._sock.getsockname()[1], explicit=bool(
                settings.web_port if port is None else port))
        except OSError:
            self._sock.close()
            raise
        self.service = ReadService(dsn, settings)
        tls = settings.web_tls_certfile is not None
        protocol = bounded_protocol("REWARDFLOW_READ", head_timeout=settings.read_idle_timeout_s,
                                    request_timeout=settings.read_request_timeout_s,
                                    send_timeout=settings.read_send_timeout_s,
                                    per_client=settings.read_max_client_connections,
                                    max_connections=settings.read_max_connections)
        self._config = uvicorn.Config(
            create_app(self.service), http=protocol, lifespan="off", log_level="warning",
            access_log=False, limit_concurrency=settings.read_max_connections,
            timeout_keep_alive=max(1, int(settings.read_idle_timeout_s)),
            ssl_certfile=str(settings.web_tls_certfile) if tls else None,
            ssl_keyfile=str(settings.web_tls_keyfile) if tls else None,
        )
        self._server = uvicorn.Server(self._config)
        errors = logging.getLogger("uvicorn.error")  # (after the config, which sets up uvicorn's loggers)
        if not any(isinstance(f, OneLineCuts) for f in errors.filters):
            errors.addFilter(OneLineCuts())
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        host = f"[{host}]" if ":" in str(host) else host
        scheme = "https" if self.settings.web_tls_certfile is not None else "http"
        return f"{scheme}://{host}:{port}"

    def start(self, timeout: float = 10.0) -> ReadServer:
        """Start serving in a daemon thread; returns once it accepts connections."""
        ensure_local_token(self.settings.home)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="rewardflow-read", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the read endpoint did not start on {self.url}")
            time.sleep(0.01)
        log.info("read endpoint for %s listening on %s", self.dsn.masked(), self.url)
        return self

    def stop(self) -> None:
        """Stop accepting, end the server thread, close the readers. Idempotent."""
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=30)
            self._thread = None
        self._sock.close()
        if self._twin is not None:
            self._twin.close()
        self.service.close()

    def __enter__(self) -> ReadServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
