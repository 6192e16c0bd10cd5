"""Sending a simulated stream through the ingestion edge, as agent runners and editor relays do: HTTP
requests of one org's events (what queued for a client since its last request, up to 500 events,
several sessions), each org with its own key, retried on 503/429 with the same event ids, and sent
again on a fresh connection when the kept-alive one turns out closed (the edge closes a connection
idle for 5 s; a request that did reach it is then a redelivery, which the worker excludes as a
duplicate, never counts twice).

The planted malformed records are sent as a broken client would: a body that is not JSON (400),
or an event the contract refuses (202 with the event listed as rejected). Both count as refused at
the edge; nothing of them reaches Kafka.

Each org sends from a client of its own (a thread with one keep-alive connection), as each org's
editors and relays would: requests of different orgs are in flight together, and a session, whose
org is fixed, keeps its order. Before a planted late event, and every
``sync_ms`` of simulated time, every thread drains (as the SDK's flush does).

Blocking: returns once every request is answered; shows a progress bar on ``console``.
"""

from __future__ import annotations

import http.client
import queue
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rewardflow.events.validate import to_dict
from rewardflow.sim.generator import SendGroup, Simulator


MAX_GROUPS = 256  # queued send groups one client takes at once
MAX_EVENTS = 500  # events in one request (the edge's default limit)
MAX_RECONNECTS = 3  # fresh connections one request may take before the send fails


@dataclass
class EdgeStats:
    accepted: int = 0  # events answered 202 and not rejected
    refused: int = 0  # planted malformed records the edge refused (a 400 body or a rejected event)
    unexpected: int = 0  # valid events the edge refused (should stay 0)
    retries: int = 0  # requests answered 503 or 429 and sent again
    reconnects: int = 0  # requests sent again on a fresh connection (the kept-alive one was closed)
    last_ts: int = 0  # the latest event time sent


class _Connection(http.client.HTTPConnection):
    """A keep-alive connection with TCP_NODELAY (http.client writes headers and body separately)."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Client(threading.Thread):
    def __init__(self, url: str, stats: EdgeStats, lock: threading.Lock) -> None:
        super().__init__(daemon=True, name="sim-edge-client")
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.inbox: queue.Queue[tuple[str, SendGroup] | None] = queue.Queue(maxsize=256)
        self.stats, self.lock = stats, lock
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = _Connection(self.host, self.port, timeout=60)
        done = False
        while not done:
            items = [self.inbox.get()]
            while items[-1] is not None and len(items) < MAX_GROUPS:  # what queued meanwhile goes along
                try:
                    items.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            done = items[-1] is None
            groups = [i for i in items if i is not None]
            try:
                if self.error is None:
                    for key, batch in _requests(groups):
                        self._send(conn, key, batch)
            except BaseException as exc:  # noqa: BLE001 - reported by the sender after the drain
                self.error = exc
            finally:
                for _ in items:
                    self.inbox.task_done()
        conn.close()

    def _send(self, conn: http.client.HTTPConnection, key: str, batch: list[SendGroup]) -> None:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        malformed = batch[0].raw is not None
        reconnects = 0
        while True:  # sent_at is the client's clock at each attempt, as a real client sets it
            try:
                conn.request("POST", "/v1/events", body=_body(batch), headers=headers)
                resp = conn.getresponse()
                doc = orjson.loads(resp.read() or b"{}")
            except (ConnectionError, http.client.HTTPException):
                conn.close()  # the next request opens a new connection
                reconnects += 1
                if reconnects > MAX_RECONNECTS:
                    raise
                with self.lock:
                    self.stats.reconnects += 1
                continue
            if resp.status in (429, 503):
                with self.lock:
                    self.stats.retries += 1
                time.sleep(float(resp.getheader("Retry-After") or 1))
                continue
            with self.lock:
                rejected = len(doc.get("rejected", [])) if resp.status == 202 else None
                if malformed:
                    self.stats.refused += 1 if rejected is None or rejected else 0
                    self.stats.unexpected += 1 if rejected == 0 else 0
                elif resp.status != 202 or rejected:
                    raise RuntimeError(f"the edge refused valid events ({resp.status}): {doc}")
                else:
                    self.stats.accepted += int(doc["accepted"])
            return


def _requests(items: list[tuple[str, SendGroup]]) -> list[tuple[str, list[SendGroup]]]:
    """The requests for queued groups, in order: valid groups of one key together (up to MAX_EVENTS
    events; a session stays in one thread, so its order holds), each malformed record alone."""
    out: list[tuple[str, list[SendGroup]]] = []
    open_by_key: dict[str, list[SendGroup]] = {}
    for key, g in items:
        if g.raw is not None:
            out.append((key, [g]))
            continue
        batch = open_by_key.get(key)
        if batch is None or sum(len(b.events) for b in batch) + len(g.events) > MAX_EVENTS:
            batch = open_by_key[key] = []
            out.append((key, batch))
        batch.append(g)
    return out


def _body(batch: list[SendGroup]) -> bytes:
    sent_at = b'{"sent_at":%d,"events":[' % int(time.time() * 1000)
    if batch[0].raw is not None:
        return sent_at + batch[0].raw + b"]}"  # a broken client's event, as it wrote it
    return sent_at + b",".join(orjson.dumps(to_dict(e)) for g in batch for e in g.events) + b"]}"


def send_through_edge(sim: Simulator, url: str, keys: dict[str, str], console: Console, *,
                      sync_ms: int = 20_000) -> EdgeStats:
    """Send the whole stream through the edge at ``url``; ``keys`` maps each org to its key (and client)."""
    cfg, stats, lock = sim.config, EdgeStats(), threading.Lock()
    clients = {org: _Client(url, stats, lock) for org in keys}
    workers = list(clients.values())
    for w in workers:
        w.start()

    def drain() -> None:
        for w in workers:
            w.inbox.join()
        failed = next((w.error for w in workers if w.error is not None), None)
        if failed is not None:
            raise RuntimeError(f"sending through the edge failed: {failed}") from failed

    est_end = cfg.end_of_starts_ms + cfg.turns_per_session * 90_000 + cfg.settle_ms
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[sent]:>9,} events"),
               TimeElapsedColumn())
    last_sync = cfg.start_ms
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("sending through the edge", total=est_end - cfg.start_ms, sent=0)
            for g in sim.stream():
                if g.late or g.due_ms - last_sync >= sync_ms:
                    drain()
                    last_sync = g.due_ms
                stats.last_ts = max(stats.last_ts, g.due_ms, *(e.ts for e in g.events))
                org = _org_of(g)
                clients[org].inbox.put((keys[org], g))
                progress.update(task, completed=g.due_ms - cfg.start_ms, sent=sim.events_sent)
            drain()
            progress.update(task, completed=est_end - cfg.start_ms)
    finally:
        for w in workers:
            w.inbox.put(None)
        for w in workers:
            w.join(timeout=60)
    return stats


def _org_of(g: SendGroup) -> str:
    if g.raw is not None:
        try:
            doc: Any = orjson.loads(g.raw)
            return str(doc.get("org_id", "org-sim"))
        except orjson.JSONDecodeError:
            return "org-sim"
    return g.events[0].org_id
