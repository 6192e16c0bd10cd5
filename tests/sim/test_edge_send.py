"""The simulator's edge client keeps sending when the edge closes a kept-alive connection.

The server here is a plain HTTP/1.1 server on a real socket that answers as the edge does (202 and
the count accepted) and then drops the connection without saying so, as the edge does to a
connection idle past its keep-alive timeout. Every request after the first therefore meets a
closed connection.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import orjson
import pytest

from rewardflow.events.validate import validate_event
from rewardflow.sim.edge_send import MAX_RECONNECTS, EdgeStats, _Client
from rewardflow.sim.generator import SendGroup
from tests.factories import ev


class _DropsAfterEachAnswer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client keeps the connection for its next request
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append(body)
        answer = orjson.dumps({"accepted": len(orjson.loads(body)["events"]), "rejected": []})
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        self.wfile.flush()
        self.close_connection = True  # gone, without a "Connection: close" header

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture()
def edge() -> Iterator[tuple[str, list[bytes]]]:
    bodies: list[bytes] = []
    handler = type("Handler", (_DropsAfterEachAnswer,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


def _group(i: int) -> SendGroup:
    event = validate_event(ev("ToolCall", request_id=f"r{i}", session_id=f"s{i}", event_id=f"e{i}"))
    return SendGroup(due_ms=i, send_at_s=0.0, session_id=f"s{i}", events=(event,))


def _send(url: str, n: int) -> tuple[_Client, EdgeStats]:
    stats = EdgeStats()
    client = _Client(url, stats, threading.Lock())
    client.start()
    for i in range(n):
        client.inbox.put(("key", _group(i)))
        client.inbox.join()  # one request each: every request after the first reuses the connection
    client.inbox.put(None)
    client.join(timeout=30)
    return client, stats


def test_a_connection_the_edge_closed_is_replaced_and_every_event_is_sent_once(edge: tuple[str, list[bytes]]) -> None:
    url, bodies = edge
    client, stats = _send(url, 5)
    assert client.error is None
    assert stats.accepted == 5
    assert stats.reconnects >= 1  # the closed connection was met, and replaced
    sent = [e["event_id"] for b in bodies for e in orjson.loads(b)["events"]]
    assert sent == [f"e{i}" for i in range(5)]  # in order; none lost, none twice (each request reached it once)


def test_an_edge_that_cannot_be_reached_fails_the_send_after_a_few_connections() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DropsAfterEachAnswer)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    server.server_close()  # nothing listens there any more
    client, stats = _send(url, 1)
    assert isinstance(client.error, ConnectionError)
    assert stats.accepted == 0 and stats.reconnects == MAX_RECONNECTS
