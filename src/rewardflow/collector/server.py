"""The collector process: uvicorn serving :mod:`.app`, the key cache and the acking producer.

:class:`Collector` binds ``collect_host:collect_port`` in its constructor (an ``OSError`` names the
address), then either :meth:`serve` blocks in the calling thread (``rewardflow collect``: uvicorn
handles SIGINT/SIGTERM, lets requests in flight finish, then the producer is flushed) or
:meth:`start` serves from a daemon thread (``rewardflow run --collect``, the demo, tests) until
:meth:`stop`. TLS with ``web_tls_certfile`` / ``web_tls_keyfile``.

Bounds (:mod:`rewardflow.boundedhttp`): at most ``collect_max_connections`` connections (more get
503), and ``collect_max_client_connections`` of one client; a connection idle for
``collect_idle_timeout_s`` is closed, as is one whose request head is not in within it or whose whole
request is not in within ``collect_request_timeout_s``; a request head over 16 KiB gets 400. None
of these needs a key: they hold before the request is read.

Keys come from ``load_keys`` (see :func:`keys_from_client`, :func:`keys_from_reader`), reloaded
every ``collect_key_refresh_s``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from rewardflow.boundedhttp import bounded_protocol
from rewardflow.collector.app import create_app
from rewardflow.collector.limits import EdgeMetrics
from rewardflow.collector.kafka import AckingProducer
from rewardflow.collector.keys import LATEST_SQL, IngestKeys, KeyCache
from rewardflow.kafka import topics
from rewardflow.settings import Settings

log = logging.getLogger(__name__)
KeyTable = dict[str, tuple[str, str]]


def keys_from_client(client: Any) -> Callable[[], KeyTable]:
    """Load the active keys through a ClickHouse client (a server, or the chDB engine of this process)."""
    return IngestKeys(client).table


def keys_from_reader(reader: Any) -> Callable[[], KeyTable]:
    """Load the active keys through a :class:`~rewardflow.clickhouse.readers.Reader` (e.g. a chDB owner's endpoint)."""
    def load() -> KeyTable:
        rows = reader.query_arrow(LATEST_SQL).to_pylist()
        return {r["key_id"]: (r["secret_sha256"], r["org_id"]) for r in rows if not r["revoked"]}
    return load


def listen(host: str, port: int) -> socket.socket:
    """The edge's listening socket; ``OSError`` names the address when it is taken."""
    # IPPROTO_TCP: asyncio sets TCP_NODELAY only on connections of a socket made with it; without,
    # every response waits ~40 ms for the client's delayed ACK (headers and body are two writes)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror} (another collector on "
                                 "this port? set REWARDFLOW_COLLECT_PORT)") from None
    sock.listen(1024)
    return sock


class Collector:
    def __init__(self, settings: Settings, load_keys: Callable[[], KeyTable], host: str | None = None,
                 port: int | None = None, sock: socket.socket | None = None) -> None:
        """``sock``: serve on this listening socket (shared by several processes) instead of binding one."""
        self.settings = settings
        self.host = settings.collect_host if host is None else host
        port = settings.collect_port if port is None else port
        self._sock = sock if sock is not None else listen(self.host, port)
        self.keys = KeyCache(load_keys, settings.collect_key_refresh_s)
        self.metrics = EdgeMetrics()
        self.producer = AckingProducer(settings.kafka_client_config(), settings.topic(topics.RAW),
                                       settings.collect_ack_timeout_s, max_record_bytes=settings.max_record_bytes,
                                       max_batch_events=settings.max_batch_events)
        tls = settings.web_tls_certfile is not None
        protocol = bounded_protocol("REWARDFLOW_COLLECT", head_timeout=settings.collect_idle_timeout_s,
                                    request_timeout=settings.collect_request_timeout_s, send_timeout=60.0,
                                    per_client=settings.collect_max_client_connections or settings.collect_max_connections,
                                    max_connections=settings.collect_max_connections,
                                    parser="httptools")  # its C parser: the edge's requests are many and small
        self._server = uvicorn.Server(uvicorn.Config(
            create_app(settings, self.keys, self.producer, self.metrics), http=protocol, lifespan="off",
            log_level="warning", access_log=False, limit_concurrency=settings.collect_max_connections,
            timeout_keep_alive=max(1, int(settings.collect_idle_timeout_s)),
            timeout_graceful_shutdown=int(settings.collect_ack_timeout_s) + 5,
            proxy_headers=False,  # nothing reads the client's address: keys decide
            ssl_certfile=str(settings.web_tls_certfile) if tls else None,
            ssl_keyfile=str(settings.web_tls_keyfile) if tls else None,
        ))
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"{'https' if self.settings.web_tls_certfile is not None else 'http'}://{host}:{port}"

    def serve(self) -> None:
        """Serve in this thread until SIGINT/SIGTERM; then finish requests in flight and flush Kafka."""
        self.keys.start()
        log.info("collector listening on %s (keys reloaded every %.0f s)", self.url, self.settings.collect_key_refresh_s)
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self._close()

    def start(self, timeout: float = 10.0) -> Collector:
        """Serve from a daemon thread; returns once it accepts connections."""
        self.keys.start()
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="rewardflow-collector", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the collector did not start on {self.url}")
            time.sleep(0.01)
        log.info("collector listening on %s", self.url)
        return self

    def stop(self) -> None:
        """Stop accepting, let requests in flight finish, flush Kafka. Idempotent."""
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=self.settings.collect_ack_timeout_s + 10)
            self._thread = None
        self._close()

    def _close(self) -> None:
        self.keys.stop()
        if not self._closed:
            self._closed = True
            self._sock.close()  # (uvicorn may have closed it already)
            left = self.producer.close()
            if left:
                log.warning("collector stopped with %d records unacknowledged (their requests got 503)", left)

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
