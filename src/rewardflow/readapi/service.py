"""What the read endpoint's routes share: the engine's readers, the token store, the signed requests'
nonces and the query slots.

Contract: thread-safe. :meth:`ReadService.take_slot` never blocks; every slot it gives is given back
once by :meth:`ReadService.give_slot` (the query's thread does, whatever ends it). :meth:`ReadService.borrow`
may open a connection to the engine.
"""

from __future__ import annotations

import threading

from fastapi.responses import PlainTextResponse, Response

from rewardflow.clickhouse.connect import local_reader
from rewardflow.clickhouse.ddl import quote_ident
from rewardflow.clickhouse.dsn import Dsn
from rewardflow.clickhouse.readers import LocalReader
from rewardflow.readapi.noncelog import NONCES_FILE, NonceLog
from rewardflow.readapi.signing import Nonces
from rewardflow.readapi.tokens import TokenStore
from rewardflow.settings import Settings

ENGINE_DATABASES = frozenset({"system", "information_schema"})
"""Databases a read request may not name as its current one (compared case-insensitively)."""


class ReadService:
    """What the routes share: the engine's readers (a pool per database), the token store, the query slots."""

    def __init__(self, dsn: Dsn, settings: Settings) -> None:
        self.dsn, self.settings = dsn, settings
        self.tokens = TokenStore(settings.home)
        self.nonces = Nonces(log=NonceLog(settings.home / NONCES_FILE))  # (each signed request is taken once)
        self._pools: dict[str | None, list[LocalReader]] = {}
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}  # token id -> its queries running now (absent: none)

    def take_slot(self, token_id: str) -> Response | None:
        """A query slot for a query of ``token_id``, or the response refusing it: 503 when every slot is
        taken, 429 when the token's own share is. Never blocks. A slot taken is given back by :meth:`give_slot`."""
        cap, share = self.settings.read_max_queries, self.settings.read_max_queries_per_token
        with self._lock:
            held = self._running.get(token_id, 0)
            if sum(self._running.values()) >= cap:
                return PlainTextResponse(f"{cap} queries are running; retry", 503, headers={"Retry-After": "1"})
            if held >= share:
                return PlainTextResponse(f"this token runs {held} queries, its share "
                                         "(REWARDFLOW_READ_MAX_QUERIES_PER_TOKEN); retry", 429, headers={"Retry-After": "1"})
            self._running[token_id] = held + 1
        return None

    def give_slot(self, token_id: str) -> None:
        with self._lock:
            left = self._running.get(token_id, 0) - 1
            if left > 0:
                self._running[token_id] = left
            else:
                self._running.pop(token_id, None)

    def borrow(self, database: str | None) -> LocalReader:
        """A reader of ``database`` no other request uses now (blocking: may open a connection).

        Raises ``ValueError`` for anything but a plain name, and for the engine's own databases: with
        ``system`` as the current database, a table function such as ``merge`` that reads the current
        database would reach the tables the SQL guard refuses by name (other readers' statements)."""
        if database is not None:
            quote_ident(database)  # refuse anything but a plain name
            if database.lower() in ENGINE_DATABASES:
                raise ValueError(f"database {database!r} is the engine's own: read its tables by their qualified "
                                 "names (system.parts) from a rewardflow database")
        with self._lock:
            pool = self._pools.setdefault(database, [])
            if pool:
                return pool.pop()
        return local_reader(self.dsn.with_database(database), self.settings)

    def give_back(self, database: str | None, reader: LocalReader) -> None:
        with self._lock:
            self._pools.setdefault(database, []).append(reader)

    def close(self) -> None:
        with self._lock:
            for pool in self._pools.values():
                for reader in pool:
                    reader.close()
            self._pools.clear()
