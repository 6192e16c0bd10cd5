"""The remote reader against servers that are not the read endpoint: what it never waits for."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from rewardflow.clickhouse.errors import ReaderUnavailable
from rewardflow.clickhouse.remote import RemoteReader

TOKEN = "rfr_0123456789ab_" + "x" * 32


def _trickler(listener: socket.socket, requests: list[bytes], stop: threading.Event) -> None:
    """Take each connection's request, then answer one byte of a status line every 0.2 s, forever."""
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            requests.append(conn.recv(65536))
            for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" * 100:
                if stop.is_set():
                    break
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    break  # the reader cut the connection
                time.sleep(0.2)


def test_a_server_that_trickles_its_hello_answer_is_cut_off_and_never_shown_the_token() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []
    stop = threading.Event()
    server = threading.Thread(target=_trickler, args=(listener, requests, stop), daemon=True)
    server.start()
    try:
        reader = RemoteReader(f"http://127.0.0.1:{listener.getsockname()[1]}", token=TOKEN, timeout=60,
                              hello_timeout_s=1.0)
        started = time.monotonic()
        with pytest.raises(ReaderUnavailable, match="the token was not sent"):
            reader.query_arrow("SELECT 1")
        assert time.monotonic() - started < 5  # each byte comes within the 60 s socket timeout
    finally:
        stop.set()
        server.join(5)
        listener.close()
    assert len(requests) == 1 and requests[0].startswith(b"POST /hello ") and TOKEN.encode() not in requests[0]
