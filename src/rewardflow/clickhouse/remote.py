"""A :class:`~.readers.Reader` that reads through the chDB owner's HTTP endpoint.

Wire protocol (served by :mod:`rewardflow.readapi`):

* ``GET /health`` -> ``{"service": "rewardflow-read", "pid": N}`` (no token needed)
* ``POST /hello`` ``{"token_id", "nonce"}`` -> ``{"service", "proof"}`` (no token needed): before each
  request that carries its token, a reader has the endpoint prove it keeps that token
  (:func:`token_proof`), so a process that took the endpoint's port is never shown it.
* ``POST /query`` ``{"sql", "parameters", "database"}`` (JSON; or the bare SQL
  as a non-JSON body, e.g. ``curl -H "Authorization: Bearer $T" -d 'SELECT 1' host:port/query``)
  -> an Arrow IPC *stream* (``application/vnd.apache.arrow.stream``).
* ``POST /cursor`` ``{"trainer", "cursor", "rows", "filters", "database"}`` -> 204.
* ``POST /keys`` and ``POST /checkpoints`` (the owner's token only): ingestion keys and checkpoint
  registrations, JSON in and out (:mod:`rewardflow.readapi.app`).

Every request but ``/health`` and ``/hello`` carries the token's authority: a reader signs each
request with it (``Authorization: RF-HMAC-SHA256 …``, :func:`request_signature`) and never sends
the token; ``Authorization: Bearer <token>`` (``curl``) is accepted too
(:mod:`rewardflow.readapi.tokens`). Statuses: 401 no or bad token, a signature that does not match or
comes again, or a request time over 5 minutes off the endpoint's clock; 403 a
statement that is not a read (body ``refused: …``) or a role that may not do
this; 400 ClickHouse's message or a bad cursor; 409 a registration that contradicts the
registry (:class:`~.errors.WriteRefused`); 413 a body over the limit; 503
with ``Retry-After`` when the endpoint runs as many queries as it may, 429 with
``Retry-After`` when the token runs as many as its share.

Blocking: every call is synchronous HTTP with ``timeout`` seconds per socket operation; the
``/hello`` before each request ends within ``hello_timeout_s`` (30 s) in all. A 503 or 429 is
retried after its ``Retry-After`` for up to ``busy_wait_s`` in all, then raises
:class:`~.errors.ReaderUnavailable`, as a refused connection does.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import math
import re
import secrets
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, NoReturn

import pyarrow as pa

from rewardflow.clickhouse.errors import AccessDenied, QueryError, ReaderUnavailable, WriteRefused
from rewardflow.clickhouse.readers import CursorError
from rewardflow.clickhouse.readonly import ReadOnlyViolation

SERVICE = "rewardflow-read"
JSON_TYPE = "application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
LOCAL_TOKEN_FILE = "read.token"
"""Under ``$REWARDFLOW_HOME``: the owner's token for readers of the same OS user (written by the endpoint)."""


def read_local_token(home: Path) -> str | None:
    """The local owner token, or None when there is none or this user may not read it."""
    try:
        return (home / LOCAL_TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def _context(url: str, cafile: Path | None) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=str(cafile) if cafile else None) if url.startswith("https:") else None


_TOKEN_ID = re.compile(r"^rfr_([0-9a-f]{12})_")
_MAX_ANSWER = 16 * 1024**2  # the most bytes of a JSON answer a reader takes (of an error's message: 64 KiB)


SIGNED = "RF-HMAC-SHA256"
"""The ``Authorization`` scheme of a signed request: ``RF-HMAC-SHA256 id=<token id>,ts=<unix seconds>,
nonce=<hex>,sig=<hex>`` (:func:`request_signature`)."""


def _key(token_sha256: str, purpose: str) -> bytes:
    """A key of its own for each use of a token's SHA-256 (hex): what one use computes never passes for
    another's (a ``/hello`` proof, which the endpoint gives anyone for any nonce, is no request signature)."""
    return hmac.new(token_sha256.encode(), f"rewardflow {purpose}".encode(), hashlib.sha256).digest()


def signed_text(route: str, ts: int, nonce: str, content_type: str, body: bytes) -> str:
    """What a request signature covers: the scheme, the route (``/query``), the time, a nonce, the
    content type and the body's SHA-256, a line each."""
    return f"{SIGNED}\n{route}\n{ts}\n{nonce}\n{content_type}\n{hashlib.sha256(body).hexdigest()}"


def request_signature(token_sha256: str, route: str, ts: int, nonce: str, content_type: str, body: bytes) -> str:
    """What a signed request carries instead of its token: HMAC-SHA256 of :func:`signed_text` under the
    token's signing key (:func:`_key`). Whoever sees it (a process that relays the reader's requests)
    learns nothing of the token and cannot use it for another request; the endpoint takes it once."""
    message = signed_text(route, ts, nonce, content_type, body)
    return hmac.new(_key(token_sha256, "request signature"), message.encode(), hashlib.sha256).hexdigest()


def token_proof(token_sha256: str, nonce: str) -> str:
    """The endpoint's proof that it keeps a token: HMAC-SHA256 of ``nonce`` under the token's proof key
    (:func:`_key`, from its SHA-256, hex). The token store keeps that digest, and only the token's
    holder can compute it otherwise."""
    return hmac.new(_key(token_sha256, "endpoint proof"), nonce.encode(), hashlib.sha256).hexdigest()


def endpoint_alive(url: str, timeout: float = 2.0, cafile: Path | None = None) -> bool:
    """True if a rewardflow read endpoint answers ``GET /health`` at ``url`` within ``timeout``."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout, context=_context(url, cafile)) as resp:
            return bool(json.loads(resp.read(4096)).get("service") == SERVICE)
    except (OSError, ValueError):
        return False


class RemoteReader:
    """Reads through the owner's endpoint at ``url`` (``http(s)://host:port``) with ``token``, signing each
    request with it (a token not of the endpoint's form is sent as a bearer token)."""

    def __init__(self, url: str, *, token: str | None, database: str | None = None, timeout: float = 300.0,
                 cafile: Path | None = None, busy_wait_s: float = 10.0, hello_timeout_s: float = 30.0) -> None:
        self.url = url
        self.token = token.strip() if token else token  # (the endpoint strips it too: the proof must see the same)
        self.database = database
        self.timeout = timeout
        self.busy_wait_s = busy_wait_s
        self.hello_timeout_s = min(hello_timeout_s, timeout)
        self.description = f"{url} (read endpoint of the chDB owner)"
        self._ssl = _context(url, cafile)
        # (redirects are not followed: urllib would carry the token to wherever one points)
        self._open = urllib.request.build_opener(_NoRedirects(), urllib.request.HTTPSHandler(context=self._ssl)).open

    def _prove(self, token: str) -> None:
        """Have the endpoint prove it keeps ``token`` (``POST /hello``), before every request that carries
        it (each is a connection of its own, and what listens on the port may have changed); raises
        :class:`AccessDenied` when it cannot. A token not of the endpoint's form is sent as is (the endpoint
        refuses it; there is nothing to take)."""
        match = _TOKEN_ID.match(token)
        if match is None:
            return
        nonce = secrets.token_hex(16)
        try:  # (a certificate that does not verify is an OSError and a ValueError both)
            answer = self._hello(json.dumps({"token_id": match.group(1), "nonce": nonce}).encode())
        except (OSError, http.client.HTTPException) as exc:
            raise ReaderUnavailable(f"read endpoint {self.url} unreachable or silent: {exc or type(exc).__name__} "
                                    f"(the token was not sent)") from None
        try:
            proof = None if answer is None else json.loads(answer).get("proof")
        except (ValueError, AttributeError):
            proof = None
        want = token_proof(hashlib.sha256(token.encode()).hexdigest(), nonce)
        if not isinstance(proof, str) or not hmac.compare_digest(proof, want):
            raise AccessDenied(f"{self.url} did not prove it is the read endpoint that keeps this token (revoked, "
                               "another process on its port, or another home's endpoint); the token was not sent")

    def _authorization(self, route: str, content_type: str, body: bytes) -> str:
        """The ``Authorization`` of one request, kept for its retries: signed (:func:`request_signature`)
        for a token of the endpoint's form, which then never leaves the reader; the bearer token otherwise
        (the endpoint refuses it, having no such token)."""
        token = self.token or ""
        match = _TOKEN_ID.match(token)
        if match is None:
            return f"Bearer {token}"
        ts, nonce = int(time.time()), secrets.token_hex(16)
        sig = request_signature(hashlib.sha256(token.encode()).hexdigest(), route, ts, nonce, content_type, body)
        return f"{SIGNED} id={match.group(1)},ts={ts},nonce={nonce},sig={sig}"

    def _hello(self, body: bytes) -> bytes | None:
        """``POST /hello`` and its answer's body (at most 4 KiB; None for a status other than 200), all of
        it within ``hello_timeout_s``: the connection is cut then, so a server that trickles its answer
        cannot hold the reader (a socket timeout alone counts each read apart). Through a proxy the
        environment names for the URL, the limit holds for each read only. No redirect is followed."""
        parts = urllib.parse.urlsplit(self.url)
        limit = self.hello_timeout_s
        if parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(parts.hostname or ""):
            req = urllib.request.Request(f"{self.url}/hello", body, {"Content-Type": "application/json"}, method="POST")
            try:  # through the proxy the environment names, as every other request (each read within the limit)
                with self._open(req, timeout=limit) as resp:
                    return bytes(resp.read(4096))
            except urllib.error.HTTPError as exc:
                exc.close()
                return None
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=limit, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=limit)
        timer = threading.Timer(limit, _cut, (conn,))
        timer.daemon = True
        timer.start()
        try:
            conn.request("POST", f"{parts.path.rstrip('/')}/hello", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.read(4096) if resp.status == 200 else None
        finally:
            timer.cancel()
            conn.close()

    def _post(self, path: str, body: Mapping[str, Any]) -> IO[bytes]:
        data = json.dumps({**body, "database": self.database}).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method="POST",
                                     headers={"Content-Type": JSON_TYPE})
        if self.token:  # (one signature for every attempt: the endpoint takes the request once, whoever resends it)
            req.add_header("Authorization", self._authorization(path, JSON_TYPE, data))
        give_up = time.monotonic() + self.busy_wait_s
        while True:
            if self.token:
                self._prove(self.token)
            try:
                resp: IO[bytes] = self._open(req, timeout=self.timeout)
                return resp
            except urllib.error.HTTPError as exc:
                retry = _retry_after(exc) if exc.code in (429, 503) else None
                if retry is None or time.monotonic() + retry > give_up:
                    self._raise(exc, path)
                exc.close()
                time.sleep(retry)
            except OSError as exc:
                raise ReaderUnavailable(f"read endpoint {self.url} unreachable: {exc}") from None

    def _raise(self, exc: urllib.error.HTTPError, path: str) -> NoReturn:
        """The endpoint's answer ``exc`` to a request of ``path``, as the reader's exceptions."""
        message = exc.read(64 * 1024).decode("utf-8", "replace").strip() or str(exc.reason)
        if exc.code == 401:
            raise AccessDenied(f"the read endpoint {self.url} refused the token: {message}") from None
        if exc.code == 403 and message.startswith("refused"):
            raise ReadOnlyViolation(message) from None
        if exc.code == 403:
            raise AccessDenied(message) from None
        if exc.code == 400 and path in ("/cursor", "/keys"):
            raise CursorError(message) from None
        if exc.code == 409:
            raise WriteRefused(message) from None
        if exc.code in (429, 503):
            raise ReaderUnavailable(f"the read endpoint {self.url} is busy ({message})") from None
        if 300 <= exc.code < 400:
            raise AccessDenied(f"{self.url} answered a redirect ({exc.code}), which a reader does not follow") from None
        raise QueryError(message) from None

    def stream_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None) -> Iterator[pa.RecordBatch]:
        """The result's batches as they arrive. Raises QueryError when the answer ends before the Arrow
        stream's end marker (the query failed on the way, or the connection was cut): never a shorter
        result taken for the whole."""
        with self._post("/query", {"sql": sql, "parameters": dict(parameters or {})}) as resp:
            body = _Tail(resp)
            try:
                reader = pa.ipc.open_stream(body)
            except pa.ArrowInvalid:
                if body.seen:
                    raise QueryError(f"the read endpoint's answer is not an Arrow stream ({body.seen} bytes)") from None
                return  # empty body: a result without rows or schema
            try:
                yield from reader
            except (OSError, http.client.HTTPException) as exc:
                raise QueryError(f"the read endpoint's answer was cut off: {exc}") from None
            body.require_end()

    def query_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        """The whole result; raises QueryError as :meth:`stream_arrow` does."""
        with self._post("/query", {"sql": sql, "parameters": dict(parameters or {})}) as resp:
            body = _Tail(resp)
            try:
                table = pa.ipc.open_stream(body).read_all()
            except (OSError, http.client.HTTPException) as exc:
                raise QueryError(f"the read endpoint's answer was cut off: {exc}") from None
            body.require_end()
            return table

    def advance_cursor(self, trainer: str, cursor: int, rows: int, filters: str) -> None:
        with self._post("/cursor", {"trainer": trainer, "cursor": cursor, "rows": rows, "filters": filters}):
            pass

    def manage_keys(self, body: Mapping[str, Any]) -> Any:
        """One ingestion-key operation (``/keys``, the owner's token only): create, revoke or list."""
        with self._post("/keys", body) as resp:
            return json.loads(resp.read(_MAX_ANSWER))

    def manage_checkpoints(self, body: Mapping[str, Any]) -> Any:
        """One checkpoint-registry operation (``/checkpoints``, the owner's token only): register."""
        with self._post("/checkpoints", body) as resp:
            return json.loads(resp.read(_MAX_ANSWER))

    def close(self) -> None:
        return None


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    """Seconds the endpoint asks to wait before a retry (its ``Retry-After``), or None when it names none."""
    value = exc.headers.get("Retry-After", "") if exc.headers is not None else ""
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.5, seconds) if math.isfinite(seconds) else None  # (never a loop of requests without a pause)


_ARROW_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The end-of-stream marker an Arrow IPC stream closes with (continuation marker, then a zero length)."""


class _Tail:
    """A response read through, keeping its last eight bytes: :meth:`require_end` raises QueryError unless
    they are the Arrow stream's end marker (a body that stopped short, however cleanly, lacks it)."""

    def __init__(self, resp: IO[bytes]) -> None:
        self._resp, self.tail, self.seen, self.closed = resp, b"", 0, False

    def read(self, n: int = -1) -> bytes:
        data = self._resp.read(n)
        self.seen += len(data)
        self.tail = data[-8:] if len(data) >= 8 else (self.tail + data)[-8:]
        return data

    def require_end(self) -> None:
        if self.tail != _ARROW_END:
            raise QueryError("the read endpoint's answer ended before the end of its result: the query failed "
                             "after its answer began, or the connection was cut (see the endpoint's log)")


def _cut(conn: http.client.HTTPConnection) -> None:
    """End ``conn``'s exchange from another thread: a read blocked on its socket returns at once."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # (closed meanwhile)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects end the request (an ``HTTPError`` of the 3xx): one followed would carry the token along."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
