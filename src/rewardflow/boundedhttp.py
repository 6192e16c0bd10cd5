"""HTTP/1.1 serving with bounds on what one connection can hold: uvicorn's protocols, with deadlines.

uvicorn alone waits forever for a client that opens a connection and sends nothing, or a byte now and
then, and (with httptools) parses a request head of any size. :class:`BoundedProtocol` (h11) and
:class:`BoundedHttpToolsProtocol` (httptools, for a server of many small requests) close such
connections; each server gives one its own settings with :func:`bounded_protocol`, and bounds its
connections in all with uvicorn's ``limit_concurrency`` (more get 503).

Contract: the protocol runs on the server's event loop and never blocks; a connection it closes gets
no answer (a request head over 16 KiB gets 400).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)
MAX_HEAD_BYTES = 16_384  # a request head's bytes, as h11's default
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def client_of(address: str) -> str:
    """The client an address counts as for a server's connections per client: the address itself, but one
    client for all of IPv4 loopback (``127.0.0.0/8``, every address of it this very host) and one for each
    IPv6 ``/64`` (what one host is given to pick its addresses from). An IPv6 address that carries an IPv4
    one (mapped; NAT64, Teredo, 6to4 when that one is global) counts as that IPv4 address; a link-local one as itself, with its
    interface (every link has the same /64)."""
    bare, _, scope = address.partition("%")
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        tunnelled = ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if tunnelled is None and ip in _NAT64:
            tunnelled = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        carried = ip.ipv4_mapped or (tunnelled if tunnelled is not None and tunnelled.is_global else None)
        if carried is not None:
            ip = carried
    if isinstance(ip, ipaddress.IPv4Address):
        return "127.0.0.0/8" if ip.is_loopback else str(ip)
    if ip.is_loopback:
        return "127.0.0.0/8"
    if ip.is_link_local:
        return f"{ip}%{scope}" if scope else str(ip)
    return str(ipaddress.IPv6Network((ip, 64), strict=False))


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class _Bounds:
    """The bounds of a connection, whatever parses its requests: the parser's subclass tells when a request
    has begun (:meth:`_began`), whether its head (:meth:`_head_open`) and the whole request
    (:meth:`_request_open`) are still coming in, and when it is all in (:meth:`_disarm`)."""

    head_timeout = 5.0
    request_timeout = 30.0
    send_timeout = 60.0
    per_client = 64
    max_connections = 0  # 0: uvicorn's limit_concurrency alone
    open_by_client: dict[str, int] = {}  # (each server's subclass has its own)
    settings = "REWARDFLOW_READ"
    # (set by the uvicorn protocol this is mixed into)
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: tuple[str, int] | None
    connections: set[Any]  # (uvicorn's server state: every open connection of the server)
    timeout_keep_alive: int
    timeout_keep_alive_task: asyncio.TimerHandle | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._idle)
        self._deadlines: list[asyncio.TimerHandle] = []
        self._stalled: asyncio.TimerHandle | None = None
        self._address = client_of(str(self.client[0])) if self.client else ""
        held = self.open_by_client[self._address] = self.open_by_client.get(self._address, 0) + 1
        if held > self.per_client:
            log.info("closing a connection from %s: it holds %d already (%s_MAX_CLIENT_CONNECTIONS)",
                     self._address, held - 1, self.settings)
            transport.close()
        elif self.max_connections and len(self.connections) > self.max_connections:
            # at once, not once a request head is in (as uvicorn's limit_concurrency answers): a connection
            # that never sends one would hold an open file until its deadline
            log.debug("refusing a connection from %s: %d open (%s_MAX_CONNECTIONS)", self._address,
                      len(self.connections) - 1, self.settings)
            self.transport.write(_BUSY)
            self.transport.close()

    def _idle(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def pause_writing(self) -> None:
        """The transport's buffer is full: the client must take some of it within :attr:`send_timeout`."""
        super().pause_writing()  # type: ignore[misc]
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.send_timeout, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _not_reading(self) -> None:
        self._stalled = None
        if not self.transport.is_closing():
            log.info("closing a connection from %s that took none of its response for %.0f s", self.client,
                     self.send_timeout)
            self.transport.abort()  # (close() would wait, forever, to write out the buffer the client does not take)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        left = self.open_by_client.get(self._address, 1) - 1
        if left > 0:
            self.open_by_client[self._address] = left
        else:
            self.open_by_client.pop(self._address, None)
        super().connection_lost(exc)  # type: ignore[misc]

    def _began(self) -> None:
        """A request has begun (a byte of it is in): its head and the whole of it have their deadlines."""
        if not self._deadlines:
            self._deadlines = [self.loop.call_later(self.head_timeout, self._too_slow, True),
                               self.loop.call_later(self.request_timeout, self._too_slow, False)]

    def _disarm(self) -> None:
        for handle in self._deadlines:
            handle.cancel()
        self._deadlines = []

    def _head_open(self) -> bool:
        raise NotImplementedError

    def _request_open(self) -> bool:
        raise NotImplementedError

    def _too_slow(self, head: bool) -> None:
        if (self._head_open() if head else self._request_open()) and not self.transport.is_closing():
            log.info("closing a connection from %s whose request was not all in after %.0f s", self.client,
                     self.head_timeout if head else self.request_timeout)
            self.transport.close()


class BoundedProtocol(_Bounds, H11Protocol):
    """uvicorn's h11 protocol with the bounds of :class:`_Bounds` (h11 refuses a request head over 16 KiB).
    Build a server's own with :func:`bounded_protocol`; :attr:`settings` names its settings in the logs."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_request()  # (a pipelined request may have begun meanwhile)

    def _watch_request(self) -> None:
        state = self.conn.their_state
        if state is h11.SEND_BODY or (state is h11.IDLE and bool(self.conn.trailing_data[0])):
            self._began()
        else:
            self._disarm()

    def _head_open(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _request_open(self) -> bool:
        return self.conn.their_state in (h11.IDLE, h11.SEND_BODY)


class BoundedHttpToolsProtocol(_Bounds, HttpToolsProtocol):
    """uvicorn's httptools protocol (its C parser: about half the CPU of h11 a request) with the bounds of
    :class:`_Bounds`, and a request head over :data:`MAX_HEAD_BYTES` refused with 400 (httptools alone
    bounds neither): counted as the parser hands it over (request target, each header with its separators),
    so no read, however large, carries more of it, and by the bytes read while it is due, since the parser
    keeps an unfinished header to itself (at most one read, up to 256 KiB, beyond the limit)."""

    _head_bytes = -1  # the head's bytes handed over so far; -1: no head coming in
    _read_in_head = 0  # bytes read while a head was due (the parser keeps an unfinished header to itself)
    _open = False  # a request has begun and is not all in
    _stray = False  # bytes came with no request begun (blank lines, which the parser skips): a head is due

    def data_received(self, data: bytes) -> None:
        if not self._open:
            self._stray = True
        if not self._open or self._head_bytes >= 0:
            self._read_in_head += len(data)
        super().data_received(data)
        if self._head_open() and self._read_in_head > MAX_HEAD_BYTES and not self.transport.is_closing():
            self.send_400_response(f"request head over {MAX_HEAD_BYTES} bytes")
        elif self._open or self._stray:
            self._began()  # armed only for a request that did not come in whole: most do, and cost no timer

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes, self._open, self._stray = 0, True, False

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > MAX_HEAD_BYTES:  # the parser stops, and uvicorn answers 400 and closes
            raise ValueError(f"request head over {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        self._head_bytes, self._read_in_head = -1, 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._open = False
        self._disarm()

    def _head_open(self) -> bool:
        return self._head_bytes >= 0 or self._stray

    def _request_open(self) -> bool:
        return self._open or self._stray


def bounded_protocol(settings: str, *, head_timeout: float, request_timeout: float, send_timeout: float,
                     per_client: int, max_connections: int = 0, parser: str = "h11") -> type[asyncio.Protocol]:
    """A bounded protocol of one server (``parser``: ``h11``, or ``httptools`` where the CPU a request matters):
    its deadlines, its connections per client (counted apart from every other server's) and in all (beyond
    ``max_connections`` a new one gets 503 and is closed at once; 0: none), and the prefix of its settings'
    variables, for the logs."""
    base = BoundedHttpToolsProtocol if parser == "httptools" else BoundedProtocol
    return cast(type[asyncio.Protocol], type("BoundedProtocol", (base,), {
        "head_timeout": head_timeout, "request_timeout": request_timeout, "send_timeout": send_timeout,
        "per_client": per_client, "max_connections": max_connections, "open_by_client": {}, "settings": settings}))
